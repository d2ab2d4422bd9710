"""The ``sortie`` command line: it parses flags and renders results; the work is done by the
lifecycle (`sortie/lifecycle.py`), the registry of sorties (`sortie/registry.py`), reap
(`sortie/reap.py`) and the node helpers (`sortie/nodes.py`).

Exit codes: 0 success, 1 a failure (training or teardown), 2 bad input (nothing was started),
130 interrupted by Ctrl-C, 143 stopped by SIGTERM. Errors are one line on stderr.
"""

from __future__ import annotations

import logging
import os
import re
import signal
import sys
import threading
from dataclasses import replace
from pathlib import Path

import click
from rich.console import Console
from rich.markup import escape

from sortie.cli import options, render
from sortie.cli.render import RichReporter
from sortie.core.errors import SortieError, UsageError
from sortie.core.home import sortie_home
from sortie.core.inventory import Inventory
from sortie.engine.driver import RunRequest, run_sortie
from sortie.engine.held_cluster import exec_job, hold_cluster
from sortie.engine.task import for_held_cluster, job_for, task_with_flags
from sortie.engine.watch import watch_sortie
from sortie.fleet import attach_cluster as attaching
from sortie.fleet import node_access as node_access
from sortie.fleet import registry
from sortie.fleet.launch_target import cluster_cost, launch_target
from sortie.fleet.status import status as fleet_status
from sortie.rundir.result import RunResult
from stacks.cloud_records import CloudAccess
from stacks.profiles import PROFILES_ENV

NODE_NAME = re.compile(r"node-\d+")
MAX_STEPS = 10**9  # the bundled trainer's: more is a typo, not a run that would ever end


def _use_profiles(ctx: click.Context, _param: click.Parameter, value: str | None) -> None:
    """--profiles DIR: the user's profile directories, looked in before the shipped ones."""
    if value:
        os.environ[PROFILES_ENV] = value


@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(package_name="sortie", prog_name="sortie")
@click.option("--profiles", metavar="DIR[:DIR...]", expose_value=False, is_eager=True,
              callback=_use_profiles,
              help=f"Directories of your own stack profiles (Pulumi.<name>.yaml), looked in "
                   f"before the shipped ones. Default: ${PROFILES_ENV}.")
def app() -> None:
    """Short-lived multi-node GPU clusters: provision, bootstrap, train, collect, tear down.

    One experiment = one sortie. `sortie run` does it all and always tears down; `up`, `status`,
    `ssh` and `down` let you hold a cluster and look inside it. `profiles` lists the cloud
    profiles, `plan` shows one's resources and cost, `init` makes a Pulumi project of one.
    """


def _require_local(cloud: str) -> None:
    if cloud != "local":
        raise UsageError(f"--cloud {cloud}: a cloud cluster comes from a stack profile: "
                         f"`sortie run --stack PROFILE` (profiles: `sortie plan --help`)")


@app.command(cls=options.PassthroughCommand)
@options.job
@options.nodes
@click.option("--procs-per-node", "-p", type=click.IntRange(1, 64), default=None,
              help="Processes per node. Default: one per GPU; without GPUs 1 for your job, "
                   "2 for the bundled trainer.")
@click.option("--steps", type=click.IntRange(1, MAX_STEPS), default=60, show_default=True,
              help="Training steps (the bundled trainer).")
@options.cloud
@options.stack()
@options.overrides
@options.backend_url
@options.name
@options.runs_dir
@click.option("--ckpt-every", type=click.IntRange(1, MAX_STEPS), default=20, show_default=True,
              help="Steps between checkpoints (the bundled trainer): the most a lost node can "
                   "cost.")
@options.max_recoveries
@options.max_artifacts
@click.option("--on", "on_cluster", metavar="NAME",
              help="Run on cluster NAME (held with `sortie up`, or attached with `sortie "
                   "attach`) and leave it running: no up, no down, no node replaced.")
