"""Where `sortie run` and `sortie up` launch: a stack profile's cloud or local sshd nodes, the
cluster shape each defaults to, and what it costs, shown before launch."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sortie.core.errors import UsageError
from sortie.fleet.gpu_sites import gpu_sites
from sortie.fleet.launch_ask import LaunchAsk
from sortie.fleet.registry import refuse_taken
from sortie.infra.clouds import require_sdk
from sortie.infra.offers import GpuAsk
from sortie.stacks.booted.cloud_rehearsal import given_delays
from sortie.stacks.booted.nodes import require_booted_nodes
from sortie.stacks.cloud.pulumi_backend import PulumiBackend
from sortie.stacks.cloud.ssh_sources import check_reachable, refuse_placeholders
from sortie.stacks.cloud.stack_api import spec_from_config
from sortie.stacks.local.local_backend import LocalBackend
from sortie.stacks.local.local_rehearsal import check_local_torch
from sortie.stacks.machine.node_network import check_local_network
from sortie.stacks.profiles import apply_overrides, load_profile
from sortie.stacks.slurm.detached_run import IN_ALLOCATION
from sortie.stacks.slurm.in_allocation import InAllocation
from sortie.stacks.slurm.slurm_backend import SlurmBackend
from sortie.stacks.slurm.slurm_queue import SlurmQueue
from sortie.stacks.slurm.slurm_sites import SlurmRequest, SlurmSites


@dataclass(frozen=True)
class LaunchTarget:
    """Where `sortie run` or `sortie up` launches, and the cluster shape it defaults to there."""

    backend: LocalBackend | PulumiBackend | SlurmBackend
    nodes: int
    gpus_per_node: int = 0
    notes: tuple[str, ...] = ()  # said before launch (`--gpu`: the sites not tried, and why)

    def node_count(self, asked: int | None) -> int:
        """How many nodes to launch: ``asked`` (the task's, or --nodes), else the default; more
        than the backend can make is a UsageError, before anything starts."""
        count, most = asked or self.nodes, self.backend.max_nodes
        if count > most:
            raise UsageError(f"nodes: {count}: a {self.backend.name} cluster has at most {most}")
        return count


def launch_target(home: Path, ask: LaunchAsk, held: bool = False) -> LaunchTarget:
    """A stack profile's cloud (its nodes), the cheapest places for a GPU ask (its ``nodes``,
    1 by default), a Slurm allocation, else local sshd nodes (2). A NAME already taken (here,
    or by a stack in the state backend) is refused first. ``held``: for `sortie up` (what a note
    says to run)."""
    profile, overrides, backend_url, name = ask.stack, ask.overrides, ask.backend_url, ask.name
    gpu, nodes, rehearse, slurm = ask.gpu, ask.nodes, ask.rehearse, ask.slurm
    inside = os.environ.get(IN_ALLOCATION) if slurm is not None else None
    if name is not None and not inside:  # (inside: the name is its own, `InAllocation`)
        refuse_taken(home, name, "--name")
    if gpu is not None and slurm is not None:
        raise UsageError("--gpu: places the cluster on a cloud; on a Slurm cluster ask for "
                         "GPUs with --gpus-per-node")
    if rehearse and backend_url is not None:
        raise UsageError("--backend-url: a rehearsal's nodes boot here and its state stays "
                         "here: it uses no state backend")
    if gpu is not None:
        if profile is not None:
            raise UsageError("--gpu: places the cluster itself; --stack does not apply "
                             "(set each cloud's profile in gpu_profiles, $SORTIE_HOME/config.yaml)")
        return _gpu_target(home, gpu, nodes or 1, backend_url, name, overrides)
    if slurm is not None:
        if profile is not None or overrides or gpu is not None or rehearse:
            raise UsageError("--slurm: allocates on that Slurm cluster; --stack, --set, --gpu "
                             "and --rehearse do not apply")
        return _slurm_target(home, slurm, nodes or 1, inside)
    if rehearse:
        return _rehearsal_target(home, profile, overrides, "up" if held else "run")
    if profile is None:
        if overrides:
            raise UsageError("--set: applies to a stack profile; add --stack PROFILE")
        check_local_network()  # a bad setting is named before anything starts
        check_local_torch()
        return LaunchTarget(LocalBackend(home), nodes=2)
    backend, notes = backend_for_profile(profile, apply_overrides(load_profile(profile),
                                                                  overrides), home, backend_url)
    _refuse_existing(backend, name)
    return LaunchTarget(backend, backend.spec.nodes, backend.spec.instance.gpus, notes=notes)


def _rehearsal_target(home: Path, profile: str | None, overrides: tuple[str, ...],
                      command: str) -> LaunchTarget:
    """`--rehearse`: the profile's program, its nodes booted here
    (`stacks/booted/cloud_rehearsal.py`)."""
    if profile is None:
        raise UsageError("--rehearse: rehearses a stack profile's cloud sortie: add --stack "
                         "PROFILE")
    spec = spec_from_config("rehearsal", apply_overrides(load_profile(profile), overrides))
    require_sdk(spec.cloud)  # the rehearsal runs the cloud's own program
    given_delays()  # before anything starts
    require_booted_nodes("--rehearse")
    check_local_torch()
    try:  # the rehearsal's controller reaches its nodes here; the cloud run would be refused
        refuse_placeholders(spec)
        notes: tuple[str, ...] = ()
    except UsageError as exc:
        notes = (f"rehearsed as it is, but `sortie {command} --stack {profile}` would refuse: "
                 f"{str(exc).removesuffix('; nothing was created')}",)
    return LaunchTarget(LocalBackend(home, rehearse=(profile, overrides)), spec.nodes,
                        notes=notes)


def _slurm_target(home: Path, slurm: SlurmRequest, nodes: int,
                  inside: str | None = None) -> LaunchTarget:
    """An allocation on a Slurm cluster, checked by Slurm itself before anything is queued;
    ``inside``: a detached run's controller, in the allocation (job id) it drives."""
    site, ask = SlurmSites(home).site(slurm.site), slurm.ask
    if slurm.ranks_per_node and not ask.cpus_per_task:
        ask = ask.with_cpus_for(slurm.ranks_per_node,
                                SlurmQueue(site.login).node_cpus(ask.partition))
    backend = InAllocation(home, site, ask, inside) if inside else \
        SlurmBackend(home, site, ask, slurm.queue_timeout_s)
    notes = tuple(note for note in (backend.check(nodes), backend.price_note(nodes)) if note)
    return LaunchTarget(backend, nodes, slurm.ask.gpus_per_node, notes=notes)


