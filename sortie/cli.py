"""The ``sortie`` command line.

Exit codes: 0 success, 1 a failure (training or teardown), 2 bad input (nothing was started),
130 interrupted by Ctrl-C, 143 stopped by SIGTERM. Errors are one line on stderr.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import signal
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import click
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from bootstrap.collect import SIZE_UNITS
from bootstrap.errors import SortieError, UsageError
from bootstrap.inventory import INVENTORY_FILE, Inventory, Node
from sortie import registry
from sortie.lifecycle import RunRequest, RunResult, new_run_id, run_sortie
from stacks import naming
from stacks.backend import Backend, Teardown
from stacks.local import LocalBackend, sortie_home
from stacks.profiles import apply_overrides, load_profile

NODE_NAME = re.compile(r"node-\d+")

CLOUDS = ("local", "aws", "gcp", "azure")


@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
def app() -> None:
    """Short-lived multi-node GPU clusters: provision, bootstrap, train, collect, tear down.

    One experiment = one sortie. `sortie run` does it all and always tears down; `up`, `status`,
    `ssh` and `down` let you hold a cluster and look inside it.
    """


class RichReporter:
    """Shows each phase with a spinner and its duration, and node output with a node prefix."""

    def __init__(self, console: Console) -> None:
        self.console = console

    @contextlib.contextmanager
    def phase(self, title: str) -> Iterator[None]:
        started = time.perf_counter()
        try:
            with self.console.status(f"{title} ..."):
                yield
        except BaseException:
            self.console.print(f"[red]✗[/] {title} ({time.perf_counter() - started:.1f}s)")
            raise
        self.console.print(f"[green]✓[/] {title} ({time.perf_counter() - started:.1f}s)")

    def node_line(self, node: str, line: str) -> None:
        # Node output is text, not markup: gloo's errors contain "[/path/pair.cc:537]".
        self.console.print(f"[cyan]{node}[/] | {escape(line)}", markup=True, highlight=False,
                           soft_wrap=True)

    def note(self, text: str) -> None:
        self.console.print(f"[yellow]![/] {escape(text)}")


def _consoles(as_json: bool) -> tuple[Console, Console]:
    """(progress console, result console): with --json, stdout carries only the JSON."""
    out = Console(highlight=False)
    return (Console(stderr=True, highlight=False) if as_json else out), out


def _require_local(cloud: str) -> None:
    if cloud != "local":
        raise UsageError(f"--cloud {cloud}: a cloud cluster comes from a stack profile: "
                         f"`sortie run --stack PROFILE` (profiles: `sortie plan --help`)")


class ByteSize(click.ParamType):
    """A size in bytes: 1048576, 512K, 500M, 50G, 2T (powers of 1024)."""

    name = "SIZE"

    def convert(self, value: object, param: click.Parameter | None,
                ctx: click.Context | None) -> int:
        if isinstance(value, int):
            return value
        match = re.fullmatch(r"(\d+)\s*([KMGT]?)I?B?", str(value).strip().upper())
        if not match or int(match[1]) == 0:
            self.fail(f"{value!r} is not a size like 500M or 50G", param, ctx)
        return int(match[1]) * SIZE_UNITS.get(match[2], 1)


nodes_option = click.option("--nodes", "-n", type=click.IntRange(1, 254), default=None,
                            help="Number of nodes. Default: 2 locally, the profile's on a cloud.")
cloud_option = click.option("--cloud", type=click.Choice(CLOUDS), default="local",
                            show_default=True, help="Where the cluster runs (clouds: --stack).")
json_option = click.option("--json", "as_json", is_flag=True,
                           help="Print one JSON document on stdout (progress goes to stderr).")
name_option = click.option("--name", help="Cluster / run id (lowercase letters, digits, "
                           "dashes). Default: a timestamp.")
backend_url_option = click.option(
    "--backend-url", metavar="URL", help="Pulumi state backend for cloud stacks (file://, s3://, "
    "gs://, azblob://). Default: a local file backend in $SORTIE_HOME/pulumi/state.")


def _home() -> Path:
    return sortie_home()


@app.command()
@nodes_option
@click.option("--procs-per-node", "-p", type=click.IntRange(1, 64), default=None,
              help="Trainer processes per node. Default: 2 locally, one per GPU on a cloud.")
@click.option("--steps", type=click.IntRange(min=1), default=60, show_default=True,
              help="Training steps.")
@cloud_option
@click.option("--stack", "-s", metavar="PROFILE",
              help="Run on a cloud: stacks/Pulumi.<PROFILE>.yaml, e.g. aws-p4d. Needs the "
                   "Pulumi CLI and the cloud's credentials.")
@click.option("--set", "overrides", multiple=True, metavar="KEY=VALUE",
              help="Override a profile setting for this run, e.g. --set zone=us-east-1b.")
@backend_url_option
@name_option
@click.option("--runs-dir", type=click.Path(file_okay=False, path_type=Path), default="runs",
              show_default=True, help="Where runs/<id>/ is written.")
@click.option("--ckpt-every", type=click.IntRange(min=1), default=20, show_default=True,
              help="Steps between checkpoints: the most a lost node can cost.")
@click.option("--max-recoveries", type=click.IntRange(min=0), default=2, show_default=True,
              help="Times a lost node is replaced and training resumed before giving up.")
@click.option("--max-artifacts", "max_artifact_bytes", type=ByteSize(), default="50G",
              show_default=True, help="Most bytes collected from the nodes and the bucket "
              "together (e.g. 500M, 2T); past it collection stops and the bucket is kept.")
@json_option
@click.argument("trainer_args", nargs=-1, metavar="[-- TRAINER_ARGS...]")
def run(nodes: int | None, procs_per_node: int | None, steps: int, cloud: str,
        stack: str | None, overrides: tuple[str, ...], backend_url: str | None,
        name: str | None, runs_dir: Path, ckpt_every: int, max_recoveries: int,
        max_artifact_bytes: int, as_json: bool, trainer_args: tuple[str, ...]) -> None:
    """Run a whole sortie: up -> bootstrap -> train -> collect -> down.

    Launch is all or nothing (a cloud profile's fallbackZones, then on-demand, are tried in
    turn). A node lost mid-run (machine gone, SSH dead, preempted) is replaced and training
    resumes from the last checkpoint, up to --max-recoveries times. Teardown always runs: after
    success, failure, Ctrl-C or SIGTERM, and ends with proof that nothing remains. Artifacts
    (metrics, checkpoint, per-node logs) land in RUNS_DIR/<id>/ and are verified before
    teardown. Flags after `--` go to the trainer.
    """
    backend: Backend
    if stack:
        config = apply_overrides(load_profile(stack), overrides)
        backend = registry.backend_for_profile(stack, config, _home(), backend_url)
        nodes = nodes or backend.spec.nodes
        procs_per_node = procs_per_node or max(1, backend.spec.instance.gpus)
    else:
        _require_local(cloud)
        if overrides:
            raise UsageError("--set: applies to a stack profile; add --stack PROFILE")
        backend = LocalBackend()
    progress, out = _consoles(as_json)
    request = RunRequest(nodes=nodes or 2, procs_per_node=procs_per_node or 2, steps=steps,
                         trainer_args=trainer_args, run_id=name, runs_dir=runs_dir,
                         ckpt_every=ckpt_every, max_recoveries=max_recoveries,
                         max_artifact_bytes=max_artifact_bytes)
    result = run_sortie(request, RichReporter(progress), backend)
    _finish_run(result, out, as_json)


def _finish_run(result: RunResult, out: Console, as_json: bool) -> None:
    if as_json:
        out.print_json(json.dumps(result.to_json()))
    else:
        _print_summary(out, result)
    failure = result.failure()
    if failure:
        raise SortieError(failure)


def _print_summary(out: Console, result: RunResult) -> None:
    summary = result.summary or {}
    table = Table(title=f"sortie {result.run_id}", show_header=False, title_justify="left")
    table.add_row("nodes", str(result.nodes))
    table.add_row("ranks", str(summary.get("world_size", result.ranks)))
    table.add_row("steps", str(summary.get("steps", "-")))
    if "final_loss" in summary:
        table.add_row("final loss", f"{summary['final_loss']:.5f}")
        table.add_row("samples/s", f"{summary['samples_per_s']:,.0f}")
    table.add_row("wall time", f"{result.wall_s:.1f}s")
    table.add_row("artifacts", f"{result.artifacts} ({len(result.collected)} files, SHA-256 "
                  "verified)" if not result.collect_error else f"{result.artifacts} (NOT "
                  f"verified: {result.collect_error})")
    for number, recovery in enumerate(result.recoveries, 1):
        table.add_row(f"recovery {number}", recovery.line())
    if result.teardown:
        table.add_row("teardown", result.teardown.summary())
    out.print(table)


@app.command()
@nodes_option
@cloud_option
@name_option
@json_option
def up(nodes: int | None, cloud: str, name: str | None, as_json: bool) -> None:
    """Start a local cluster and leave it running (tear it down with `sortie down`)."""
    _require_local(cloud)
    progress, out = _consoles(as_json)
    cluster_id = naming.check_name(name) if name else new_run_id()
    with RichReporter(progress).phase(f"Starting {nodes or 2} local nodes"):
        inventory = LocalBackend().up(cluster_id, nodes or 2, held=True)
    if as_json:
        out.print_json(inventory.model_dump_json())
    else:
        _print_inventory(out, inventory)


def _print_inventory(out: Console, inventory: Inventory) -> None:
    table = Table(title=f"cluster {inventory.cluster_id} ({inventory.backend})",
                  title_justify="left")
    for column in ("node", "address", "user", "gpus", "workdir"):
        table.add_column(column)
    for node in inventory.nodes:
        table.add_row(node.name, f"{node.address}:{node.port}", node.user, str(node.gpus),
                      node.workdir)
    out.print(table)


def _duration(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    minutes = int(seconds) // 60
    return f"{minutes // 60}h{minutes % 60:02d}m" if minutes >= 60 else \
        f"{minutes}m{int(seconds) % 60:02d}s"


class Duration(click.ParamType):
    """A duration in seconds: 90, 90s, 30m, 2h."""

    name = "DURATION"

    def convert(self, value: object, param: click.Parameter | None,
                ctx: click.Context | None) -> float:
        if isinstance(value, int | float):
            return float(value)
        match = re.fullmatch(r"(\d+)\s*([smh]?)", str(value).strip().lower())
        if not match:
            self.fail(f"{value!r} is not a duration like 90s, 30m or 2h", param, ctx)
        return float(match[1]) * {"": 1, "s": 1, "m": 60, "h": 3600}[match[2]]


@app.command()
@click.option("--backend-url", metavar="URL",
              help="Also list the sorties other controllers launched into this shared Pulumi "
                   "state backend (s3://, gs://, azblob://, file://; needs the Pulumi CLI).")
@json_option
def status(backend_url: str | None, as_json: bool) -> None:
    """List every sortie (local clusters and cloud stacks): age, nodes, state, estimated $ so
    far and TTL left. States: up, degraded (a node is down), orphaned (its controller is gone:
    `sortie reap` adopts it, `sortie watch` takes it over), expired (past its TTL), kept (only
    its unverified bucket is left), broken (an interrupted start, or damaged state)."""
    rows = registry.status(_home(), registry.CloudAccess(backend_url))
    out = Console(highlight=False)
    if as_json:
        out.print_json(json.dumps([row.model_dump() for row in rows]))
        return
    if not rows:
        out.print("no sorties")
        return
    table = Table(title="sorties", title_justify="left")
    for column in ("name", "backend", "nodes", "up", "age", "state", "$ so far", "TTL left"):
        table.add_column(column)
    for row in rows:
        table.add_row(row.name, row.backend, str(row.nodes),
                      "-" if row.nodes_up is None else str(row.nodes_up), _duration(row.age_s),
                      row.state, f"{row.usd_so_far:.2f}", _duration(row.ttl_left_s))
    out.print(table)
    for row in rows:
        if row.detail:
            out.print(f"{escape(row.name)}: {escape(row.detail)}")


def _print_teardowns(reports: list[Teardown], as_json: bool) -> None:
    out = Console(highlight=False)
    if as_json:
        out.print_json(json.dumps([r.to_json() for r in reports]))
    for report in reports:
        if report.clean and not as_json:
            out.print(report.summary())
    problems = [r.summary() for r in reports if not r.clean]
    if problems:
        raise SortieError("; ".join(problems))


@app.command()
@click.argument("name", required=False)
@click.option("--all", "all_sorties", is_flag=True,
              help="Tear down every sortie but kept buckets (name those one by one).")
@backend_url_option
@json_option
def down(name: str | None, all_sorties: bool, backend_url: str | None, as_json: bool) -> None:
    """Tear NAME down and prove it: "0 resources remain", or each leftover and how to remove it.

    Local: every process stopped, nothing listening. Cloud: destroy, then a refresh shows no
    resource and a sweep of the cloud by the sortie tags finds none; only then is the stack
    removed. A kept bucket (state "kept") is removed only when named."""
    if all_sorties == (name is not None):
        raise UsageError("name one NAME or pass --all")
    home = _home()
    if name is not None:
        targets = [registry.find(home, name)]  # an unknown or invalid NAME stops here
    else:
        targets = [seen for seen in registry.survey(home) if seen.row.state != "kept"
                   and seen.kind != "elsewhere"]
    if not targets:
        Console(highlight=False).print("no sorties")
        return
    access = registry.CloudAccess(backend_url)
    _print_teardowns([registry.teardown(home, seen, access) for seen in targets], as_json)


@app.command()
@click.option("--dry-run", is_flag=True, help="List what would be adopted; change nothing.")
@click.option("--hang-timeout", type=Duration(), default="30m", show_default=True,
              help="A job whose log and metrics have not grown for this long is hung: it is "
                   "stopped, collected and torn down.")
@backend_url_option
@json_option
def reap(dry_run: bool, hang_timeout: float, backend_url: str | None, as_json: bool) -> None:
    """End the sorties whose controller is gone, without losing their run.

    An orphaned sortie still training is left running (a cloud TTL bounds its cost; `sortie
    watch` takes it over). Once its job has ended or hung, or its nodes are gone (past a cloud
    TTL), reap collects and verifies its artifacts into the run's directory (or keeps the
    bucket and says where) and tears it down with proof. Besides this controller's sorties it
    looks in the state backend (--backend-url, or this controller's own) for those of others.
    Kept buckets and held clusters are never touched. Safe to run from cron (e.g. every 10
    minutes): it prints nothing when there is nothing to do; exit 1 if any sortie failed."""
    from sortie.reap import reap as reap_all

    done = reap_all(_home(), registry.CloudAccess(backend_url), dry_run, hang_timeout)
    out = Console(highlight=False)
    if as_json:
        out.print_json(json.dumps([item.to_json() for item in done]))
    else:
        for item in done:
            out.print(escape(item.line), soft_wrap=True)
    failed = [item.name for item in done if not item.ok]
    if failed:
        raise SortieError(f"reap could not end {', '.join(failed)} (see above)")


@app.command()
@click.argument("name")
@click.option("--max-recoveries", type=click.IntRange(min=0), default=2, show_default=True,
              help="Times a lost node is replaced and training resumed before giving up.")
@click.option("--max-artifacts", "max_artifact_bytes", type=ByteSize(), default="50G",
              show_default=True, help="Most bytes collected from the nodes and the bucket.")
@json_option
def watch(name: str, max_recoveries: int, max_artifact_bytes: int, as_json: bool) -> None:
    """Take over sortie NAME from a controller that is gone (the laptop went to sleep, the
    terminal closed): stream its logs, wait for the job, recover lost nodes, collect and verify
    the artifacts into the run's directory, tear down. Exits as `sortie run` would have."""
    home = _home()
    seen = registry.find(home, name)
    if seen.row.state not in ("orphaned", "expired"):
        raise UsageError(f"NAME: sortie {name!r} is {seen.row.state}: only a sortie whose "
                         "controller is gone can be taken over")
    backend = registry.backend_for(home, seen)
    progress, out = _consoles(as_json)
    from sortie.lifecycle import watch_sortie

    result = watch_sortie(backend, name, RichReporter(progress),
                          RunRequest(max_recoveries=max_recoveries,
                                     max_artifact_bytes=max_artifact_bytes))
    _finish_run(result, out, as_json)


@app.command()
@click.option("--stack", "-s", "stack", required=True, metavar="PROFILE",
              help="Stack profile: stacks/Pulumi.<PROFILE>.yaml, e.g. aws-p4d.")
@click.option("--set", "overrides", multiple=True, metavar="KEY=VALUE",
              help="Override a profile setting for this plan, e.g. --set nodes=16. Repeatable.")
@json_option
def plan(stack: str, overrides: tuple[str, ...], as_json: bool) -> None:
    """Show what a stack profile will create and cost, offline.

    Runs the real Pulumi program under Pulumi's mock runtime: no cloud credentials and no
    Pulumi CLI are needed, and nothing is created. Prints the resources as a tree, a security
    summary and the estimated cost per hour and for the TTL, on-demand and spot."""
    from stacks.plan import make_plan, render  # the cloud SDKs load only for plans

    progress, out = _consoles(as_json)
    with progress.status(f"Evaluating profile {stack} offline ..."):
        result = make_plan(stack, overrides)
    if as_json:
        out.print_json(json.dumps(result.to_json()))
    else:
        render(out, result)


def _cluster_inventory(name: str | None) -> tuple[Inventory, Path]:
    """(inventory, known_hosts) of a local cluster or a cloud sortie; NAME may be omitted when
    exactly one is running."""
    home = _home()
    if name is None:
        running = [seen for seen in registry.survey(home) if seen.kind != "kept"]
        if len(running) != 1:
            names = ", ".join(seen.row.name for seen in running)
            raise UsageError("NAME: " + ("no sortie is running" if not running else
                             f"several sorties run ({names}); name one"))
        seen, name = running[0], running[0].row.name
    else:
        seen = registry.find(home, name)
    parent = home / ("clusters" if seen.kind == "local" else "stacks")
    state = naming.state_dir(parent, name)
    if seen.kind == "kept" or not (state / INVENTORY_FILE).is_file():
        raise UsageError(f"NAME: sortie {name!r} has no nodes (see `sortie status`)")
    return Inventory.load(state / INVENTORY_FILE), state / "known_hosts"


def _node(inventory: Inventory, node: str) -> Node:
    try:
        return inventory.node(node)
    except KeyError as exc:
        raise UsageError(f"NODE: {exc.args[0]}") from None


@app.command(context_settings={"ignore_unknown_options": True})
@click.argument("words", nargs=-1, required=True, metavar="[NAME] NODE [-- COMMAND...]")
def ssh(words: tuple[str, ...]) -> None:
    """Open an SSH session to NODE (e.g. node-0) of sortie NAME, pinned to its host key.

    NAME may be left out when one sortie runs. With COMMAND, run it there instead of a shell:
    `sortie ssh exp-7 node-1 -- ls -la`."""
    # click takes `--` itself; a first word like node-1 is a NODE, anything else is a NAME.
    if NODE_NAME.fullmatch(words[0]):
        name, node, command = None, words[0], words[1:]
    elif len(words) >= 2:
        name, node, command = words[0], words[1], words[2:]
    else:
        raise UsageError("NODE: missing; e.g. `sortie ssh NAME node-0`")
    inventory, known_hosts = _cluster_inventory(name)
    target = _node(inventory, node)
    argv = ["ssh", "-i", str(target.key_path), "-p", str(target.port),
            "-o", f"UserKnownHostsFile={known_hosts}",
            "-o", "StrictHostKeyChecking=yes", "-o", "IdentitiesOnly=yes",
            "-o", "LogLevel=ERROR", f"{target.user}@{target.address}", *command]
    sys.stdout.flush()
    os.execvp("ssh", argv)


@app.command()
@click.argument("name")
@click.argument("node", required=False)
@click.option("--runs-dir", type=click.Path(file_okay=False, path_type=Path), default="runs",
              show_default=True, help="Where runs/<id>/ was written.")
def logs(name: str, node: str | None, runs_dir: Path) -> None:
    """Print the torchrun logs of sortie NAME (every node, or NODE): live from the nodes while
    it runs, from RUNS_DIR/NAME/logs/ once it was collected."""
    naming.check_name(name, "NAME")
    try:
        running = registry.find(_home(), name).kind in ("local", "cloud")
    except UsageError:  # no such sortie here: its logs may have been collected
        running = False
    if running:
        from bootstrap import ssh as node_ssh
        from bootstrap.train import read_log

        inventory, _ = _cluster_inventory(name)
        for target in [_node(inventory, node)] if node else inventory.nodes:
            conn = node_ssh.connect(target)
            try:
                text = read_log(conn, target, name)
            finally:
                conn.close()
            _print_log(target.name, text)
        return
    directory = runs_dir / name / "logs"
    files = [directory / f"{node}.log"] if node else sorted(directory.glob("*.log"))
    files = [f for f in files if f.is_file()]
    if not files:
        raise UsageError(f"NAME: no running sortie named {name!r} and no logs in {directory}")
    for path in files:
        _print_log(path.stem, path.read_text())


def _print_log(node: str, text: str) -> None:
    for line in text.splitlines():
        print(f"{node} | {line}")


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
