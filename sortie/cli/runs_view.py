"""How `sortie runs` and `sortie jobs` show the run history: one row per run, newest last, its
directory as the shortest path that names it from here; or a JSON list."""

from __future__ import annotations

import datetime
import os
import time
from pathlib import Path

from rich.table import Table

from sortie.cli import render
from sortie.cli.render import plain
from sortie.cost.money import usd
from sortie.rundir.history import RunEntry

STATE_STYLE = {"succeeded": "green", "running": "cyan", "controller gone": "yellow"}


def where(directory: str, here: Path) -> str:
    """``directory`` relative to ``here`` when it is under it, else as it is."""
    try:
        return os.path.relpath(directory, here) if Path(directory).is_relative_to(here) \
            else directory
    except ValueError:
        return directory


def duration(entry: RunEntry, now: float) -> str:
    seconds = int((entry.ended or now) - entry.started)
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m" if seconds >= 3600 else \
        f"{seconds // 60}m{seconds % 60:02d}s"


def runs_table(entries: list[RunEntry], states: list[str], here: Path, now: float) -> Table:
    table = Table(title=f"{len(entries)} run{'s' * (len(entries) != 1)}", title_justify="left")
    for column in ("run", "cluster", "kind", "state", "started", "took", "cost", "job",
                   "directory"):
        table.add_column(column, overflow="fold")
    for entry, state in zip(entries, states, strict=True):
        started = datetime.datetime.fromtimestamp(entry.started).strftime("%Y-%m-%d %H:%M")
        style = STATE_STYLE.get(state, "red")
        table.add_row(plain(entry.id), plain(entry.cluster), entry.kind,
                      f"[{style}]{state}[/]", started, duration(entry, now),
                      usd(entry.cost_usd) if entry.cost_usd is not None else "-",
                      plain(entry.job), plain(where(entry.directory, here)))
    return table


def show_runs(listed: list[tuple[RunEntry, str]], as_json: bool, title: str | None = None) -> None:
    """``listed`` (each run and its state now) on stdout: a table, or with ``as_json`` a list."""
    out = render.console()
    if as_json:
        render.print_json(out, [{**entry.model_dump(mode="json"), "state": state}
                                for entry, state in listed])
        return
    table = runs_table([entry for entry, _ in listed], [state for _, state in listed],
                       Path.cwd(), time.time())
    table.title = title or table.title
    out.print(table)
