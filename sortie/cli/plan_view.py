"""How `sortie plan` shows a plan: the resources as a tree under their parents, a security
summary and the estimated cost."""

from __future__ import annotations

import re
from collections import defaultdict

from rich.console import Console
from rich.table import Table
from rich.tree import Tree

from sortie.cli.render import escape
from sortie.infra.review import DeclaredResource
from sortie.infra.spec import SET_YOUR_ADDRESS
from sortie.stacks.cloud.plan import Plan

GROUP_ABOVE = 3  # more siblings of one type than this print as one line with a count


def resource_tree(stack: str, resources: list[DeclaredResource]) -> Tree:
    """Resources under their parents; many siblings of one type collapse to a counted line."""
    children: dict[str, list[DeclaredResource]] = defaultdict(list)
    for resource in sorted(resources, key=_natural_order):
        children[resource.parent].append(resource)
    root = Tree(f"[bold]stack {stack}[/] ({len(resources)} resources)")

    def add(branch: Tree, parent_urn: str) -> None:
        by_type: dict[str, list[DeclaredResource]] = defaultdict(list)
        for child in children.get(parent_urn, []):
            by_type[child.type].append(child)
        for token, group in by_type.items():
            if len(group) > GROUP_ABOVE:
                branch.add(f"{token} × {len(group)} ([cyan]{group[0].name}[/] … "
                           f"[cyan]{group[-1].name}[/])")
                continue
            for child in group:
                add(branch.add(f"{token} [cyan]{child.name}[/]"), child.urn)

    stack_urns = {r.parent for r in resources} - {r.urn for r in resources}
    for urn in sorted(stack_urns):
        add(root, urn)
    return root


def _natural_order(resource: DeclaredResource) -> tuple:
    """By type, then name with numbers compared as numbers (node-2 before node-10)."""
    parts = re.split(r"(\d+)", resource.name)
    return resource.type, [int(p) if p.isdigit() else p for p in parts]


def _yes(flag: bool, good: bool = True) -> str:
    return f"[{'green' if flag == good else 'red'}]{'yes' if flag else 'no'}[/]"


def render(console: Console, plan: Plan) -> None:
    spec, security, cost = plan.evaluation.spec, plan.security, plan.cost
    kind = spec.instance
    console.print(resource_tree(plan.stack, plan.evaluation.resources))
    console.print(f"\n[bold]{spec.nodes} × {spec.instance_type}[/] in {spec.region}"
                  f"{' / ' + spec.zone if spec.zone else ''}: {kind.gpus} × {kind.gpu_model} "
                  f"{kind.gpu_memory_gb} GB per node")
    console.print(f"between nodes: {escape(plan.interconnect)}", soft_wrap=True)
    console.print(f"image: {escape(plan.image)} · {plan.image_line}", soft_wrap=True)

    checks = Table(title="security", show_header=False, title_justify="left")
    ssh = ", ".join(security.ssh_from) or "nobody"
    checks.add_row("SSH (22) reachable from", f"[red]{ssh}[/]"
                   if security.world_ssh or security.placeholder_ssh else ssh)
    checks.add_row("all traffic between nodes", _yes(security.intra_cluster))
    if security.bucket_managed:
        checks.add_row("bucket public", _yes(security.bucket_public, good=False))
        checks.add_row("bucket encrypted", _yes(security.bucket_encrypted))
        checks.add_row("bucket versioned", _yes(security.bucket_versioned))
        checks.add_row("bucket TLS only", _yes(security.bucket_tls_only))
        checks.add_row("objects expire after", f"{spec.bucket_expiry_days} days")
    else:
        checks.add_row("bucket", f"existing {spec.bucket_name!r}, left as it is")
    for key, value in security.details.items():
        checks.add_row(key, value)
    console.print(checks)
    for cidr in security.placeholder_ssh:
        console.print(f"[red]![/] sshAllowedCidrs: {cidr} is a documentation address (RFC 5737), "
                      "the profile's placeholder: `sortie run` and `sortie up` refuse it; set "
                      f"your own: {escape(SET_YOUR_ADDRESS)}", soft_wrap=True)

    prices = Table(title="estimated cost (compute; then what stays billed after the TTL)",
                   title_justify="left",
                   caption=f"prices of {cost.price_date}: {cost.price_source}",
                   caption_justify="left")
    for column in ("pricing", "$/h", f"$ for the TTL ({spec.ttl_hours:g} h)", ""):
        prices.add_column(column)
    spot_label = ("spot" if spec.nodes == 1 else "spot workers, on-demand head")
    prices.add_row("on-demand", f"{cost.on_demand_usd_h:,.2f}", f"{cost.on_demand_ttl_usd:,.2f}",
                   "" if spec.spot else "← configured")
    prices.add_row(spot_label, f"{cost.spot_usd_h:,.2f}", f"{cost.spot_ttl_usd:,.2f}",
                   "← configured" if spec.spot else "")
    if cost.idle_usd_h:
        prices.add_row("after the TTL, until teardown", f"{cost.idle_usd_h:,.3f}", "",
                       cost.idle_what)
    console.print(prices)

    quotas = Table(title="quotas it needs (ask for them before the first launch)",
                   title_justify="left")
    for column in ("quota", "needed", "where", "new account's limit", "ask in"):
        quotas.add_column(column, overflow="fold")
    for quota in plan.quotas:
        default = "-" if quota.default is None else str(quota.default)
        quotas.add_row(quota.name, f"{quota.needed} {quota.unit}", quota.scope,
                       f"[red]{default}[/]" if quota.over_default else default, quota.how)
    console.print(quotas)
    for quota in plan.quotas:
        if quota.over_default:
            console.print(f"[red]![/] {quota.name}: {quota.needed} {quota.unit} needed, a new "
                          f"account has {quota.default} in {quota.scope}: ask for more first")