@options.as_json
def run(task_file: Path | None, workdir: Path | None, script: str | None,
        artifacts: tuple[str, ...], rerun_setup: bool, max_sync_bytes: int, nodes: int | None,
        procs_per_node: int | None, steps: int, cloud: str, stack: str | None,
        overrides: tuple[str, ...], backend_url: str | None, name: str | None, runs_dir: Path,
        ckpt_every: int, max_recoveries: int, max_artifact_bytes: int, on_cluster: str | None,
        as_json: bool) -> None:
    """Run a whole sortie: up -> bootstrap -> [sync, setup] -> train -> collect -> down.

    What runs: your script (`--workdir DIR --script train.py -- ARGS`: sortie writes the
    torchrun line), a task file (TASK.yaml: workdir, setup, script or run, env, secrets,
    artifacts; flags override it), or, with neither, the bundled trainer (arguments after `--`
    go to it). Every node is told its place in SORTIE_* variables (see the README).

    Launch is all or nothing (a cloud profile's fallbackZones, then on-demand, are tried in
    turn). A node lost mid-run (machine gone, SSH dead, preempted) is replaced and the job
    relaunched, up to --max-recoveries times. Teardown always runs: after success, failure,
    Ctrl-C or SIGTERM, and ends with proof that nothing remains. Artifacts (metrics,
    checkpoints, per-node logs, your --artifact files) land in RUNS_DIR/<id>/, verified.
    """
    passthrough: tuple[str, ...] = click.get_current_context().meta["passthrough"]
    task = task_with_flags(task_file, name=name, nodes=nodes, procs_per_node=procs_per_node,
                           workdir=workdir, script=script, artifacts=artifacts, stack=stack,
                           overrides=overrides)
    if task.stack is None:
        _require_local(cloud)
    user_job = job_for(task, passthrough, rerun_setup, max_sync_bytes)
    if on_cluster is not None:
        if task.stack or task.overrides or task.nodes or cloud != "local":
            raise UsageError(f"--on {on_cluster}: runs on that cluster as it is; --stack, "
                             "--set, --nodes and --cloud do not apply")
        request = RunRequest(steps=steps, trainer_args=() if user_job else passthrough,
                             run_id=task.name, runs_dir=runs_dir, ckpt_every=ckpt_every,
                             max_artifact_bytes=max_artifact_bytes, user_job=user_job)
        _run_on(on_cluster, request, task.procs_per_node, as_json)
        return
    target = launch_target(sortie_home(), task.stack, task.overrides, backend_url,
                                    task.name)
    default_procs = max(1, target.gpus_per_node) if user_job else target.procs_per_node
    count = target.node_count(task.nodes)
    progress, out = render.consoles(as_json)
    cost = target.cost(count)
    render.launch_cost(progress, cost)
    request = RunRequest(nodes=count,
                         procs_per_node=task.procs_per_node or default_procs, steps=steps,
                         trainer_args=() if user_job else passthrough, run_id=task.name,
                         runs_dir=runs_dir, ckpt_every=ckpt_every,
                         max_recoveries=max_recoveries, max_artifact_bytes=max_artifact_bytes,
                         user_job=user_job, usd_per_hour=cost.usd_per_hour if cost else None,
                         pricing=cost.terms if cost else "")
    result = run_sortie(request, RichReporter(progress), target.backend)
    _finish_run(result, out, as_json)


@app.command(name="exec", cls=options.PassthroughCommand)
@click.argument("name")
@options.job
@click.option("--procs-per-node", "-p", type=click.IntRange(1, 64), default=None,
              help="Processes per node. Default: one per GPU, 1 without GPUs.")
