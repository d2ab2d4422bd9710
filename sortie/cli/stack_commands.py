"""The commands about stack profiles, all offline: `plan` (resources and cost), `profiles` (the
list), `init` (a Pulumi project of one, outside sortie's checkout); and `images`, the root file
systems booted local nodes run to rehearse them."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from sortie.cli import options, render
from sortie.cli.render import escape
from sortie.core.errors import UsageError
from sortie.core.home import sortie_home
from sortie.fleet.settings import load_settings
from sortie.infra.offers import GpuAsk, catalog_age_days, not_built, why_none

if TYPE_CHECKING:
    from rich.console import Console


@click.command()
@options.stack()
@options.overrides
@options.nodes
@options.gpu_request
@options.as_json
def plan(stack: str | None, overrides: tuple[str, ...], nodes: int | None, ask: GpuAsk | None,
         as_json: bool) -> None:
    """Show what a stack profile will create and cost, offline; or, with --gpu, where a cluster
    is cheapest.

    --stack: runs the real Pulumi program under Pulumi's mock runtime: no cloud credentials and
    no Pulumi CLI are needed, and nothing is created. Prints the resources as a tree, a security
    summary and the estimated cost per hour and for the TTL, on-demand and spot.

    --gpu A100:8 --nodes 2: every machine of the shipped catalog that fits, on every cloud and
    region (but those excluded in $SORTIE_HOME/config.yaml), with its $/h on-demand and spot,
    interconnect, GPU memory and the quotas it needs, cheapest first; the catalog's prices carry
    their date and source (a warning past 90 days)."""
    if (stack is None) == (ask is None):
        raise UsageError("--stack or --gpu: give one (a profile to plan, or GPUs to place)")
    if stack is None:
        assert ask is not None  # (one of the two, checked above)
        if overrides:
            raise UsageError("--set: applies to a stack profile, not to --gpu")
        try:
            found = ask.offers(nodes or 1, load_settings(sortie_home()).exclude_regions)
        except ValueError as exc:
            raise UsageError(f"--gpu: {exc}") from None
        out = render.console()
        # The age of the oldest price shown (none shown: no age to warn of)
        oldest = min((offer.price_date for offer in found), default=None)
        age = catalog_age_days(date=oldest) if oldest else 0
        unbuilt = not_built(ask.gpu)
        if as_json:
            render.print_json(out, {"catalog_date": oldest, "catalog_age_days": age,
                                    "offers": found,
                                    "not_built": [{"cloud": cloud, "instance_type": name,
                                                   "why": why} for cloud, name, why in unbuilt]})
        else:
            render.offers_table(out, found, ask.spot, age, unbuilt,
                                "" if found else why_none(ask.gpu))
        return
    from sortie.cli.plan_view import render as render_plan  # the cloud SDKs load only for plans
    from sortie.stacks.cloud.plan import make_plan

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
    from sortie.stacks.cloud.plan import profile_rows

    rows = profile_rows()
    out = render.console()
    if as_json:
        render.print_json(out, {"profiles": rows})
    else:
        render.profiles_table(out, rows)


@click.command()
@click.argument("directory", type=options.UserDir(), metavar="DIR")
@options.stack(required=True)
@options.overrides
def init(directory: Path, stack: str, overrides: tuple[str, ...]) -> None:
    """Write a Pulumi project of stack profile --stack into DIR, outside sortie's checkout.

    DIR gets Pulumi.yaml (the Python runtime sortie is installed in), __main__.py (which runs
    the installed cluster program), Pulumi.<stack>.yaml (the profile, --set applied) and a
    README of the next commands: `pulumi stack init <stack>`, `pulumi up`. Nothing is
    replaced: a DIR that has any of these files is refused."""
    from sortie.stacks.cloud.project import write_project

    out = render.console()
    for path in write_project(directory, stack, overrides):
        out.print(f"wrote {escape(str(path))}", highlight=False, soft_wrap=True)
    out.print(f"next: cd {escape(str(directory))} && pulumi stack init {escape(stack)} && "
              "pulumi up (see README.md there)", highlight=False, soft_wrap=True)


@click.command()
@click.option("--build", is_flag=True,
              help="Build the image booted nodes run now, unless it is kept already (root; "
                   "debootstrap from this machine's Debian mirror: a few minutes, once).")
@click.option("--remove", type=click.Choice(["old", "all"]), default=None,
              help="Remove kept images: those no sortie of this version boots (old), or all.")
@options.as_json
def images(build: bool, remove: str | None, as_json: bool) -> None:
    """The root file systems booted local nodes run: where they are kept ($SORTIE_IMAGE_CACHE,
    else ~/.cache/sortie/images), how big and how old, and which one this sortie boots.

    An image is Debian bookworm with systemd, cloud-init, sshd, python3 and podman (for jobs in
    images), as a cloud's image has them: booted with systemd-nspawn, each node runs its user
    data at boot as a cloud machine would. It is named by what goes into it: a new sortie may
    build a new one."""
    from sortie.stacks.booted import image as booted_image

    progress, out = render.consoles(as_json)
    removed = booted_image.remove_images(keep_current=remove == "old") if remove else []
    for image in removed:
        progress.print(f"removed {image.path}")
    if build:
        _build_with_progress(booted_image, progress)
    current = booted_image.image_name()
    rows = [{"path": str(image.path), "bytes": image.size_bytes, "age_s": round(image.age_s),
             "current": image.path.name == current} for image in booted_image.images()]
    if as_json:
        render.print_json(out, {"cache": str(booted_image.cache_dir()), "current": current,
                                "images": rows})
        return
    render.images_table(out, booted_image.cache_dir(), current, rows)


def _build_with_progress(booted_image: Any, console: Console) -> None:
    """`images --build`: its stages as a bar, the stage's latest line and the time so far
    (a build takes minutes: debootstrap downloads and installs a Debian system)."""
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    stages = booted_image.BUILD_STAGES
    with Progress(TextColumn("{task.description}"), BarColumn(bar_width=len(stages) * 8),
                  TextColumn("{task.completed}/{task.total}"), TimeElapsedColumn(),
                  TextColumn("{task.fields[line]}"), console=console, transient=True) as bar:
        task = bar.add_task("building the image", total=len(stages), line="")

        def stage(number: int, line: str) -> None:
            bar.update(task, completed=number, description=stages[number],
                       line=render.terminal_safe(line)[:70], refresh=True)

        booted_image.build_image(console.print, stage)


@click.group()
def rehearse() -> None:
    """What a cloud does to a rehearsed sortie's nodes (`sortie run --stack PROFILE --rehearse`,
    or `up --rehearse`), done on purpose to see sortie hold: `preempt` a node."""


@rehearse.command()
@click.argument("name")
@click.argument("node")
@click.option("--after", "after_s", type=options.Duration(min_s=0, max_s=3600),
              default=None, metavar="DURATION",
              help="Take the machine this long after the notice (default: the cloud's "
                   "documented notice, AWS 2m, GCP and Azure 30s; or SORTIE_REHEARSE_DELAYS's "
                   "notice=). At most 1h.")
def preempt(name: str, node: str, after_s: float | None) -> None:
    """Preempt NODE (e.g. node-1) of rehearsed sortie NAME as its cloud would: a spot notice in
    the node's metadata service (AWS spot/instance-action, GCP instance/preempted, Azure
    Scheduled Events), then the machine taken. A sortie running there checkpoints on the
    notice, and replaces the node and resumes once it is gone."""
    from sortie.fleet.rehearse import preempt as preempt_node

    progress, _out = render.consoles(False)
    preempt_node(sortie_home(), name, node, after_s, progress.print)
