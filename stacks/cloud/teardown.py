"""Teardown with proof, for any stack: each step tried whatever the ones before it did, then a
refresh that shows what is left and a sweep of the cloud by the sortie tags; and the stack
resources a teardown keeps (the bucket and what it depends on)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from sortie.core.errors import SortieError, first_line
from sortie.infra.cloud_home import Cloud, Leftover
from sortie.infra.clouds import require_sdk
from sortie.infra.spec import ClusterSpec
from sortie.stacks.backend import Teardown
from sortie.stacks.cloud.stack_api import StackHandle, StackResource, Sweep, spec_from_config

T = TypeVar("T")


@dataclass
class Steps:
    """The steps of a teardown: each is tried whatever the ones before it did, and one that
    fails is a leftover of the report, never the end of the teardown. ``run`` runs each (the
    backend's own stacks: clearing a stale lock first)."""

    report: Teardown
    run: Callable[[Callable[[], Any]], Any] = lambda operation: operation()

    def __call__(self, what: str, operation: Callable[[], T], default: T) -> T:
        try:
            return self.run(operation)
        except SortieError as exc:
            self.report.leftovers.append(Leftover("stack", self.report.cluster_id,
                                                  f"{what}: {exc}"))
            return default


def swept(sweep: Sweep, cluster: str, config: Callable[[], dict[str, Any]],
           again: str = "") -> list[Leftover]:
    """What the tag sweep finds of ``cluster``; a sweep that cannot even be set up (no config,
    no credentials) is itself a leftover, never read as zero."""
    try:
        spec = spec_from_config(cluster, config())
        require_sdk(spec.cloud)  # (a missing one is said, not a traceback mid-teardown)
        return sweep(spec)
    except SortieError as exc:
        return [Leftover("unswept", cluster, f"the tag sweep could not start ({exc}){again}")]


def purged(cloud: Cloud, spec: ClusterSpec) -> None:
    """`Cloud.purge_deleted`, any failure one line (the sweep then names what is kept)."""
    try:
        require_sdk(spec.cloud)
        cloud.purge_deleted(spec)
    except Exception as exc:  # an SDK or API error of any kind
        raise SortieError(first_line(exc)) from None


def destroy_stack(stack: StackHandle, cluster: str, sweep: Sweep) -> Teardown:
    """Destroy a stack sortie attached but did not make (`sortie down NAME --destroy-stack`),
    with the proof a sortie's own teardown gives: a refresh shows no resource left and the tag
    sweep finds none. The stack and its config stay: they are the user's (`pulumi stack rm`)."""
    report = Teardown(cluster)
    step = Steps(report)
    step("refresh", stack.refresh, None)
    before = [r for r in step("reading the stack", stack.resources, list[StackResource]())
              if r.is_cloud_resource]
    step("destroy", stack.destroy, None)
    step("refresh", stack.refresh, None)
    remaining = [r for r in step("reading the stack", stack.resources, before)
                 if r.is_cloud_resource]
    report.removed = max(0, len(before) - len(remaining))
    report.leftovers += [Leftover(r.type, r.name, "pulumi destroy") for r in remaining]
    report.leftovers += swept(sweep, cluster, stack.config)
    report.state_removed = not report.leftovers
    return report


def resources_under(resources: list[StackResource], component_type: str) -> list[StackResource]:
    """The cloud resources anywhere below a component of ``component_type``."""
    parents = {r.urn: r.parent for r in resources}
    tops = {r.urn for r in resources if r.type == component_type}

    def below(urn: str) -> bool:
        seen = set()  # a damaged state file could loop
        while urn and urn not in seen:
            seen.add(urn)
            urn = parents.get(urn, "")
            if urn in tops:
                return True
        return False

    return [r for r in resources if r.is_cloud_resource and below(r.urn)]


def with_dependencies(resources: list[StackResource],
                       roots: list[StackResource]) -> list[StackResource]:
    """``roots`` and everything they depend on: a targeted destroy that removes a dependency
    of a resource it leaves is refused by Pulumi."""
    by_urn = {r.urn: r for r in resources}
    found: dict[str, StackResource] = {}
    pending = list(roots)
    while pending:
        resource = pending.pop()
        if resource.urn not in found:
            found[resource.urn] = resource
            pending += [by_urn[urn] for urn in resource.dependencies if urn in by_urn]
    return [r for r in resources if r.urn in found]