@options.runs_dir
@options.max_artifacts
@options.as_json
def exec_(name: str, task_file: Path | None, workdir: Path | None, script: str | None,
          artifacts: tuple[str, ...], rerun_setup: bool, max_sync_bytes: int,
          procs_per_node: int | None, runs_dir: Path, max_artifact_bytes: int,
          as_json: bool) -> None:
    """Run your job on cluster NAME (held with `sortie up`, local or --stack, or attached with
    `sortie attach`) and leave the cluster running.

    The same job flags as `run` (TASK.yaml, --workdir, --script, -- ARGS, ...). A task file
    `sortie run` takes works here too: its name, stack and set (which make a new cluster) are
    ignored, and said to be; its nodes must be the cluster's. A second `exec` sends only what
    changed and skips a setup whose inputs did not change. Artifacts land in RUNS_DIR/<run
    id>/; `sortie down NAME` ends the cluster.
    """
    passthrough: tuple[str, ...] = click.get_current_context().meta["passthrough"]
    task = task_with_flags(task_file, procs_per_node=procs_per_node, workdir=workdir,
                           script=script, artifacts=artifacts)
    backend, inventory = registry.held_cluster(sortie_home(), name)
    task, ignored = for_held_cluster(task, len(inventory.nodes), name)
    user_job = job_for(task, passthrough, rerun_setup, max_sync_bytes)
    if user_job is None:
        raise UsageError("exec: give --script or a task with `script` or `run`")
    request = RunRequest(runs_dir=runs_dir, max_artifact_bytes=max_artifact_bytes,
                         user_job=user_job)
    note = (f"the task's {', '.join(ignored)} make a new cluster: ignored on {name}"
            if ignored else None)
    _run_on(name, request, task.procs_per_node, as_json, (backend, inventory), note)


def _run_on(name: str, request: RunRequest, procs_per_node: int | None, as_json: bool,
            held: tuple[registry.HeldBackend, Inventory] | None = None,
            note: str | None = None) -> None:
    """`exec NAME`, `run --on NAME`: one job on a held or attached cluster, left running. Per
    node by default: one process per GPU; without GPUs 1 for a user's job, 2 for the trainer."""
    backend, inventory = held or registry.held_cluster(sortie_home(), name)
    gpus = min(node.gpus for node in inventory.nodes)
    default = gpus or (1 if request.user_job else 2)
    progress, out = render.consoles(as_json)
    reporter = RichReporter(progress)
    if note:
        reporter.note(note)
    cost = cluster_cost(backend, len(inventory.nodes))
    request = replace(request, nodes=len(inventory.nodes),
                      procs_per_node=procs_per_node or default,
                      usd_per_hour=cost.usd_per_hour if cost else None,
                      pricing=cost.terms if cost else "")
    result = exec_job(backend, name, request, reporter)
    _finish_run(result, out, as_json)


def _finish_run(result: RunResult, out: Console, as_json: bool) -> None:
    if as_json:
        render.print_json(out, result)
    else:
        render.run_summary(out, result)
    failure = result.failure()
    if failure:
        raise SortieError(failure)


@app.command()
@options.nodes
@options.cloud
@options.stack()
@options.overrides
@options.backend_url
@options.name
@options.as_json
def up(nodes: int | None, cloud: str, stack: str | None, overrides: tuple[str, ...],
       backend_url: str | None, name: str | None, as_json: bool) -> None:
    """Start a cluster and leave it running: local nodes, or a cloud cluster from a stack
    profile (--stack PROFILE). Then `sortie exec NAME` runs your jobs on it and `sortie down
    NAME` ends it.

    A cloud cluster is launched like `sortie run`'s: its estimated cost is shown first, launch
    is all or nothing (the profile's fallbackZones, then on-demand), every node is checked
    over SSH with its pinned host key, and its TTL is armed on every node: past it the nodes
    shut themselves down and `sortie reap` destroys the rest. If the start fails or is
    interrupted, the cluster is destroyed with proof."""
    if stack is None:
        _require_local(cloud)
    elif cloud != "local":
        raise UsageError("--cloud: a stack profile names its cloud; leave --cloud out")
    target = launch_target(sortie_home(), stack, overrides, backend_url, name)
    count = target.node_count(nodes)
    progress, out = render.consoles(as_json)
    cost = target.cost(count)
    render.launch_cost(progress, cost)
    inventory = hold_cluster(target.backend, count, name, RichReporter(progress))
    if as_json:
        render.print_json(out, inventory)
        return
    render.inventory_table(out, inventory)
    held = inventory.cluster_id
    ends = (f"`sortie down {held}` destroys it (its TTL ends it otherwise)" if cost else
            f"`sortie down {held}` stops it")
    out.print(f"held {held}: `sortie exec {held} --workdir . --script train.py` runs your job "
              f"there; {ends}", soft_wrap=True)


@app.command()
@click.argument("name")
@click.option("--hosts", "hosts_file", type=click.Path(dir_okay=False, path_type=Path),
              help="A hosts file: machines sortie knows nothing about (see the README).")
