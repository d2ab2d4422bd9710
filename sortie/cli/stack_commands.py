"""The commands about stack profiles, all offline: `plan` (resources and cost), `profiles` (the
list), `init` (a Pulumi project of one, outside sortie's checkout)."""

from __future__ import annotations

from pathlib import Path

import click
from rich.markup import escape

from infra.cloud_facts import PRICE_DATE
from infra.offers import INTERCONNECTS, catalog_age_days, offers
from sortie.cli import options, render
from sortie.core.errors import UsageError


@click.command()
@options.stack()
@options.overrides
@click.option("--gpu", metavar="MODEL[:N]", help="Instead of a profile: every catalog machine "
              "with N GPUs of MODEL per node (e.g. A100:8), on every cloud, cheapest first.")
@options.nodes
@click.option("--spot", is_flag=True, help="With --gpu: rank by the spot price (workers on "
              "spot, the head on-demand).")
@click.option("--max-usd-per-hour", type=click.FloatRange(min=0), default=None, metavar="USD",
              help="With --gpu: only clusters at most this much an hour.")
@click.option("--interconnect", type=click.Choice(INTERCONNECTS), default="any",
              show_default=True, help="With --gpu: only machines with this network between "
              "nodes.")
@options.as_json
def plan(stack: str | None, overrides: tuple[str, ...], gpu: str | None, nodes: int | None,
         spot: bool, max_usd_per_hour: float | None, interconnect: str, as_json: bool) -> None:
    """Show what a stack profile will create and cost, offline; or, with --gpu, where a cluster
    is cheapest.

    --stack: runs the real Pulumi program under Pulumi's mock runtime: no cloud credentials and
    no Pulumi CLI are needed, and nothing is created. Prints the resources as a tree, a security
    summary and the estimated cost per hour and for the TTL, on-demand and spot.

    --gpu A100:8 --nodes 2: every machine of the shipped catalog that fits, on every cloud,
    with its $/h on-demand and spot, interconnect, GPU memory, regions and the quotas it needs,
    cheapest first; the catalog's prices carry their date and source (a warning past 90
    days)."""
    if (stack is None) == (gpu is None):
        raise UsageError("--stack or --gpu: give one (a profile to plan, or GPUs to place)")
    if gpu is not None:
        if overrides:
            raise UsageError("--set: applies to a stack profile, not to --gpu")
        try:
            found = offers(gpu, nodes or 1, spot, max_usd_per_hour, interconnect)
        except ValueError as exc:
            raise UsageError(f"--gpu: {exc}") from None
        out = render.console()
        if as_json:
            render.print_json(out, {"catalog_date": PRICE_DATE,
                                    "catalog_age_days": catalog_age_days(), "offers": found})
        else:
            render.offers_table(out, found, spot, catalog_age_days())
        return
    from sortie.cli.plan_view import render as render_plan  # the cloud SDKs load only for plans
    from stacks.plan import make_plan

    progress, out = render.consoles(as_json)
    with progress.status(f"Evaluating profile {stack} offline ..."):
        result = make_plan(stack, overrides)
    if as_json:
        render.print_json(out, result)
    else:
        render_plan(out, result)


@click.command()
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


@click.command()
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
