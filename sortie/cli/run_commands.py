"""The commands that run jobs: `run` (a whole sortie), `up` (hold a cluster), `exec` (a job on a
held or attached cluster) and `watch` (take a sortie over from a controller that is gone)."""

from __future__ import annotations

import sys
from dataclasses import replace
from pathlib import Path

import click
from rich.console import Console

from sortie.bootstrap.choices import HealthLevel
from sortie.cli import options, render
from sortie.cli.options import Duration
from sortie.cli.reporter import RichReporter
from sortie.core import naming
from sortie.core.errors import SortieError, UsageError
from sortie.core.home import sortie_home
from sortie.core.inventory import Inventory
from sortie.engine.held_cluster import (
    exec_job,
    for_held_cluster,
    held_limits,
    held_pricing,
    hold_cluster,
)
from sortie.engine.job_files import repeated_run, reproduce
from sortie.engine.request import Limits, RunRequest, new_run_id
from sortie.engine.task import (
    default_procs,
    image_fields,
    job_for,
    own_dirs,
    task_with_flags,
    trainer_environment,
)
from sortie.engine.watch import watch_sortie
from sortie.fleet import registry
from sortie.fleet.launch_ask import LaunchAsk
from sortie.rundir.result import RunResult
from sortie.stacks.backend import Backend

MAX_STEPS = 10**9  # the bundled trainer's: more is a typo, not a run that would ever end


@click.command(cls=options.PassthroughCommand)
@options.job
@options.launch
@click.option("--procs-per-node", "-p", type=click.IntRange(1, 64), default=None,
              help="Processes per node. Default: one per GPU; without GPUs 1 for your job, "
                   "2 for the bundled trainer.")
@click.option("--steps", type=click.IntRange(1, MAX_STEPS), default=60, show_default=True,
              help="Training steps (the bundled trainer).")
@options.runs_dir
@click.option("--ckpt-every", type=click.IntRange(1, MAX_STEPS), default=20, show_default=True,
              help="Steps between checkpoints (the bundled trainer): the most a lost node can "
                   "cost.")
@options.max_recoveries
@options.max_artifacts
@options.collect_new
@options.health
@options.hang_timeout
@options.max_cost
@click.option("--on", "on_cluster", metavar="NAME",
              help="Run on cluster NAME (held with `sortie up`, or attached with `sortie "
                   "attach`) and leave it running: no up, no down, no node replaced.")
@click.option("--detach", is_flag=True, help="With --slurm: hand the whole run to its "
              "allocation (its controller runs inside it once Slurm starts it) and return at "
              "once: the shell may end. `sortie status` and `sortie logs ID` follow it; its "
              "results land in RUNS_DIR/<id>/ as usual.")
