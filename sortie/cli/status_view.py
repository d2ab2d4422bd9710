"""How `sortie status` shows the fleet: a row per sortie (a rehearsal with what its cloud would
charge), a line for each that has more to say, then what is running costs per hour, by owner,
and the monthly budgets."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table

from sortie.cli.render import duration, escape, plain
from sortie.core.sizes import counted
from sortie.cost.money import usd, usd_per_hour
from sortie.fleet.status import Fleet


def status_table(out: Console, fleet: Fleet) -> None:
    """The sorties, then what is running costs per hour, by owner."""
    rows = fleet.sorties
    budgets = [f"{escape(b.owner)} {usd(b.left_usd)} of {usd(b.monthly_usd)} left"
               for b in fleet.budgets]
    if not rows:
        out.print("no sorties" + (f"; monthly budgets: {'; '.join(budgets)}" if budgets else ""))
        return
    table = Table(title="sorties", title_justify="left")
    for column in ("name", "backend", "owner", "nodes", "up", "age", "state", "$/h", "$ so far",
                   "TTL left"):
        table.add_column(column)
    for row in rows:
        would_be = f" ({row.rehearsal_usd_per_hour:,.2f} there)" \
            if row.rehearsal_usd_per_hour is not None else ""
        table.add_row(row.name, row.backend, plain(row.owner), str(row.nodes or "-"),
                      "-" if row.nodes_up is None else str(row.nodes_up), duration(row.age_s),
                      row.state, f"{row.usd_per_hour:.2f}{would_be}", f"{row.usd_so_far:.2f}",
                      duration(row.ttl_left_s))
    out.print(table)
    for row in rows:
        if row.detail:
            out.print(f"{escape(row.name)}: {escape(row.detail)}")
    owners = "; ".join(f"{escape(total.owner)} {usd_per_hour(total.usd_per_hour)} "
                       f"({counted(total.sorties, 'sortie')}, {counted(total.nodes, 'node')})"
                       for total in fleet.owners)
    out.print(f"running: {usd_per_hour(fleet.usd_per_hour)} estimated"
              + (f"; by owner: {owners}" if owners else ""))
    if budgets:
        out.print(f"monthly budgets: {'; '.join(budgets)}")
