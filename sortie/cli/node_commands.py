"""The commands that look inside a sortie: `ssh` to a node (pinned host key), `check` its health,
its `logs`, a run's `report`, its `hosts` file for another home to attach."""

from __future__ import annotations

import os
import sys
import threading
from pathlib import Path
from typing import get_args

import click

from sortie.bootstrap.choices import HealthLevel
from sortie.bootstrap.follow import shown_lines
from sortie.cli import options, render
from sortie.cli.render import escape
from sortie.core import naming, statefile
from sortie.core.errors import SortieError, UsageError
from sortie.core.home import sortie_home
from sortie.fleet import node_access, registry
from sortie.fleet.cluster_health import check_cluster
from sortie.rundir import history
from sortie.rundir.run_file import RUN_FILE


@click.command(cls=options.WordsCommand, options_metavar="",
               context_settings={"help_option_names": ["-h", "--help"]})
@click.argument("words", nargs=-1, metavar="[NAME] [NODE] [SSH OPTIONS] [-- COMMAND...]")
def ssh(words: tuple[str, ...]) -> None:
    """Open an SSH session to NODE (default: node-0, the head) of sortie NAME, pinned to its
    host key, in the job's directory with the job's environment (SORTIE_NODE_RANK,
    MASTER_ADDR, ..., its own Python); a Slurm allocation's node: `srun --pty` into it.

    NAME may be left out when one sortie runs. ssh's options that forward ports or shape the
    session pass through: `sortie ssh dev -L 6006:localhost:6006 -N` (TensorBoard on
    localhost:6006). Those that would bypass the pinned key, the cluster's key or user are
    refused (-o, -F, -J, -i, -l, -p, -S, -M), as are -A (agent forwarding) and -Y. With
    COMMAND, run it there instead of a shell: `sortie ssh exp-7 node-1 -- ls -la`.
    `sortie ssh-config NAME` lets ssh, scp, rsync and editors reach the nodes themselves."""
    from sortie.fleet import ssh_access

    asked = ssh_access.read_words(click.get_current_context().meta["words"])
    inventory, known_hosts = node_access.running_nodes(sortie_home(), asked.name)
    argv = ssh_access.ssh_command(inventory, known_hosts, asked)
    sys.stdout.flush()
    os.execvp(argv[0], argv)


@click.command(name="ssh-config")
@click.argument("name")
@click.option("--write", "action", flag_value="write",
              help="Keep them in ~/.ssh/config, in a block marked with NAME (replaced whole "
                   "on each --write), first in the file.")
@click.option("--remove", "action", flag_value="remove",
              help="Remove NAME's block from ~/.ssh/config (after `sortie down`).")
@click.option("--config", "config_file", type=click.Path(dir_okay=False, path_type=Path),
              default=None, help="Another ssh config file than ~/.ssh/config.")
def ssh_config(name: str, action: str | None, config_file: Path | None) -> None:
    """Print OpenSSH `Host NAME-node-0 ...` entries for cluster NAME's nodes (a Slurm site:
    NAME-login), each trusting only the node's pinned host key, kept in the cluster's own
    known_hosts file (never `StrictHostKeyChecking no`): then `ssh NAME-node-0`, `scp`,
    `rsync -e ssh` and editors' remote plugins (VS Code Remote-SSH) reach the nodes."""
    from sortie.fleet import ssh_access

    config = config_file or Path.home() / ".ssh" / "config"
    if action == "remove":
        ssh_access.write_entries(config, naming.check_name(name, "NAME"), None)
        click.echo(f"removed {name}'s entries from {config}")
        return
    inventory, known_hosts = node_access.running_nodes(sortie_home(), name)
    entries = ssh_access.host_entries(name, inventory, known_hosts)
    if action != "write":
        sys.stdout.write(entries)
        return
    ssh_access.write_entries(config, name, entries)
    hosts = [line.split()[1] for line in entries.splitlines() if line.startswith("Host ")]
    click.echo(f"wrote {len(hosts)} entr{'y' if len(hosts) == 1 else 'ies'} to {config}: "
               f"`ssh {hosts[0]}` reaches {'it' if len(hosts) == 1 else 'the first'}; "
               f"`sortie ssh-config {name} --remove` takes them out")


@click.command()
@click.argument("name")
@click.option("--health", "level", type=click.Choice(("quick", "full")), default="quick",
              show_default=True, help="quick: nvidia-smi, XIDs, `dcgmi diag -r 1`, EFA/IB "
              "counters, and each link of a ring of the nodes over TCP (speed and loss); full: "
              "`dcgmi diag -r 2`, an all-reduce with the job's backend and large messages, "
              "held to the catalog's bandwidth for the instance type.")
@options.as_json
def check(name: str, level: HealthLevel, as_json: bool) -> None:
    """Check cluster NAME (held with `sortie up`, or attached) the way every `run` and `exec`
    does before training: each node's GPUs and interconnect, then the network across the
    nodes, naming a slow or lossy node (its links under half its neighbours', or losing over
    0.5 % of what they carry, every time it is measured). Exit 0 when every node is healthy, 1
    when one is not; nothing on the cluster is changed."""
    progress, out = render.consoles(as_json)
    with progress.status(f"checking {name} ({level})"):
        report = check_cluster(sortie_home(), name, level)
    if as_json:
        render.print_json(out, report)
    else:
        render.health_table(out, report)
    if not report.ok:
        raise SortieError(report.summary())


@click.command()
@click.argument("name")
@click.argument("node", required=False)
@click.option("--follow", "-f", is_flag=True,
              help="Keep printing as the job writes, until it ends on every node (like "
                   "`tail -f`); Ctrl-C stops following, never the job.")
