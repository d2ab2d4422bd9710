"""How the command line shows things: phases with a spinner and their times, node output with a
node prefix, and the tables of a run, a cluster, the sorties and teardowns."""

from __future__ import annotations

import csv
import datetime
import json
import os
import re
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pydantic_core
from rich.console import Console
from rich.markup import escape as markup_escape
from rich.table import Table
from rich.text import Text

from sortie.core.inventory import Inventory
from sortie.core.sizes import counted, readable_bytes
from sortie.cost.launch_cost import LaunchCost
from sortie.cost.money import usd, usd_per_hour
from sortie.cost.summary import Costs
from sortie.infra.offers import CATALOG_MAX_AGE_DAYS, Offer
from sortie.rundir.result import RunResult
from sortie.stacks.backend import Teardown

if TYPE_CHECKING:  # a type hint only (the gate loads SSH: `status` need not)
    from sortie.bootstrap.health_report import HealthReport
    from sortie.bootstrap.preflight import Preflight
    from sortie.cost.price import Pricing
    from sortie.engine.detach import DetachedRun
    from sortie.engine.dry_run import DryRun

# Escape sequences (CSI such as "\x1b[2J", OSC such as a clipboard write "\x1b]52;...\x07",
# and the rest) and every other control character but tab.
_ESCAPES = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(\x07|\x1b\\)?|\x1b[@-_]?"
                      r"|[\x00-\x08\x0b-\x1f\x7f-\x9f]"
                      # bidirectional controls: they reorder what follows ("Trojan Source")
                      "|[\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069]")


def terminal_safe(text: str) -> str:
    """Text a node (or anything outside the controller) wrote, as plain characters for a
    terminal: no escape sequence (a node's log cannot clear the screen or set the clipboard),
    no control character, no lone surrogate (a name that is not UTF-8)."""
    text = _ESCAPES.sub("", text)
    return text.encode("utf-8", "replace").decode("utf-8") if any(
        "\ud800" <= c <= "\udfff" for c in text) else text


def escape(text: str) -> str:
    """Outside text (an owner, a detail) in rich markup: plain characters, markup escaped."""
    return markup_escape(terminal_safe(text))


def plain(text: str | None) -> Text:
    """A table cell or line of outside text: never read as rich markup ("[/]" is not a tag)."""
    return Text(terminal_safe(text or ""))


# A pipe or a file has no width: rich would assume 80 columns and wrap a table's cells a few
# characters a line, or cut a path short. Lines there are as long as their content (up to this).
PIPE_WIDTH = 400


def warn(out: Console, text: str) -> None:
    """A warning line: the mark, then ``text`` as it is (data: no markup, no emoji codes)."""
    out.print(Text.assemble(("!", "yellow"), " ", terminal_safe(text)), soft_wrap=True)


MIN_WIDTH = 20  # columns: below this a table cannot be drawn


def console(stderr: bool = False) -> Console:
    """A console for stdout (or stderr): a terminal's width, a pipe's lines unwrapped
    (`$COLUMNS`, when set, wins, as rich reads it)."""
    columns = os.environ.get("COLUMNS", "")
    usable = columns.isdigit() and MIN_WIDTH <= int(columns) <= PIPE_WIDTH
    # A $COLUMNS of 0 (or 5, or "abc") would print nothing, or one letter a line: ignored.
    # emoji=False: sortie prints data (ARNs, paths, log lines) in which ":secret:" is text.
    made = Console(stderr=stderr, highlight=False, emoji=False,
                   width=None if usable or not columns else PIPE_WIDTH)
    if not made.is_terminal and not usable:
        made.width = PIPE_WIDTH
    return made


def consoles(as_json: bool) -> tuple[Console, Console]:
    """(progress console, result console): with --json, stdout carries only the JSON."""
    out = console()
    return (console(stderr=True) if as_json else out), out


def jsonable(document: object) -> Any:
    """A document as JSON data: pydantic's serialisation of our models and dataclasses
    (aliases, computed fields, exclusions and rounding as each declares them)."""
    return pydantic_core.to_jsonable_python(document, by_alias=True)


def print_json(out: Console, document: object) -> None:
    out.print_json(json.dumps(jsonable(document)))


