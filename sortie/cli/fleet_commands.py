"""The commands about the fleet of sorties: `attach` a cluster sortie did not create, `status`
of them all, what they `costs`, `down` (tear down with proof, or detach), `reap` (end the
orphans)."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import click

from sortie.cli import options, render, slurm_options, status_view
from sortie.cli.render import escape
from sortie.cli.reporter import RichReporter
from sortie.core.errors import SortieError, UsageError
from sortie.core.home import sortie_home
from sortie.core.inventory import LoginHost
from sortie.cost.budgets import OWNER, owner_budgets, read_budgets, write_budgets
from sortie.cost.money import usd
from sortie.cost.summary import GROUPINGS, costs
from sortie.fleet import registry
from sortie.fleet.status import status as fleet_status
from sortie.stacks.backend import Teardown
from sortie.stacks.cloud.access import CloudAccess
from sortie.stacks.hosts import login_host, parse_trust
from sortie.stacks.slurm.slurm_sites import SlurmSites


@click.command()
@click.argument("name")
@click.option("--hosts", "hosts_file", type=click.Path(dir_okay=False, path_type=Path),
              help="A hosts file: machines sortie knows nothing about (docs/attach.md).")
@click.option("--outputs", "outputs_file", type=click.Path(dir_okay=False, path_type=Path),
              help="A stack's outputs, saved from `pulumi stack output --json --show-secrets`.")
@click.option("--pulumi-stack", metavar="STACK",
              help="A Pulumi stack of this repository's program (needs the Pulumi CLI).")
@click.option("--cwd", type=click.Path(file_okay=False, path_type=Path), default=Path("."),
              show_default=True, help="The Pulumi project directory of --pulumi-stack.")
@click.option("--trust", multiple=True, metavar="HOST=SHA256:...",
              help="The fingerprint of a host that the hosts file (or --slurm LOGIN) gives no "
                   "key for: its key is read from it and pinned only if it matches. Repeatable.")
@click.option("--min-free-disk", "min_free_bytes", type=options.ByteSize(), default="1G",
              show_default=True, help="Free space each node needs in its workdir.")
@click.option("--slurm", "slurm_login", is_flag=False, flag_value="", default=None,
              metavar="[[USER@]LOGIN[:PORT]]",
              help="A Slurm cluster: `sortie run --slurm NAME` then allocates on it "
                   "(docs/slurm.md). Alone: this machine is its login node; with LOGIN: sortie "
                   "reaches its login node over SSH, the host key pinned from "
                   "~/.ssh/known_hosts or --trust LOGIN=SHA256:...")
@click.option("--identity", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="With --slurm LOGIN: the private key to log in with (default: ssh's "
                   "default keys).")
@click.option("--shared-dir", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="With --slurm: where sorties work, on the file system the login node "
                   "shares with every compute node. Default: your home.")
@click.option("--python", "node_python", default="python3", show_default=True,
              help="With --slurm: the nodes' Python that has torch (a venv's, on the shared "
                   "file system).")
@click.option("--usd-per-gpu-hour", "gpu_hour_prices", multiple=True,
              metavar="PARTITION=USD", help="With --slurm: what a GPU-hour costs on a "
              "partition (`default`: the default one), for the cost ledger, budgets and "
              "status. Default: $0, said at launch. Repeatable.")
@options.as_json
def attach(name: str, hosts_file: Path | None, outputs_file: Path | None,
           pulumi_stack: str | None, cwd: Path, trust: tuple[str, ...], min_free_bytes: int,
           slurm_login: str | None, identity: Path | None, shared_dir: Path | None,
           node_python: str, gpu_hour_prices: tuple[str, ...], as_json: bool) -> None:
    """Use a cluster sortie did not create, as NAME: existing machines (--hosts FILE), or the
    nodes of a `pulumi up` stack (--pulumi-stack STACK, or --outputs FILE).

    Every host key is pinned (from the file or the stack; never trusted on first use). Every
    node is checked first: SSH, python and torch, GPUs (the same on every node), free disk,
    and that every node reaches the head's rendezvous port. Only a cluster that passes is
    attached. Then `sortie exec NAME` and `sortie run --on NAME` run jobs on it, and `sortie
    down NAME` detaches: sortie's processes and files leave the nodes, the machines keep
    running. sortie never destroys an attached cluster (but `down --destroy-stack`).

    With --slurm: a Slurm cluster for `sortie run --slurm NAME`, whose login node is this
    machine, or LOGIN reached over SSH (its host key pinned); Slurm's client commands must
    answer there."""
    if slurm_login is not None:
        other = hosts_file or outputs_file or pulumi_stack
        if other:
            raise UsageError("--slurm: a Slurm cluster is reached through its login node; "
                             "--hosts, --outputs and --pulumi-stack do not apply")
        if (trust or identity) and not slurm_login:
            raise UsageError("--trust, --identity: apply to --slurm LOGIN (over SSH)")
        login = login_host(slurm_login, identity, parse_trust(trust)) if slurm_login else None
        _attach_slurm(name, shared_dir, node_python, gpu_hour_prices, login, as_json)
        return
    if shared_dir is not None or node_python != "python3" or gpu_hour_prices or identity:
        raise UsageError("--shared-dir, --python, --usd-per-gpu-hour, --identity: apply with "
                         "--slurm")
    given = [flag for flag, value in (("--hosts", hosts_file), ("--outputs", outputs_file),
                                      ("--pulumi-stack", pulumi_stack)) if value]
    if len(given) != 1:
        raise UsageError("give one of --hosts FILE, --outputs FILE, --pulumi-stack STACK")
    if trust and hosts_file is None:
        raise UsageError("--trust: applies to --hosts (a stack's outputs carry its host keys)")
    # Here, not at the top: attaching loads SSH, which `status` and `costs` beside it need not.
    from sortie.fleet import attach_cluster as attaching

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


def _attach_slurm(name: str, shared_dir: Path | None, python: str, prices: tuple[str, ...],
                  login: LoginHost | None, as_json: bool) -> None:
    sites = SlurmSites(sortie_home())
    if name not in sites.names():  # (attached again, its record is replaced)
        registry.refuse_taken(sites.home, name, "NAME")
    site = sites.attach(name, str(shared_dir) if shared_dir else None, python,
                        slurm_options.partition_prices(prices), login)
    out = render.console()
    if as_json:
        render.print_json(out, site)
    else:
        where = f" through {login.user}@{login.address}" if login else ""
        out.print(f"attached Slurm cluster {name}{where} (sorties work in {site.shared_dir}): "
                  f"`sortie run --slurm {name} --partition P --nodes N` allocates on it")


@click.command()
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
        status_view.status_table(out, fleet)


@click.command(name="costs")
@click.option("--since", "since_s", type=options.Duration(), default="30d", show_default=True,
              help="Sorties that ended within this long (90m, 12h, 30d).")
@click.option("--by", type=click.Choice(GROUPINGS), default="owner", show_default=True,
              help="Totals by this.")
@click.option("--csv", "as_csv", is_flag=True, help="One CSV line per sortie on stdout.")
@options.backend_url_option(
    "Also a shared Pulumi state backend's ledger: every controller's cloud sorties there.")
@options.as_json
def costs_(since_s: float, by: str, as_csv: bool, backend_url: str | None,
           as_json: bool) -> None:
    """What each sortie and held cluster cost, from launch to teardown at its launch terms
    (nodes x $/h of the catalog's list prices: estimates, not a bill), with totals by owner,
    profile, backend or day. Read from this controller's ledger ($SORTIE_HOME/costs/) and, with
    --backend-url, a shared state backend's."""
    report = costs(sortie_home(), since_s, by, backend_url)
    out = render.console()
    if as_json:
        render.print_json(out, report)
    elif as_csv:
        render.costs_csv(report)
    else:
        render.costs_table(out, report)


@click.group()
def budget() -> None:
    """Monthly budgets by owner: a launch that could pass what is left of its owner's budget this
    month (its --max-cost, else its $/h for the whole TTL) is refused before it starts; `sortie
    status` shows what is left. With --backend-url, in a shared state backend, for every
    controller launching there."""


@budget.command(name="set")
@click.argument("owner")
@click.option("--monthly", "monthly_usd", type=options.Money(0, 1e9), required=True,
              metavar="USD", help="Dollars a calendar month (UTC).")
@options.backend_url
def budget_set(owner: str, monthly_usd: float, backend_url: str | None) -> None:
    """Set OWNER's monthly budget (a profile's `owner`; locally, the user)."""
    if not re.fullmatch(OWNER, owner):
        raise UsageError("OWNER: 1 to 100 letters, digits and . _ @ + -")
    budgets = read_budgets(sortie_home(), backend_url)
    budgets.monthly_usd[owner] = monthly_usd  # (a damaged entry of the file is left out)
    write_budgets(sortie_home(), budgets, backend_url)
    click.echo(f"{owner}: {usd(monthly_usd)} a month")


@budget.command(name="unset")
@click.argument("owner")
@options.backend_url
def budget_unset(owner: str, backend_url: str | None) -> None:
    """Remove OWNER's monthly budget."""
    budgets = read_budgets(sortie_home(), backend_url)
    was = budgets.monthly_usd.pop(owner, None)
    if was is None and owner not in budgets.damaged:
        raise UsageError(f"OWNER: {owner!r} has no budget")
    write_budgets(sortie_home(), budgets, backend_url)
    # (before: nothing was said, and a script could not tell it from a no-op)
    click.echo(f"{owner}: budget removed" + (f" (was {usd(was)} a month)" if was else ""))


@budget.command(name="list")
@options.backend_url
@options.as_json
def budget_list(backend_url: str | None, as_json: bool) -> None:
    """Each owner's monthly budget, spent this month (ended sorties and running ones), left."""
    home = sortie_home()
    rows = [row for row in fleet_status(home, CloudAccess(backend_url)).sorties]
    budgets = read_budgets(home, backend_url)
    found = owner_budgets(home, [row.spend for row in rows], backend_url, budgets)
    out = render.console()
    if as_json:
        render.print_json(out, {"budgets": found, "damaged": budgets.damaged})
        return
    for why in budgets.damaged.values():
        render.warn(out, f"{why}: skipped (`sortie budget set` writes it anew)")
    for line in found:
        out.print(f"{escape(line.owner)}: {usd(line.spent_usd)} of {usd(line.monthly_usd)} "
                  f"spent this month, {usd(line.left_usd)} left")
    if not found:
        out.print("no budgets (`sortie budget set OWNER --monthly USD`)")


def _confirm(what: str, question: str, refused: str) -> None:
    """Asked on a terminal (default no); without one, refused: `--yes` says it instead."""
    if sys.stdin is None or sys.stdin.closed or not sys.stdin.isatty():
        raise UsageError(f"{what}: add --yes to confirm (no terminal to ask on)")
    if not click.confirm(question, default=False, err=True):
        raise UsageError(refused)


@click.command()
@click.argument("name", required=False)
@click.option("--all", "all_sorties", is_flag=True,
              help="Tear down every sortie but kept buckets (name those one by one), after "
                   "listing them and asking (--yes: without asking).")
@click.option("--destroy-stack", is_flag=True,
              help="For a cluster attached from a Pulumi stack: detach, then destroy the stack, "
                   "with the same proof as a sortie's teardown (the stack's config stays).")
@click.option("--forget", is_flag=True,
              help="For an attached cluster whose nodes are gone: forget it without reaching "
                   "them (the sortie directory on each may remain; the message lists them).")
@click.option("--yes", "-y", is_flag=True,
              help="Without asking (--all and --destroy-stack ask first on a terminal, and "
                   "need --yes anywhere else).")
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
        if isinstance(forgotten, Teardown):  # an attached Slurm cluster: only its record
            reports = [forgotten]
        elif as_json:
            render.print_json(out, forgotten)
            return
        else:
            out.print(escape(forgotten.summary()), soft_wrap=True)
            return
    elif destroy_stack:
        if name is None:
            raise UsageError("--destroy-stack: name the attached cluster")
        if not yes:  # the whole stack is the user's: never destroyed on one flag by accident
            _confirm(f"--destroy-stack destroys every resource of {name}'s Pulumi stack",
                     f"Destroy every resource of the Pulumi stack attached as {name}?",
                     "--destroy-stack: not confirmed; nothing was destroyed")
        reports = registry.destroy_attached_stack(home, name, access)
    else:
        targets = registry.to_tear_down(home, name)
        if not targets:
            out.print("no sorties")
            return
        if all_sorties and not yes:  # every sortie in the home, some perhaps a colleague's
            names = ", ".join(seen.row.name for seen in targets)
            count = f"{len(targets)} sortie{'s' * (len(targets) != 1)}"
            _confirm(f"--all ends {count}: {names}", f"End {count}: {names}?",
                     "--all: not confirmed; nothing was ended")
        reports = [registry.teardown(home, seen, access) for seen in targets]
    render.teardowns(out, reports, as_json)
    problems = [r.summary() for r in reports if not r.clean]
    if problems:
        raise SortieError("; ".join(problems))


@click.command()
@click.option("--dry-run", is_flag=True, help="List what would be adopted; change nothing.")
@click.option("--hang-timeout", type=options.Duration(), default="30m", show_default=True,
              help="A job with no new log line or metric on any node for this long is hung "
                   "(as `run --hang-timeout` reads it): reap stops it, collects it and tears "
                   "it down, where `run` would replace the silent node.")
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