@options.dry_run
@options.as_json
def run(job: options.JobFlags, launch: LaunchAsk, procs_per_node: int | None, steps: int,
        runs_dir: Path, ckpt_every: int, max_recoveries: int, max_artifact_bytes: int,
        collect_new_bytes: int, health: HealthLevel, hang_timeout_s: float, max_cost: float | None,
        on_cluster: str | None, detach: bool, dry_run: bool, as_json: bool) -> None:
    """Run a whole sortie: up -> bootstrap -> [sync, setup] -> train -> collect -> down.

    What runs: your script (`--workdir DIR --script train.py -- ARGS`: sortie writes the
    torchrun line), a task file (TASK.yaml: workdir, setup, script or run, env, secrets,
    artifacts; flags override it), or, with neither, the bundled trainer (arguments after `--`
    go to it). Every node is told its place in SORTIE_* variables (docs/your-job.md).

    Where: local nodes; a stack profile's cloud (--stack); with --gpu A100:8, the cheapest
    catalog machine of any cloud and region, then the next ones; or an allocation on a Slurm
    cluster (--slurm NAME --partition P). Launch is all or nothing
    (fallbackZones, other places for --gpu, then on-demand, are tried in turn). A node lost
    mid-run (machine gone, SSH dead, preempted) is replaced and the job relaunched, up to
    --max-recoveries times. Teardown always runs: after success, failure, Ctrl-C or SIGTERM, and
    ends with proof that nothing remains. Artifacts (metrics, checkpoints, per-node logs, your
    --artifact files) land in RUNS_DIR/<id>/, verified.
    """
    # Planning a new cluster loads every backend it may choose; `exec` loads only its own.
    from sortie.engine.launch import free_run_id, run_sortie
    from sortie.engine.launch_plan import plan_launch

    passthrough: tuple[str, ...] = click.get_current_context().meta["passthrough"]
    task = task_with_flags(job.task_file, name=launch.name, nodes=launch.nodes,
                           procs_per_node=procs_per_node, workdir=job.workdir,
                           script=job.script, run=job.run, setup=job.setup, env=dict(job.env),
                           artifacts=job.artifacts, image=job.image, stack=launch.stack,
                           overrides=launch.overrides, max_cost=max_cost)
    task, code_note = reproduce(job.task_file, task, job.workdir is not None, own_dirs(runs_dir))
    if launch.name is None and task.name:  # a task file's name: a new run id when it has run before
        task = task.model_copy(update={"name": free_run_id(runs_dir, task.name)})
    user_job = job_for(task, passthrough, job.rerun_setup, job.max_sync_bytes,
                       own=own_dirs(runs_dir))
    trainer_env = {} if user_job else trainer_environment(task)
    limits = Limits(max_recoveries=max_recoveries, max_artifact_bytes=max_artifact_bytes,
                    health=health, hang_timeout_s=hang_timeout_s, max_cost_usd=task.max_cost,
                    collect_new_bytes=collect_new_bytes)
    if detach and launch.slurm is None:
        raise UsageError("--detach: hands the run to a Slurm allocation (its controller runs in "
                         "it): add --slurm NAME")
    if on_cluster is not None:
        if task.stack or task.overrides or task.nodes or launch.gpu or launch.slurm:
            raise UsageError(f"--on {on_cluster}: runs on that cluster as it is; --stack, "
                             "--gpu, --slurm, --set and --nodes do not apply")
        request = RunRequest(steps=steps, trainer_args=() if user_job else passthrough,
                             trainer_env=trainer_env,
                             run_id=task.name, runs_dir=runs_dir, ckpt_every=ckpt_every,
                             user_job=user_job, limits=limits,
                             repeats=repeated_run(job.task_file), **image_fields(task))
        _run_on(on_cluster, request, task.procs_per_node, as_json, notes=(code_note,),
                dry_run=dry_run)
        return
    gpus_per_node = launch.slurm.ask.gpus_per_node if launch.slurm else 0
    procs = task.procs_per_node or default_procs(gpus_per_node, user_job is not None)
    slurm = launch.slurm and replace(launch.slurm, ranks_per_node=procs)  # its CPUs' default
    plan = plan_launch(sortie_home(), replace(launch, stack=task.stack, overrides=task.overrides,
                                              name=task.name, nodes=task.nodes, slurm=slurm),
                       task.max_cost)
    progress, out = render.consoles(as_json)
    render.launch_cost(progress, plan.cost, plan.notes, plan.pricing)
    request = RunRequest(nodes=plan.nodes,
                         procs_per_node=task.procs_per_node or
                         default_procs(plan.target.gpus_per_node, user_job is not None),
                         steps=steps, trainer_args=() if user_job else passthrough,
                         trainer_env=trainer_env,
                         run_id=task.name, runs_dir=runs_dir, ckpt_every=ckpt_every,
                         user_job=user_job, limits=limits, pricing=plan.pricing,
                         repeats=repeated_run(job.task_file), **image_fields(task))
    if dry_run:
        from sortie.engine.dry_run import dry_run as planned_run

        render.dry_run(out, planned_run(request, plan.backend, (code_note,)), as_json)
        return
    if detach:
        from sortie.engine.detach import submit_detached

        submitted = submit_detached(plan.backend, plan.nodes, task.name or new_run_id(),
                                    runs_dir, sys.argv[1:])
        render.detached_run(out, submitted, as_json)
        return
    reporter = RichReporter(progress)
    if code_note:
        reporter.note(code_note)
    result = run_sortie(request, reporter, plan.backend)
    _finish_run(result, out, as_json)


@click.command(name="exec", cls=options.PassthroughCommand)
@click.argument("name")
@options.job
@click.option("--procs-per-node", "-p", type=click.IntRange(1, 64), default=None,
              help="Processes per node. Default: one per GPU, 1 without GPUs.")
@options.runs_dir
@options.max_artifacts
@options.collect_new
@options.health
@options.hang_timeout
@options.max_cost_exec
@click.option("--name", "run_name", metavar="RUN",
              help="This run's id (lowercase letters, digits, dashes). Default: a timestamp.")
@click.option("--detach", "-d", is_flag=True,
              help="Return once the job started or is queued, saying how to follow it "
                   "(`sortie logs NAME -f`, `sortie jobs NAME`, `sortie cancel NAME RUN`); its "
                   "controller goes on in the background.")
@click.option("--no-queue", is_flag=True,
              help="Refuse (exit 2) when another job runs on the cluster, rather than waiting "
                   "for it in the cluster's queue.")