def detached_run(out: Console, run: DetachedRun, as_json: bool) -> None:
    """`run --detach`: the run queued whole, and how to follow it."""
    if as_json:
        print_json(out, {"run_id": run.run_id, "state": "queued", "job_id": run.job_id,
                         "controller_log": str(run.controller_log)})
        return
    out.print(f"{run.run_id}: queued as Slurm allocation {run.job_id}; its controller runs "
              f"inside it (--detach). `sortie status` follows it, `sortie logs {run.run_id}` "
              f"once it runs; the controller's output: {run.controller_log}", highlight=False)


def run_summary(out: Console, result: RunResult) -> None:
    summary = result.summary or {}
    table = Table(title=f"sortie {result.run_id}", show_header=False, title_justify="left")
    if result.cluster:
        table.add_row("cluster", f"{result.cluster} (left running)")  # held or attached
    table.add_row("nodes", str(result.nodes))
    table.add_row("ranks", str(summary.get("world_size", result.ranks)))
    table.add_row("steps", str(summary.get("steps", result.last_step or "-")))
    if "final_loss" in summary:
        table.add_row("final loss", f"{summary['final_loss']:.5f}")
    if "samples_per_s" in summary:
        table.add_row("samples/s", f"{summary['samples_per_s']:,.0f}")
    table.add_row("wall time", f"{result.wall_s:.1f}s")
    table.add_row("artifacts", f"{result.artifacts} ({len(result.collected)} files, SHA-256 "
                  "verified)" if not result.collect_error else f"{result.artifacts} (NOT "
                  f"verified: {result.collect_error})")
    if kept := result.kept_files():
        table.add_row("your files", escape(kept))
    if result.left_on_nodes:
        table.add_row("not collected", f"{counted(len(result.left_on_nodes), 'file')} your job "
                      "wrote (named above; run.json lists them)")
    if result.loss_sparkline:
        table.add_row("loss", result.loss_sparkline)
    if result.spent_usd is not None:
        table.add_row("spent", f"{usd(result.spent_usd)} at the launch terms")
    if result.health:
        table.add_row("health", plain(result.health.summary()))
    for number, recovery in enumerate(result.recoveries, 1):
        table.add_row(f"recovery {number}", recovery.line())
    if result.teardown:
        table.add_row("teardown", result.teardown.summary())
    for warning in result.warnings:
        table.add_row("warning", plain(warning))
    table.add_row("report", str(result.report) if result.report else
                  f"not written: {result.report_error}")
    out.print(table)
    if result.exit_codes and not result.trained:
        failure_table(out, result)


def dry_run(out: Console, planned: DryRun, as_json: bool) -> None:
    """`run --dry-run`: what the run would do, a line each; nothing was started."""
    if as_json:
        print_json(out, planned.as_dict())
        return
    table = Table(title="dry run: nothing was started", title_justify="left", show_header=False)
    table.add_column(style="bold")
    table.add_column(overflow="fold")
    for what, how in planned.lines:
        table.add_row(Text(f"! {what}", style="yellow") if what in ("note", "warning") else what,
                      plain(how))
    out.print(table)


def failure_table(out: Console, result: RunResult) -> None:
    """Each node's exit code and how its job ended, then the first failing node's last lines."""
    table = Table(title="how the job ended", title_justify="left")
    for column in ("node", "exit code", "state"):
        table.add_column(column)
    states = result.node_states
    for node, code in result.exit_codes.items():
        first = " (first)" if node == result.first_failed and not result.cluster_went else ""
        table.add_row(node, "-" if code is None else str(code), states[node] + first)
    out.print(table)
    if result.failure_tail:
        out.print(f"last {len(result.failure_tail)} lines of {result.first_failed}'s log:")
        for line in result.failure_tail:
            out.print(f"  {escape(line)}", highlight=False)


def launch_cost(progress: Console, cost: LaunchCost | None, notes: tuple[str, ...] = (),
                pricing: Pricing | None = None) -> None:
    """A cloud cluster's estimated cost before anything is launched (local nodes: a notional
    price, if any), and what else to know first (`--gpu`: the places not tried)."""
    if cost is not None:
        progress.print(f"cost before launch: {escape(cost.line())}", soft_wrap=True)
    elif pricing is not None and pricing.usd_per_hour:
        progress.print(f"cost before launch: {usd_per_hour(pricing.usd_per_hour)} "
                       f"({escape(pricing.terms)}), fixed for the cluster's life", soft_wrap=True)
    for note in notes:
        progress.print(f"[yellow]![/] {escape(note)}", soft_wrap=True)


