"""The ``sortie`` command line.

Exit codes: 0 success, 1 a failure (training or teardown), 2 bad input (nothing was started),
130 interrupted by Ctrl-C, 143 stopped by SIGTERM. Errors are one line on stderr.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import click
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from stacks.errors import SortieError, UsageError
from stacks.inventory import Inventory
from stacks.lifecycle import RunRequest, RunResult, check_run_id, new_run_id, run_sortie
from stacks.local import INVENTORY_FILE, LocalBackend

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
        raise UsageError(f"--cloud {cloud}: cloud sorties are not available yet; only --cloud "
                         "local runs in this version (`sortie plan --stack PROFILE` shows what "
                         "a cloud profile would create)")


nodes_option = click.option("--nodes", "-n", type=click.IntRange(1, 254), default=2,
                            show_default=True, help="Number of nodes.")
cloud_option = click.option("--cloud", type=click.Choice(CLOUDS), default="local",
                            show_default=True, help="Where the cluster runs.")
json_option = click.option("--json", "as_json", is_flag=True,
                           help="Print one JSON document on stdout (progress goes to stderr).")
name_option = click.option("--name", help="Cluster / run id (lowercase letters, digits, "
                           "dashes). Default: a timestamp.")


@app.command()
@nodes_option
@click.option("--procs-per-node", "-p", type=click.IntRange(1, 64), default=2, show_default=True,
              help="Trainer processes per node.")
@click.option("--steps", type=click.IntRange(min=1), default=60, show_default=True,
              help="Training steps.")
@cloud_option
@name_option
@click.option("--runs-dir", type=click.Path(file_okay=False, path_type=Path), default="runs",
              show_default=True, help="Where runs/<id>/ is written.")
@click.option("--ckpt-every", type=click.IntRange(min=1), default=20, show_default=True,
              help="Steps between checkpoints: the most a lost node can cost.")
@click.option("--max-recoveries", type=click.IntRange(min=0), default=2, show_default=True,
              help="Times a lost node is replaced and training resumed before giving up.")
@json_option
@click.argument("trainer_args", nargs=-1, metavar="[-- TRAINER_ARGS...]")
def run(nodes: int, procs_per_node: int, steps: int, cloud: str, name: str | None,
        runs_dir: Path, ckpt_every: int, max_recoveries: int, as_json: bool,
        trainer_args: tuple[str, ...]) -> None:
    """Run a whole sortie: up -> bootstrap -> train -> collect -> down.

    Launch is all or nothing. A node lost mid-run (machine gone, SSH dead, preempted) is
    replaced and training resumes from the last checkpoint, up to --max-recoveries times.
    Teardown always runs: after success, failure, Ctrl-C or SIGTERM. Artifacts (metrics,
    checkpoint, per-node logs) land in RUNS_DIR/<id>/ and are verified before teardown.
    Flags after `--` go to the trainer.
    """
    _require_local(cloud)
    progress, out = _consoles(as_json)
    request = RunRequest(nodes=nodes, procs_per_node=procs_per_node, steps=steps,
                         trainer_args=trainer_args, run_id=name, runs_dir=runs_dir,
                         ckpt_every=ckpt_every, max_recoveries=max_recoveries)
    result = run_sortie(request, RichReporter(progress))
    if as_json:
        out.print_json(json.dumps(result.to_json()))
    else:
        _print_summary(out, result)
    if result.teardown and not result.teardown.clean:
        raise SortieError(result.teardown.summary())
    if result.recovery_error:
        raise SortieError(f"{result.recovery_error}; logs in {result.artifacts / 'logs'}")
    preempted = result.artifacts / "preempted.json"
    if not result.trained and preempted.is_file():
        marker = json.loads(preempted.read_text())
        raise SortieError(f"training was preempted ({marker['reason']}) at step "
                          f"{marker['step']}; its checkpoint is in {result.artifacts}")
    if not result.trained:
        failed = ", ".join(f"{node} (exit {code if code is not None else 'unknown'})"
                           for node, code in result.exit_codes.items() if code != 0)
        raise SortieError(f"training failed on {failed}; logs in {result.artifacts / 'logs'}")
    if result.collect_error:
        raise SortieError(f"training finished but its artifacts are not verified: "
                          f"{result.collect_error}")


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
def up(nodes: int, cloud: str, name: str | None, as_json: bool) -> None:
    """Start a cluster and leave it running (tear it down with `sortie down`)."""
    _require_local(cloud)
    progress, out = _consoles(as_json)
    cluster_id = check_run_id(name) if name else new_run_id()
    with RichReporter(progress).phase(f"Starting {nodes} local nodes"):
        inventory = LocalBackend().up(cluster_id, nodes)
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


@app.command()
@json_option
def status(as_json: bool) -> None:
    """List clusters with their age, nodes and how many are reachable."""
    backend = LocalBackend()
    rows = []
    for cluster_id in backend.cluster_ids():
        try:
            inventory = backend.inventory(cluster_id)
        except SortieError:  # a cluster whose `up` was cut short: `down` still cleans it
            rows.append({"cluster": cluster_id, "backend": "local", "nodes": 0, "nodes_up": 0,
                         "age_s": 0, "state": "broken"})
            continue
        created = (backend.state_dir(cluster_id) / INVENTORY_FILE).stat().st_mtime
        nodes_up = len(backend.listeners(cluster_id))
        rows.append({"cluster": cluster_id, "backend": inventory.backend,
                     "nodes": len(inventory.nodes), "nodes_up": nodes_up,
                     "age_s": round(time.time() - created),
                     "state": "up" if nodes_up == len(inventory.nodes) else "degraded"})
    out = Console(highlight=False)
    if as_json:
        out.print_json(json.dumps(rows))
        return
    if not rows:
        out.print("no clusters")
        return
    table = Table(title="sortie clusters", title_justify="left")
    for column in ("cluster", "backend", "nodes", "up", "age", "state"):
        table.add_column(column)
    for row in rows:
        table.add_row(row["cluster"], row["backend"], str(row["nodes"]), str(row["nodes_up"]),
                      f"{row['age_s'] // 60}m{row['age_s'] % 60:02d}s", row["state"])
    out.print(table)


@app.command()
@click.argument("cluster", required=False)
@click.option("--all", "all_clusters", is_flag=True, help="Tear down every cluster.")
@json_option
def down(cluster: str | None, all_clusters: bool, as_json: bool) -> None:
    """Stop every process of CLUSTER, prove none is left, and remove its state.

    Safe to repeat: a cluster that is already gone is reported as clean."""
    backend = LocalBackend()
    if all_clusters == (cluster is not None):
        raise UsageError("name one CLUSTER or pass --all")
    targets = backend.cluster_ids() if all_clusters else [cluster]
    reports = [backend.down(cluster_id) for cluster_id in targets]
    out = Console(highlight=False)
    if as_json:
        out.print_json(json.dumps([r.to_json() for r in reports]))
    elif not reports:
        out.print("no clusters")
    else:
        for report in reports:
            if report.clean:
                out.print(report.summary())
    problems = [r.summary() for r in reports if not r.clean]
    if problems:
        raise SortieError("; ".join(problems))


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


@app.command()
@click.option("--cluster", help="Cluster id; needed when several clusters run.")
@click.argument("node")
@click.argument("command", nargs=-1)
def ssh(cluster: str | None, node: str, command: tuple[str, ...]) -> None:
    """Open an SSH session to NODE (e.g. node-0), pinned to its host key.

    With COMMAND, run it there instead of a shell; put `--` before a command that has options
    of its own: `sortie ssh node-1 -- ls -la`."""
    backend = LocalBackend()
    if cluster is None:
        ids = backend.cluster_ids()
        if len(ids) != 1:
            raise UsageError("--cluster: " + ("no cluster is running" if not ids else
                             f"several clusters run ({', '.join(ids)}); name one"))
        cluster = ids[0]
    inventory = backend.inventory(cluster)
    try:
        target = inventory.node(node)
    except KeyError as exc:
        raise UsageError(f"NODE: {exc.args[0]}") from None
    argv = ["ssh", "-i", str(target.key_path), "-p", str(target.port),
            "-o", f"UserKnownHostsFile={backend.state_dir(cluster) / 'known_hosts'}",
            "-o", "StrictHostKeyChecking=yes", "-o", "IdentitiesOnly=yes",
            "-o", "LogLevel=ERROR", f"{target.user}@{target.address}", *command]
    sys.stdout.flush()
    os.execvp("ssh", argv)


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
    sys.exit(main())


if __name__ == "__main__":
    entry()