@click.option("--outputs", "outputs_file", type=click.Path(dir_okay=False, path_type=Path),
              help="A stack's outputs, saved from `pulumi stack output --json --show-secrets`.")
@click.option("--pulumi-stack", metavar="STACK",
              help="A Pulumi stack of this repository's program (needs the Pulumi CLI).")
@click.option("--cwd", type=click.Path(file_okay=False, path_type=Path), default=Path("."),
              show_default=True, help="The Pulumi project directory of --pulumi-stack.")
@click.option("--trust", multiple=True, metavar="HOST=SHA256:...",
              help="The fingerprint of a host that the hosts file gives no key for: its key "
                   "is read from it and pinned only if it matches. Repeatable.")
@click.option("--min-free-disk", "min_free_bytes", type=options.ByteSize(), default="1G",
              show_default=True, help="Free space each node needs in its workdir.")
@options.as_json
def attach(name: str, hosts_file: Path | None, outputs_file: Path | None,
           pulumi_stack: str | None, cwd: Path, trust: tuple[str, ...], min_free_bytes: int,
           as_json: bool) -> None:
    """Use a cluster sortie did not create, as NAME: existing machines (--hosts FILE), or the
    nodes of a `pulumi up` stack (--pulumi-stack STACK, or --outputs FILE).

    Every host key is pinned (from the file or the stack; never trusted on first use). Every
    node is checked first: SSH, python and torch, GPUs (the same on every node), free disk,
    and that every node reaches the head's rendezvous port. Only a cluster that passes is
    attached. Then `sortie exec NAME` and `sortie run --on NAME` run jobs on it, and `sortie
    down NAME` detaches: sortie's processes and files leave the nodes, the machines keep
    running. sortie never destroys an attached cluster (but `down --destroy-stack`)."""
    given = [flag for flag, value in (("--hosts", hosts_file), ("--outputs", outputs_file),
                                      ("--pulumi-stack", pulumi_stack)) if value]
    if len(given) != 1:
        raise UsageError("give one of --hosts FILE, --outputs FILE, --pulumi-stack STACK")
    if trust and hosts_file is None:
        raise UsageError("--trust: applies to --hosts (a stack's outputs carry its host keys)")
    home, request = sortie_home(), attaching.AttachRequest(name, min_free_bytes)
    progress, out = render.consoles(as_json)
    reporter = RichReporter(progress)
    if hosts_file is not None:
        report = attaching.attach_hosts(home, request, hosts_file, trust, reporter)
    elif outputs_file is not None:
        report = attaching.attach_outputs_file(home, request, outputs_file, reporter)
    else:
        assert pulumi_stack is not None
        report = attaching.attach_stack(home, request, pulumi_stack, cwd, reporter)
    if as_json:
        render.print_json(out, report)
    else:
        render.preflight_table(out, report)
    if not report.ok:
        raise SortieError(f"preflight failed: {report.problems()}; nothing was attached")
    if not as_json:
        out.print(f"attached {name}: `sortie exec {name} --workdir . --script train.py` runs "
                  f"your job there, `sortie down {name}` detaches (machines left running)")


@app.command()
@options.backend_url_option(
    "Also list the sorties other controllers launched into this shared Pulumi state backend "
    "(s3://, gs://, azblob://, file://; needs the Pulumi CLI).")
@options.as_json
def status(backend_url: str | None, as_json: bool) -> None:
    """List every sortie (local clusters, cloud stacks, attached clusters): owner, age, nodes,
    state, estimated $/h and $ so far, TTL left; then the estimated $/h of everything running,
    in all and by owner (`--json`: {sorties, owners, usd_per_hour}).

    States: up, degraded (a node is down), orphaned (its controller is gone: `sortie reap`
    adopts it, `sortie watch` takes it over), expired (past its TTL), kept (only its unverified
    bucket is left), broken (an interrupted start, or damaged state)."""
    fleet = fleet_status(sortie_home(), CloudAccess(backend_url))
    out = render.console()
    if as_json:
        render.print_json(out, fleet)
    else:
        render.status_table(out, fleet)