def inventory_table(out: Console, inventory: Inventory) -> None:
    table = Table(title=f"cluster {inventory.cluster_id} ({inventory.backend})",
                  title_justify="left")
    for column in ("node", "address", "user", "gpus", "workdir"):
        table.add_column(column)
    for node in inventory.nodes:
        table.add_row(node.name, f"{node.address}:{node.port}", node.user, str(node.gpus),
                      node.workdir)
    out.print(table)


def preflight_table(out: Console, report: Preflight) -> None:
    """`sortie attach`: what each node's checks found, ✗ and the cause where one failed."""
    table = Table(title=f"preflight of {report.cluster} (rendezvous {report.rendezvous})",
                  title_justify="left")
    for column in ("node", "address", "ssh", "python", "torch", "gpus", "free disk",
                   "reaches head", "problem"):
        table.add_column(column, overflow="fold")

    def mark(ok: bool | None) -> str:
        return "-" if ok is None else "[green]✓[/]" if ok else "[red]✗[/]"

    for row in report.nodes:
        # What a node reported is plain text: a torch version "[/]" is not markup.
        table.add_row(plain(row.node), plain(row.address), mark(row.ssh),
                      plain(row.python or "-"), plain(row.torch or "-"),
                      "-" if row.gpus is None else str(row.gpus),
                      "-" if row.free_bytes is None else readable_bytes(row.free_bytes),
                      mark(row.reaches_head), plain(row.problem))
    out.print(table)


def health_table(out: Console, report: HealthReport) -> None:
    """`sortie check`: each node's row (✗ and why where it is bad), then the bandwidth."""
    table = Table(title=f"health ({report.level}) in {report.seconds:.1f}s", title_justify="left")
    for column in ("node", "ok", "send GB/s", "recv GB/s", "checks", "problem"):
        table.add_column(column, overflow="fold")
    for row in report.nodes:
        bad = report.bad.get(row.node)
        table.add_row(row.node, "[red]✗[/]" if bad else "[green]✓[/]",
                      *("-" if gbs is None else f"{gbs:.3g}" for gbs in (row.send_gbs,
                                                                        row.recv_gbs)),
                      plain(", ".join(f"{k}: {v}" for k, v in row.checks.items()) or "-"),
                      plain(bad or ""))
    out.print(table)
    if report.busbw_gbs is not None:
        expected = (f"; the catalog's {report.expected_busbw_gbs:g} GB/s "
                    f"({report.expected_source})" if report.expected_busbw_gbs else "")
        out.print(f"all-reduce bus bandwidth: {report.busbw_gbs:.3g} GB/s ({report.backend}, "
                  f"{readable_bytes(report.message_bytes)} messages){escape(expected)}")
    for warning in report.warnings:
        out.print(f"warning: {escape(warning)}")


def offers_table(out: Console, found: list[Offer], spot: bool, age_days: int,
                 unbuilt: Sequence[tuple[str, str, str]] = (), why_none: str = "") -> None:
    """`sortie plan --gpu`: cheapest first, at the asked terms; then the machines with that
    GPU that sortie does not build, and why."""
    table = Table(title=f"where it runs, cheapest first ({'spot' if spot else 'on-demand'})",
                  title_justify="left")
    for column in ("cloud", "region", "instance type", "GPUs", "GPU memory", "interconnect",
                   "$/h", "$/h spot", "quotas needed"):
        table.add_column(column, overflow="fold")
    for offer in found:
        estimated = "*" if offer.estimated else ""
        table.add_row(offer.cloud, offer.region, offer.instance_type,
                      f"{offer.gpus_per_node} x {offer.gpu_model}", f"{offer.gpu_memory_gb} GB",
                      offer.interconnect or "TCP", f"{offer.on_demand_usd_h:,.2f}{estimated}",
                      f"{offer.spot_usd_h:,.2f}{estimated}", "; ".join(offer.quotas) or "-")
    out.print(table)
    if not found:
        out.print("nothing in the catalog fits" + (f": {escape(why_none)}" if why_none else ""))
    if any(offer.estimated for offer in found):
        out.print("* this region's own price is not in the catalog: its reference region's")
    dates = sorted({(o.price_date, o.price_source) for o in found})
    for date, source in dates:
        out.print(f"prices of {date}: {escape(source)}")
    if age_days > CATALOG_MAX_AGE_DAYS:
        out.print(f"[yellow]![/] the catalog's prices are {age_days} days old: check them "
                  "before you rely on them")
    for cloud, name, why in unbuilt:
        out.print(f"not built here: {cloud} {name}: {escape(why)}")