@options.dry_run
@options.as_json
def exec_(name: str, job: options.JobFlags, procs_per_node: int | None, runs_dir: Path,
          max_artifact_bytes: int, collect_new_bytes: int,
          health: HealthLevel, hang_timeout_s: float, max_cost: float | None,
          run_name: str | None, detach: bool, no_queue: bool, dry_run: bool,
          as_json: bool) -> None:
    """Run your job on cluster NAME (held with `sortie up`, local or --stack, or attached with
    `sortie attach`) and leave the cluster running.

    The same job flags as `run` (TASK.yaml, --workdir, --script, -- ARGS, ...). A task file
    `sortie run` takes works here too: its name, stack and set (which make a new cluster) are
    ignored, and said to be; its nodes must be the cluster's. A second `exec` sends only what
    changed and skips a setup whose inputs did not change. Artifacts land in RUNS_DIR/<run
    id>/; `sortie down NAME` ends the cluster.

    One job runs at a time: an exec on a busy cluster waits in its queue (first come, first
    served, whichever controller sent it) and says its place; `sortie jobs NAME` lists the
    running, queued and ended jobs, `sortie cancel NAME [RUN]` ends one and leaves the
    cluster up. A queued or running job keeps the cluster from idling (--idle-stop).
    """
    passthrough: tuple[str, ...] = click.get_current_context().meta["passthrough"]
    if run_name is not None:
        naming.check_name(run_name, "--name")
    task = task_with_flags(job.task_file, procs_per_node=procs_per_node, workdir=job.workdir,
                           script=job.script, run=job.run, setup=job.setup,
                           env=dict(job.env), artifacts=job.artifacts, image=job.image,
                           max_cost=max_cost)
    task, code_note = reproduce(job.task_file, task, job.workdir is not None, own_dirs(runs_dir))
    backend, inventory = registry.held_cluster(sortie_home(), name)
    task, ignored = for_held_cluster(task, len(inventory.nodes), name)
    user_job = job_for(task, passthrough, job.rerun_setup, job.max_sync_bytes,
                       own=own_dirs(runs_dir))
    if user_job is None:
        raise UsageError("exec: give --script, --run or a task with `script` or `run`")
    request = RunRequest(runs_dir=runs_dir, user_job=user_job, run_id=run_name,
                         repeats=repeated_run(job.task_file), **image_fields(task),
                         limits=Limits(max_artifact_bytes=max_artifact_bytes, health=health,
                                       hang_timeout_s=hang_timeout_s,
                                       max_cost_usd=task.max_cost,
                                       collect_new_bytes=collect_new_bytes))
    if detach and not dry_run:  # (its input checked first: a bad one is exit 2 now, not in a log)
        _detach(name, run_name or new_run_id(), as_json)
        return
    quoted = [f"`{field}`" for field in ignored]
    fields = " and ".join([", ".join(quoted[:-1]), quoted[-1]] if len(quoted) > 1 else quoted)
    note = (f"the task's {fields} {'makes' if len(ignored) == 1 else 'make'} a new cluster: "
            f"ignored on {name}" if ignored else None)
    _run_on(name, request, task.procs_per_node, as_json, (backend, inventory),
            (note, code_note), queue=not no_queue, dry_run=dry_run)


def _detach(name: str, run_id: str, as_json: bool) -> None:
    """`exec --detach`: the same exec, named ``run_id``, in the background; back once its job
    started or is queued, saying how to follow it."""
    from sortie.engine import held_jobs

    home = sortie_home()
    backend, _ = registry.held_cluster(home, name)  # a NAME that is no held cluster: exit 2 now
    given = click.get_current_context().meta.get("argv", sys.argv[1:])
    at = given.index("--") if "--" in given else len(given)  # (after it: the job's own words)
    words = [word for word in given[:at] if word not in ("--detach", "-d")]
    child, log = held_jobs.start_detached(home, [*words, "--name", run_id, *given[at:]], run_id)
    with render.consoles(as_json)[0].status(f"starting {run_id} on {name} in the background"):
        state = held_jobs.wait_started(home, backend.state_dir(name), run_id, child)
    if as_json:
        render.print_json(render.console(), {"run_id": run_id, "cluster": name,
                                             "state": state, "output": str(log)})
    else:
        click.echo(f"{run_id}: {state} on {name}, detached (its controller's output: {log}); "
                   f"`sortie logs {run_id} -f` follows it, `sortie jobs {name}` lists the "
                   f"queue, `sortie cancel {name} {run_id}` stops it")
    if state not in ("running", "queued", "succeeded"):
        raise SortieError(f"{run_id} {state}: its output is in {log}")


