"""The commands for a held cluster's jobs and its mending: `jobs` (running, queued, ended),
`cancel` (one job, the cluster left up), `repair` (lost or unhealthy nodes replaced). `exec`
itself, with its queue and `--detach`, is in `run_commands.py`."""

from __future__ import annotations

import click

from sortie.bootstrap.choices import HealthLevel
from sortie.cli import options, render
from sortie.core import naming
from sortie.core.errors import SortieError
from sortie.core.home import sortie_home


@click.command()
@click.argument("name")
@options.as_json
def jobs(name: str, as_json: bool) -> None:
    """List the jobs of held cluster NAME: the one running, those queued behind it (in their
    order) and those that ended, each with its start, duration and directory. A job whose
    controller died says `controller gone`."""
    from sortie.cli.runs_view import show_runs
    from sortie.engine import held_jobs

    listed = held_jobs.jobs(sortie_home(), naming.check_name(name, "NAME"))
    if not listed and not as_json:
        render.console().print(f"no jobs on {name} yet (`sortie exec {name} ...` runs one)")
        return
    show_runs(listed, as_json, f"jobs on {name}")


@click.command()
@click.argument("name")
@click.argument("job", required=False)
@options.as_json
def cancel(name: str, job: str | None, as_json: bool) -> None:
    """End job JOB on held cluster NAME (default: the one running) and leave the cluster up:
    its controller stops it on every node and collects what it wrote, as Ctrl-C on its `exec`
    would; a queued job leaves the queue. Exit 0 once the run is recorded as ended."""
    from sortie.engine import held_jobs

    home = sortie_home()
    entry = held_jobs.to_cancel(home, naming.check_name(name, "NAME"), job)
    progress, out = render.consoles(as_json)
    with progress.status(f"stopping {entry.id} on {name}"):
        state = held_jobs.cancel(home, entry)
    if as_json:
        render.print_json(out, {"run_id": entry.id, "cluster": name, "state": state})
    else:
        out.print(f"{entry.id}: {state}; {name} is still up (`sortie down {name}` ends it)",
                  highlight=False)


@click.command()
@click.argument("name")
@click.option("--health", "level", type=click.Choice(("quick", "full")), default="quick",
              show_default=True, help="The check that names an unhealthy node, and that the "
                                      "repaired cluster passes (as `sortie check`).")
@options.as_json
def repair(name: str, level: HealthLevel, as_json: bool) -> None:
    """Mend held cluster NAME: replace its lost nodes (machine gone, SSH dead) or, when every
    node answers, those the health check names, the way a run replaces a lost node (a Slurm
    allocation: a new one), then bootstrap and check it whole. An attached cluster's hosts are
    named, never touched. Exit 0 when the cluster is healthy, 1 when it is not."""
    from sortie.cli.reporter import RichReporter
    from sortie.engine.repair import repair_cluster

    progress, out = render.consoles(as_json)
    repaired = repair_cluster(sortie_home(), naming.check_name(name, "NAME"),
                              RichReporter(progress), level)
    if as_json:
        render.print_json(out, repaired)
    else:
        out.print(render.escape(repaired.summary()), soft_wrap=True)
    if repaired.health is not None and not repaired.health.ok:
        raise SortieError(repaired.health.summary())
