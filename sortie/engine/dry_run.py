"""`sortie run --dry-run`: what a run would do, after every check a run makes before it starts
(the flags, the task, the workdir and its cap, the secrets, the budget, the place's own answer:
a stack's profile, a Slurm site's `sbatch --test-only`), with nothing started. A researcher
about to hold eight GPU machines sees which files go, what setup runs, the torchrun job and
where its results land, first."""

from __future__ import annotations

from dataclasses import dataclass

from sortie.core.sizes import counted
from sortie.cost.money import usd
from sortie.engine.job_ready import advice
from sortie.engine.launch import refuse_used_run_dir
from sortie.engine.request import RunRequest
from sortie.stacks.backend import Backend

LISTED = {"note": "notes", "warning": "warnings"}  # lines there may be several of


@dataclass(frozen=True)
class DryRun:
    """What a run would do, as (what, how) lines in the order a run does them."""

    lines: tuple[tuple[str, str], ...]

    def as_dict(self) -> dict[str, object]:
        """One key a line, but the notes and warnings: a list each (empty when none)."""
        return {"dry_run": True, "started": False,
                **{what: how for what, how in self.lines if what not in LISTED},
                **{many: [how for what, how in self.lines if what == one]
                   for one, many in LISTED.items()}}


def _first(backend: Backend) -> list[str]:
    """Where a launch tries first, where it has a choice (a cloud's zone, --gpu's region)."""
    placements = backend.placements()
    said = placements[0].describe() if placements else "default placement"
    if said == "default placement":
        return []
    return [f"first {said} (then {len(placements) - 1} more)" if len(placements) > 1 else said]


def dry_run(request: RunRequest, backend: Backend, notes: tuple[str | None, ...] = (),
            held: str | None = None, queue: bool = True) -> DryRun:
    """The run ``request`` would make on ``backend`` (planned: nothing started), on a new
    cluster or on the ``held`` one (`exec`, `run --on`; ``queue``: whether it would wait for
    a job running there); ``notes``: what the run would say first (which code a re-run of a
    kept task runs, the task's fields a held cluster ignores)."""
    if request.run_id:  # a run's directory is its own (a new id always is)
        refuse_used_run_dir(request.runs_dir / request.run_id)
    user = request.user_job
    if held:
        place = f"{backend.name} cluster {held}"
    else:
        place = ", ".join([backend.name, *([f"profile {backend.profile}"] if backend.profile
                                           else []),
                           *([backend.instance_type] if backend.instance_type else []),
                           *_first(backend)])
    procs = request.procs_per_node
    lines = [("where", f"{counted(request.nodes, 'node')} x {procs} "
                       f"process{'' if procs == 1 else 'es'} ({place})"),
             *(("note", note) for note in notes if note)]
    if user is None:
        args = " ".join(request.trainer_args)
        lines.append(("job", f"the bundled trainer under torchrun: {request.steps} steps, a "
                             f"checkpoint every {request.ckpt_every}" +
                             (f"; its flags: {args}" if args else "")))
        env = request.trainer_env
    else:
        command = user.command
        lines.append(("job", f"{command.describe(most=500)} "
                             f"{'under torchrun ' if command.script else ''}on every node"))
        if user.files is not None:
            lines.append(("workdir", f"{user.files.root}: {user.files.describe()}"))
        if command.setup:
            lines.append(("setup", f"{command.setup} (on every node first; " + (
                "run again: --rerun-setup)" if user.rerun_setup else
                "cached on each node until it, its inputs or env change)")))
        env = command.env
        if command.secret_names:
            lines.append(("secrets", f"{', '.join(command.secret_names)} (read from your "
                                     "shell, never recorded)"))
    if env:
        lines.append(("env", ", ".join(f"{name}={value}" for name, value in env.items())))
    if request.image:
        lines.append(("image", f"{request.image} (pulled on every node, recorded by digest)"))
    if user is not None:
        if user.artifacts:
            lines.append(("artifacts", ", ".join(user.artifacts)))
        # what a run would warn of once synced, said now
        lines += [("warning", note) for note in advice(user, request.nodes, request.image)]
    limits = request.limits
    if held:
        lines.append(("queue", f"runs when {held} is free: a job running there is waited for, "
                               "first come, first served" if queue else
                      f"refused if a job runs on {held} (--no-queue)"))
    else:
        lines.append(("recovery", f"a lost node replaced and the job relaunched, up to "
                                  f"{counted(limits.max_recoveries, 'time')}"
                      if limits.max_recoveries else "none (--max-recoveries 0)"))
    if limits.max_cost_usd is not None:
        lines.append(("budget", f"{usd(limits.max_cost_usd)} at most (--max-cost)"))
    end = f"{held} left running" if held else "then the cluster is torn down"
    lines.append(("results", f"{request.runs_dir / (request.run_id or '<run id>')}/, "
                             f"verified; {end}"))
    return DryRun(tuple(lines))