@app.command()
@click.argument("name", required=False)
@click.option("--all", "all_sorties", is_flag=True,
              help="Tear down every sortie but kept buckets (name those one by one).")
@click.option("--destroy-stack", is_flag=True,
              help="For a cluster attached from a Pulumi stack: detach, then destroy the stack, "
                   "with the same proof as a sortie's teardown (the stack's config stays).")
@click.option("--forget", is_flag=True,
              help="For an attached cluster whose nodes are gone: forget it without reaching "
                   "them (the sortie directory on each may remain; the message lists them).")
@click.option("--yes", "-y", is_flag=True,
              help="Destroy without asking (--destroy-stack asks first on a terminal, and "
                   "needs --yes anywhere else).")
@options.backend_url
@options.as_json
def down(name: str | None, all_sorties: bool, destroy_stack: bool, forget: bool, yes: bool,
         backend_url: str | None, as_json: bool) -> None:
    """Tear NAME down and prove it: "0 resources remain", or each leftover and how to remove it.

    Local: every process stopped, nothing listening. Cloud: destroy, then a refresh shows no
    resource and a sweep of the cloud by the sortie tags finds none; only then is the stack
    removed. A kept bucket (state "kept") is removed only when named.

    An attached cluster is detached, never destroyed: sortie's processes and its workdir leave
    the nodes, the machines keep running (`--destroy-stack` destroys a Pulumi stack's). A node
    that cannot be reached keeps the cluster for a retry; `--forget` lets it go untouched."""
    if all_sorties == (name is not None):
        raise UsageError("name one NAME or pass --all")
    home, out = sortie_home(), render.console()
    access = CloudAccess(backend_url)
    if forget:
        if name is None or destroy_stack:
            raise UsageError("--forget: name one attached cluster (without --destroy-stack)")
        forgotten = registry.forget_attached(home, name)
        if as_json:
            render.print_json(out, forgotten)
        else:
            out.print(escape(forgotten.summary()), soft_wrap=True)
        return
    if destroy_stack:
        if name is None:
            raise UsageError("--destroy-stack: name the attached cluster")
        if not yes:  # the whole stack is the user's: never destroyed on one flag by accident
            if not sys.stdin.isatty():
                raise UsageError(f"--destroy-stack destroys every resource of {name}'s Pulumi "
                                 "stack: add --yes to confirm (no terminal to ask on)")
            if not click.confirm(f"Destroy every resource of the Pulumi stack attached as "
                                 f"{name}?", default=False, err=True):
                raise UsageError("--destroy-stack: not confirmed; nothing was destroyed")
        reports = registry.destroy_attached_stack(home, name, access)
    else:
        targets = registry.to_tear_down(home, name)
        if not targets:
            out.print("no sorties")
            return
        reports = [registry.teardown(home, seen, access) for seen in targets]
    render.teardowns(out, reports, as_json)
    problems = [r.summary() for r in reports if not r.clean]
    if problems:
        raise SortieError("; ".join(problems))


@app.command()
@click.option("--dry-run", is_flag=True, help="List what would be adopted; change nothing.")
@click.option("--hang-timeout", type=options.Duration(), default="30m", show_default=True,
              help="A job whose log and metrics have not grown for this long is hung: it is "
                   "stopped, collected and torn down.")
@options.backend_url
@options.as_json
def reap(dry_run: bool, hang_timeout: float, backend_url: str | None, as_json: bool) -> None:
    """End the sorties whose controller is gone, without losing their run.

    An orphaned sortie still training is left running (a cloud TTL bounds its cost; `sortie
    watch` takes it over). Once its job has ended or hung, or its nodes are gone (past a cloud
    TTL), reap collects and verifies its artifacts into the run's directory (or keeps the
    bucket and says where) and tears it down with proof. Besides this controller's sorties it
    looks in the state backend (--backend-url, or this controller's own) for those of others.
    Kept buckets and held clusters are never touched (a cloud cluster held with `sortie up
    --stack` only once past its TTL). Safe to run from cron (e.g. every 10
    minutes): it prints nothing when there is nothing to do; exit 1 if any sortie failed."""
    from sortie.engine.reap import reap as reap_all

    done = reap_all(sortie_home(), CloudAccess(backend_url), dry_run, hang_timeout)
    out = render.console()
    if as_json:
        render.print_json(out, done)
    else:
        for item in done:
            out.print(escape(item.line), soft_wrap=True)
    failed = [item.name for item in done if not item.ok]
    if failed:
        raise SortieError(f"reap could not end {', '.join(failed)} (see above)")