def _refuse_existing(backend: PulumiBackend, name: str | None) -> None:
    """A NAME that a stack in the state backend has (another controller's) is refused."""
    if name is not None and backend.exists(name):
        raise UsageError(f"--name: stack {name!r} exists in the state backend (see `sortie "
                         "status --backend-url`)")


def _gpu_target(home: Path, gpu: GpuAsk, nodes: int, backend_url: str | None,
                name: str | None, overrides: tuple[str, ...] = ()) -> LaunchTarget:
    from sortie.stacks.cloud.automation import AutomationStacks

    found = gpu_sites(home, gpu, nodes, overrides)
    first, *fallbacks = found.sites
    reach = check_reachable(first.spec)  # (every site's profile was checked for placeholders)
    backend = PulumiBackend(first.profile, first.config, AutomationStacks(home, backend_url),
                            home, spec=first.spec, fallbacks=tuple(fallbacks))
    _refuse_existing(backend, name)
    return LaunchTarget(backend, nodes, first.spec.instance.gpus,
                        notes=(*reach, *(f"not tried: {why}" for why in found.skipped)))


def backend_for_profile(profile: str, config: dict[str, Any], home: Path,
                        backend_url: str | None = None) -> tuple[PulumiBackend, tuple[str, ...]]:
    """The real backend for a profile, after checking that this controller could reach its
    nodes and that the CLI and credentials are there; with what is said before launch."""
    from sortie.stacks.cloud.automation import (
        AutomationStacks,
        require_cloud_ready,
        require_cloud_tools,
    )

    spec = spec_from_config("profile-check", config)  # a bad profile is named first
    require_sdk(spec.cloud)
    notes = check_reachable(spec)
    require_cloud_tools(spec.cloud, f"run stack {profile}")
    require_cloud_ready(spec, f"run stack {profile}")
    return PulumiBackend(profile, config, AutomationStacks(home, backend_url), home,
                         spec=spec), tuple(notes)