def _run_on(name: str, request: RunRequest, procs_per_node: int | None, as_json: bool,
            held: tuple[Backend, Inventory] | None = None,
            notes: tuple[str | None, ...] = (), queue: bool = True,
            dry_run: bool = False) -> None:
    """`exec NAME`, `run --on NAME`: one job on a held or attached cluster, left running
    (``dry_run``: what it would do, said)."""
    backend, inventory = held or registry.held_cluster(sortie_home(), name)
    procs = procs_per_node or default_procs(min(node.gpus for node in inventory.nodes),
                                            request.user_job is not None)
    progress, out = render.consoles(as_json)
    if dry_run:
        from sortie.engine.dry_run import dry_run as planned_run

        request = replace(request, nodes=len(inventory.nodes), procs_per_node=procs)
        render.dry_run(out, planned_run(request, backend, notes, held=name, queue=queue),
                       as_json)
        return
    reporter = RichReporter(progress)
    for note in notes:
        if note:
            reporter.note(note)
    request = replace(request, procs_per_node=procs,
                      pricing=held_pricing(backend, name, len(inventory.nodes),
                                           request.limits.max_cost_usd))
    result = exec_job(backend, name, inventory, request, reporter, queue)
    _finish_run(result, out, as_json)


def _finish_run(result: RunResult, out: Console, as_json: bool) -> None:
    if as_json:
        render.print_json(out, result)
    else:
        render.run_summary(out, result)
    failure = result.failure()
    if failure:
        raise SortieError(failure)


@click.command()
@options.launch
@click.option("--idle-stop", "idle_stop_s", type=Duration(min_s=1), default=None,
              metavar="DURATION", help="End the cluster once nothing has run on it this long "
              "(30m, 2h), with no controller: local nodes tear themselves down with proof; a "
              "cloud cluster's nodes each power themselves off (at least 5m) and `sortie reap` "
              "destroys the rest.")
@options.max_cost_held
@options.as_json
def up(launch: LaunchAsk, idle_stop_s: float | None, max_cost: float | None,
       as_json: bool) -> None:
    """Start a cluster and leave it running: local nodes, a cloud cluster from a stack profile
    (--stack PROFILE), the cheapest place for --gpu A100:8, or an allocation on a Slurm cluster
    (--slurm NAME, held until `down` or its --time). Then `sortie exec NAME` runs your jobs on
    it and `sortie down NAME` ends it.

    A cloud cluster is launched like `sortie run`'s: its estimated cost is shown first, launch
    is all or nothing (the profile's fallbackZones, then on-demand), every node is checked
    over SSH with its pinned host key, and its TTL is armed on every node: past it the nodes
    shut themselves down and `sortie reap` destroys the rest. If the start fails or is
    interrupted, the cluster is destroyed with proof."""
    from sortie.engine.launch_plan import plan_launch

    if launch.slurm is not None and idle_stop_s is not None:
        raise UsageError("--idle-stop: a Slurm allocation ends at its --time, or with `sortie "
                         "down`")
    plan = plan_launch(sortie_home(), launch, max_cost, held=True)
    progress, out = render.consoles(as_json)
    render.launch_cost(progress, plan.cost, plan.notes, plan.pricing)
    backend = plan.backend
    inventory = hold_cluster(backend, plan.nodes, launch.name, RichReporter(progress),
                             watch=held_limits(backend, idle_stop_s, max_cost, plan.pricing))
    if as_json:
        render.print_json(out, inventory)
        return
    render.inventory_table(out, inventory)
    held = inventory.cluster_id
    ends = (f"`sortie down {held}` destroys it (its TTL ends it otherwise)" if plan.cost else
            f"`sortie down {held}` stops it")
    idle = (f"; with nothing running for {render.duration(idle_stop_s)} it ends itself "
            "(idle stop)" if idle_stop_s else "")
    out.print(f"held {held}: `sortie exec {held} --workdir . --script train.py` runs your job "
              f"there; {ends}{idle}", soft_wrap=True)


@click.command()
@click.argument("name")
@options.max_recoveries
@options.max_artifacts
@options.as_json
def watch(name: str, max_recoveries: int, max_artifact_bytes: int, as_json: bool) -> None:
    """Take over sortie NAME from a controller that is gone (the laptop went to sleep, the
    terminal closed): stream its logs, wait for the job, recover lost nodes, collect and verify
    the artifacts into the run's directory, tear down. Exits as `sortie run` would have."""
    backend = registry.to_take_over(sortie_home(), name)
    progress, out = render.consoles(as_json)
    result = watch_sortie(backend, name, RichReporter(progress),
                          Limits(max_recoveries=max_recoveries,
                                 max_artifact_bytes=max_artifact_bytes))
    _finish_run(result, out, as_json)