@app.command()
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
                          RunRequest(max_recoveries=max_recoveries,
                                     max_artifact_bytes=max_artifact_bytes))
    _finish_run(result, out, as_json)


@app.command()
@options.stack(required=True)
@options.overrides
@options.as_json
def plan(stack: str, overrides: tuple[str, ...], as_json: bool) -> None:
    """Show what a stack profile will create and cost, offline.

    Runs the real Pulumi program under Pulumi's mock runtime: no cloud credentials and no
    Pulumi CLI are needed, and nothing is created. Prints the resources as a tree, a security
    summary and the estimated cost per hour and for the TTL, on-demand and spot."""
    from sortie.cli.plan_view import render as render_plan  # the cloud SDKs load only for plans
    from stacks.plan import make_plan

    progress, out = render.consoles(as_json)
    with progress.status(f"Evaluating profile {stack} offline ..."):
        result = make_plan(stack, overrides)
    if as_json:
        render.print_json(out, result)
    else:
        render_plan(out, result)


@app.command()
@options.as_json
def profiles(as_json: bool) -> None:
    """List the stack profiles: cloud, region, instance type, nodes and $/h at their terms.

    Your own (--profiles DIR or $SORTIE_PROFILES) come first and replace a shipped one of the
    same name; `sortie plan --stack NAME` shows one in full."""
    from stacks.plan import profile_rows

    rows = profile_rows()
    out = render.console()
    if as_json:
        render.print_json(out, {"profiles": rows})
    else:
        render.profiles_table(out, rows)


@app.command()
@click.argument("directory", type=click.Path(path_type=Path), metavar="DIR")
@options.stack(required=True)
@options.overrides
def init(directory: Path, stack: str, overrides: tuple[str, ...]) -> None:
    """Write a Pulumi project of stack profile --stack into DIR, outside sortie's checkout.

    DIR gets Pulumi.yaml (the Python runtime sortie is installed in), __main__.py (which runs
    the installed cluster program), Pulumi.<stack>.yaml (the profile, --set applied) and a
    README of the next commands: `pulumi stack init <stack>`, `pulumi up`. Nothing is
    replaced: a DIR that has any of these files is refused."""
    from stacks.project import write_project

    out = render.console()
    for path in write_project(directory, stack, overrides):
        out.print(f"wrote {escape(str(path))}", highlight=False, soft_wrap=True)
    out.print(f"next: cd {escape(str(directory))} && pulumi stack init {escape(stack)} && "
              "pulumi up (see README.md there)", highlight=False, soft_wrap=True)


@app.command(cls=options.WordsCommand, options_metavar="",
             context_settings={"help_option_names": ["-h", "--help"]})
@click.argument("words", nargs=-1, metavar="[NAME] NODE [-- COMMAND...]")
def ssh(words: tuple[str, ...]) -> None:
    """Open an SSH session to NODE (e.g. node-0) of sortie NAME, pinned to its host key.

    NAME may be left out when one sortie runs. With COMMAND, run it there instead of a shell:
    `sortie ssh exp-7 node-1 -- ls -la`. No word here is an option of ssh's."""
    words = click.get_current_context().meta["words"]
    if "--" in words[:3]:  # it ends NAME and NODE; COMMAND follows
        at = words.index("--")
        words = (*words[:at], *words[at + 1:])
    if not words:
        raise UsageError("NODE: missing; e.g. `sortie ssh NAME node-0`")
    # A first word like node-1 is a NODE, anything else is a NAME.
    if NODE_NAME.fullmatch(words[0]):
        name, node, command = None, words[0], words[1:]
    elif len(words) >= 2:
        name, node, command = words[0], words[1], words[2:]
    else:
        raise UsageError("NODE: missing; e.g. `sortie ssh NAME node-0`")
    argv = node_access.ssh_command(sortie_home(), name, node, command)
    sys.stdout.flush()
    os.execvp("ssh", argv)