@options.runs_dir
def logs(name: str, node: str | None, follow: bool, runs_dir: Path) -> None:
    """Print the torchrun logs of sortie NAME (every node, or NODE): live from the nodes while
    it runs (a snapshot, or with -f until the job ends), from RUNS_DIR/NAME/logs/ once it was
    collected (NAME a run id: from its directory in the run history, from any directory)."""
    lock = threading.Lock()

    def line_out(node_name: str, line: str) -> None:
        with lock:
            print(f"{node_name} | {render.terminal_safe(line)}", flush=True)

    if follow and node_access.follow(sortie_home(), name, node, line_out):
        return
    runs_dir = history.runs_dir_of(sortie_home(), name, runs_dir)
    printed, running, silent, read = False, [], [], False
    for log in node_access.logs(sortie_home(), name, node, runs_dir):
        read = True
        for line in shown_lines(log.text):
            line_out(log.node, line)
            printed = True
        running += [log.node] if log.running else []
        silent += [] if log.answered else [log.node]
    if running:
        click.echo(f"{name}: the job still runs on {', '.join(running)} (`sortie logs {name} "
                   "-f` follows it)", err=True)
    live = node_access.live_run(sortie_home(), name) if not printed else None
    if live and live[1] != name and not read:  # its nodes are gone (an allocation ended)
        collected = history.runs_dir_of(sortie_home(), live[1], runs_dir)
        kept = [log for log in node_access.collected_logs(collected, live[1], node) if log.text]
        if kept:
            click.echo(f"{name}: its nodes show no log now; run {live[1]}'s, as collected "
                       f"into {collected / live[1] / 'logs'}:", err=True)
        for log in kept:
            for line in shown_lines(log.text):
                line_out(log.node, line)
                printed = True
    if not printed:  # a held cluster no job has run on yet, or a job that wrote nothing
        where = f" on {node}" if node else ""
        run = live[1] if live else name
        click.echo(f"{name}: its newest job, run {run}, has written no log{where}" if run != name
                   else f"{name}: no logs yet (no job has written any{where})", err=True)
    if silent:  # a script reading the logs must not take a node it never reached for a quiet one
        raise click.exceptions.Exit(1)


@click.command()
@click.argument("run")
@click.option("--open", "open_it", is_flag=True,
              help="Also open it in this machine's browser (where there is one).")
@options.runs_dir
@options.as_json
def report(run: str, open_it: bool, runs_dir: Path, as_json: bool) -> None:
    """Write the report of run RUN (a run id: in RUNS_DIR, else from the run history; or a
    run directory) to
    RUN/report.html and print its path.

    The report is one HTML file that needs no network: the outcome, a timeline of the phases
    (launch retries and recoveries marked), every numeric metric against step (checkpoint saves
    marked), each node's Python, torch, GPUs and exit code (and its log's tail if it failed),
    the estimated cost, the teardown proof, and the artifacts with their SHA-256. Every sortie
    writes one when it ends; this renders it again, or for a run from before reports."""
    from sortie.rundir import report as run_report

    run_dir = history.run_directory(sortie_home(), run, runs_dir, RUN_FILE)
    path = run_report.write_report(run_dir)
    opened = open_it and run_report.open_in_browser(path)
    if as_json:
        render.print_json(render.consoles(True)[1], {"report": str(path), "opened": opened})
        return
    print(path)
    if open_it and not opened:
        print(f"no browser here: copy {path} to a machine with one", file=sys.stderr)


@click.command()
@click.argument("name")
@click.option("--output", "-o", type=click.Path(dir_okay=False, path_type=Path),
              default=None, help="Write it to this file (never over one that exists); "
                                 "default: standard output.")
def hosts(name: str, output: Path | None) -> None:
    """Write a hosts file for cluster NAME, every host key pinned: what `sortie attach
    OTHER --hosts FILE` takes to use the same machines from another home (a team's). Each
    node's login key is named by its path: it must be readable where the file is used."""
    import datetime

    from sortie.stacks.hosts import hosts_for, hosts_yaml

    _, inventory = registry.held_cluster(sortie_home(), name)
    text = hosts_yaml(hosts_for(inventory), name,
                      f"written by `sortie hosts {name}` on {datetime.date.today()}")
    if output is None:
        sys.stdout.write(text)
        return
    try:
        statefile.write_new(output, text)
    except FileExistsError:
        raise UsageError(f"--output {output}: exists; sortie writes only a new file") from None
    except OSError as exc:
        raise UsageError(f"--output {output}: {exc.strerror}") from None
    render.console().print(f"wrote {escape(str(output))}: `sortie attach NAME --hosts "
                           f"{escape(str(output))}` uses these machines", highlight=False,
                           soft_wrap=True)


@click.command()
@click.option("--cluster", metavar="NAME", help="Only the runs on cluster NAME.")
@click.option("--state", type=click.Choice((*get_args(history.State), "controller gone")),
              help="Only the runs in this state.")
@click.option("--last", type=click.IntRange(1, None), default=None, metavar="N",
              help="Only the newest N.")
@options.as_json
def runs(cluster: str | None, state: str | None, last: int | None, as_json: bool) -> None:
    """List every run and exec this controller started, from any directory: its id, cluster,
    state, start, duration, cost at the launch terms, what ran and where its directory is
    (`sortie logs RUN`, `sortie report RUN` and `sortie run RUN` find it by id).

    A run still `running` whose controller is gone says `controller gone` (`sortie watch` or
    `sortie reap` takes it over)."""
    from sortie.cli.runs_view import show_runs

    entries = history.select(history.read_history(sortie_home()), cluster, state)
    show_runs([(entry, entry.shown_state()) for entry in entries[-last if last else 0:]],
              as_json)