def costs_table(out: Console, report: Costs) -> None:
    """`sortie costs`: one row per sortie, then the totals."""
    table = Table(title=f"costs since {report.since} (estimates at launch terms)",
                  title_justify="left")
    for column in ("sortie", "kind", "backend", "profile", "owner", "nodes", "started (UTC)",
                   "ran", "$/h", "$"):
        table.add_column(column)
    for entry in report.entries:
        started = datetime.datetime.fromtimestamp(entry.started, datetime.timezone.utc)
        table.add_row(entry.name, entry.kind, entry.backend, plain(entry.profile or "-"),
                      plain(entry.owner), str(entry.nodes), started.strftime("%Y-%m-%d %H:%M"),
                      duration(entry.ended - entry.started), f"{entry.usd_per_hour:,.2f}",
                      f"{entry.cost:,.2f}")
    out.print(table)
    for key, total in report.totals.items():
        out.print(f"{escape(report.by)} {escape(key)}: {usd(total)}")
    out.print(f"total: {usd(report.total_usd)} ({counted(len(report.entries), 'sortie')})")
    for name in report.unreadable:
        warn(out, f"not a cost line, skipped: {name}")


def costs_csv(report: Costs) -> None:
    """`sortie costs --csv`: one line per sortie, with its cost."""
    writer = csv.writer(sys.stdout)
    fields = ["name", "kind", "backend", "profile", "owner", "nodes", "usd_per_hour", "terms",
              "started", "ended", "cost"]
    writer.writerow(fields)
    def cell(value: object) -> object:  # text a spreadsheet would run as a formula is quoted
        text = "" if value is None else value
        return f"'{text}" if isinstance(text, str) and text[:1] in ("=", "+", "-", "@") else text

    for entry in report.entries:
        writer.writerow([cell(getattr(entry, f)) for f in fields])


def duration(seconds: float | None) -> str:
    """90 -> 1m30s; 5400 -> 1h30m; None -> -."""
    if seconds is None:
        return "-"
    minutes = int(seconds) // 60
    return f"{minutes // 60}h{minutes % 60:02d}m" if minutes >= 60 else \
        f"{minutes}m{int(seconds) % 60:02d}s"


def teardowns(out: Console, reports: list[Teardown], as_json: bool) -> None:
    if as_json:
        print_json(out, reports)
        return
    for report in reports:
        if report.clean:
            out.print(report.summary())


def profiles_table(out: Console, rows: list[Any]) -> None:
    """`sortie profiles`: a line per profile (`stacks.plan.ProfileRow`)."""
    table = Table(title="stack profiles (sortie plan --stack NAME shows one)",
                  title_justify="left")
    for column in ("name", "cloud", "region", "instance type", "nodes", "terms", "$/h", "file"):
        table.add_column(column)
    for row in rows:
        if row.error:
            said = row.error if row.path in row.error else f"{row.path}: {row.error}"
            table.add_row(row.name, "-", "-", "-", "-", "-", "-", plain(" ".join(said.split())))
            continue
        table.add_row(row.name, row.cloud, row.region, row.instance_type, str(row.nodes),
                      "spot" if row.spot else "on-demand", f"{row.usd_per_hour:,.2f}",
                      plain(row.path))
    out.print(table)


def images_table(out: Console, cache: Path, current: str, rows: list[dict]) -> None:
    """`sortie images`: the kept images, and the one this sortie boots."""
    if not rows:
        out.print(f"no image kept in {cache}; `sortie images --build` builds {current} (root)")
        return
    table = Table(title=f"Images for booted nodes, in {cache}", title_justify="left")
    for column in ("image", "size", "age", ""):
        table.add_column(column)
    for row in rows:
        table.add_row(Path(row["path"]).name, readable_bytes(row["bytes"]), duration(row["age_s"]),
                      "booted by this sortie" if row["current"] else "old")
    out.print(table)