@app.command()
@click.argument("name")
@click.argument("node", required=False)
@options.runs_dir
def logs(name: str, node: str | None, runs_dir: Path) -> None:
    """Print the torchrun logs of sortie NAME (every node, or NODE): live from the nodes while
    it runs, from RUNS_DIR/NAME/logs/ once it was collected."""
    printed = False
    for node_name, text in node_access.logs(sortie_home(), name, node, runs_dir):
        for line in text.splitlines():
            print(f"{node_name} | {render.terminal_safe(line)}")
            printed = True
    if not printed:  # a held cluster no job has run on yet, or a job that wrote nothing
        click.echo(f"{name}: no logs yet (no job has written any{' on ' + node if node else ''})",
                   err=True)


@app.command()
@click.argument("run")
@click.option("--open", "open_it", is_flag=True,
              help="Also open it in this machine's browser (where there is one).")
@options.runs_dir
@options.as_json
def report(run: str, open_it: bool, runs_dir: Path, as_json: bool) -> None:
    """Write the report of run RUN (a run id in RUNS_DIR, or a run directory) to
    RUN/report.html and print its path.

    The report is one HTML file that needs no network: the outcome, a timeline of the phases
    (launch retries and recoveries marked), every numeric metric against step (checkpoint saves
    marked), each node's Python, torch, GPUs and exit code (and its log's tail if it failed),
    the estimated cost, the teardown proof, and the artifacts with their SHA-256. Every sortie
    writes one when it ends; this renders it again, or for a run from before reports."""
    from sortie.rundir import report as run_report

    run_dir = run_report.run_directory(run, runs_dir)
    path = run_report.write_report(run_dir)
    opened = open_it and run_report.open_in_browser(path)
    if as_json:
        render.print_json(render.consoles(True)[1], {"report": str(path), "opened": opened})
        return
    print(path)
    if open_it and not opened:
        print(f"no browser here: copy {path} to a machine with one", file=sys.stderr)


class _Terminated(KeyboardInterrupt):
    """SIGTERM, surfaced like Ctrl-C so that the same teardown runs."""


def _on_sigterm(_signum: int, _frame: object) -> None:
    raise _Terminated


def main(argv: list[str] | None = None) -> int:
    """Entry point: runs the CLI and turns every error into one line and an exit code."""
    signal.signal(signal.SIGTERM, _on_sigterm)
    # paramiko's transport threads log broken connections (with tracebacks) when teardown stops
    # a node mid-stream; sortie reports connection failures itself. SORTIE_DEBUG=1 shows them.
    if not os.environ.get("SORTIE_DEBUG"):
        logging.getLogger("paramiko").addHandler(logging.NullHandler())
        logging.getLogger("paramiko").propagate = False
    args = sys.argv[1:] if argv is None else argv
    try:
        # make_context/invoke rather than app.main(): main() turns KeyboardInterrupt (and so
        # SIGTERM) into a bare Abort and prints a blank line.
        with app.make_context("sortie", list(args)) as ctx:
            app.invoke(ctx)
        return 0
    except click.exceptions.Exit as exc:
        return exc.exit_code
    except click.UsageError as exc:
        _fail(exc.format_message())
        return 2
    except click.ClickException as exc:
        _fail(exc.format_message())
        return exc.exit_code
    except KeyboardInterrupt as exc:
        signaled = isinstance(exc, _Terminated)
        _fail("stopped by SIGTERM" if signaled else "interrupted")
        return 143 if signaled else 130
    except SortieError as exc:
        _fail(str(exc))
        return exc.exit_code


def _fail(message: str) -> None:
    print(f"sortie: error: {' '.join(message.split())}", file=sys.stderr)


def entry() -> None:
    """The console script ``sortie``."""
    code = main()
    if any(thread.is_alive() and not thread.daemon for thread in threading.enumerate()
           if thread is not threading.main_thread()):
        # A Ctrl-C does not wait for node workers (e.g. one still retrying SSH to a node that
        # teardown has since removed) and Python would join them, up to their timeouts, before
        # exiting. Teardown is done and reported by now: leave without them.
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    sys.exit(code)


if __name__ == "__main__":
    entry()
