"""`sortie run/up --gpu A100:8 --nodes 2`: launch the cheapest catalog machine that fits, and fall
back to the next one (another region, machine type or cloud) when a launch gets no capacity:
each fallback is a site of one backend, whose placements are tried in turn as zones are.

A site is an offer (`infra/offers.py`) on top of a stack profile of its cloud, which brings the
user's own settings (sshAllowedCidrs, owner, project, TTL): the cloud's `gpu_profiles` entry in
$SORTIE_HOME/config.yaml, else the shipped profile (aws-p4d, gcp-a2, azure-nd96). Regions in
`exclude_regions` are never tried. A site this controller cannot launch (no Pulumi CLI, no
credentials, a profile that lacks a setting) is skipped and said to be, before anything starts.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from sortie.core.errors import UsageError, first_line
from sortie.fleet.settings import load_settings
from sortie.infra.clouds import facts, require_sdk
from sortie.infra.offers import GpuAsk, why_none
from sortie.infra.spec import NAMESPACE
from sortie.stacks.cloud.sites import Site
from sortie.stacks.cloud.stack_api import spec_from_config
from sortie.stacks.profiles import apply_overrides, load_profile

MAX_SITES = 8  # the cheapest few; a launch none of them can hold says so
# A profile's own placement: its zones are its region's, not the offer's.
PLACEMENT_KEYS = (f"{NAMESPACE}:zone", f"{NAMESPACE}:fallbackZones")
NOTHING_CREATED = "; nothing was created"  # said once, at the end
# What each site's offer sets (with --nodes and --spot), which `--set` may not.
OFFER_KEYS = (*PLACEMENT_KEYS, *(f"{NAMESPACE}:{key}"
                                 for key in ("instanceType", "region", "nodes", "spot")))


@dataclass(frozen=True)
class GpuSites:
    sites: tuple[Site, ...]  # cheapest first
    skipped: tuple[str, ...]  # why a cloud or site is not tried, one line each


def gpu_sites(home: Path, ask: GpuAsk, nodes: int, overrides: tuple[str, ...] = ()) -> GpuSites:
    """Where ``nodes`` machines with ``ask.gpu`` may launch, cheapest first, each site's profile
    with ``overrides`` (`--set sshAllowedCidrs=...`) on it; a UsageError when nowhere can."""
    from sortie.stacks.cloud.automation import require_cloud_ready, require_cloud_tools
    from sortie.stacks.cloud.ssh_sources import refuse_placeholders

    for key in apply_overrides({}, overrides):
        if key in OFFER_KEYS:
            raise UsageError(f"--set {key.removeprefix(NAMESPACE + ':')}: --gpu chooses it "
                             "(the cheapest machine, region and zone; --nodes, --spot); --set "
                             "applies the rest to every cloud's profile (sshAllowedCidrs, "
                             "owner, ttl)")
    settings = load_settings(home)
    try:
        found = ask.offers(nodes, settings.exclude_regions)
    except ValueError as exc:
        raise UsageError(f"--gpu: {exc}") from None
    if not found:
        why = why_none(ask.gpu) or ("no catalog machine fits these limits" + (
            " outside the excluded regions" if settings.exclude_regions else ""))
        raise UsageError(f"--gpu {ask.gpu}: {why} (see `sortie plan --gpu {ask.gpu}`)")
    sites: list[Site] = []
    skipped: dict[str, list[str]] = {}  # why a site is not tried -> the profiles, in order
    for offer in found:
        if len(sites) == MAX_SITES:
            break
        profile = settings.gpu_profile(offer.cloud) or facts(offer.cloud).gpu_profile
        try:
            config = {key: value for key, value in
                      apply_overrides(load_profile(profile), overrides).items()
                      if key not in PLACEMENT_KEYS}
            config.update({f"{NAMESPACE}:instanceType": offer.instance_type,
                           f"{NAMESPACE}:region": offer.region, f"{NAMESPACE}:nodes": nodes,
                           f"{NAMESPACE}:spot": ask.spot})
            spec = spec_from_config("profile-check", config)
            refuse_placeholders(spec)
            require_sdk(spec.cloud)
            require_cloud_tools(spec.cloud, f"launch on {offer.cloud}")
            require_cloud_ready(spec, f"launch {offer.instance_type} in {offer.region}")
        except (UsageError, ValueError) as exc:  # a SpecError is a ValueError
            # Our own refusal whole (its fix is at its end); another error's first line.
            why = (str(exc).splitlines()[0] if isinstance(exc, UsageError) else
                   first_line(exc)).removesuffix(NOTHING_CREATED)
            where, site = skipped.setdefault(why, []), f"{offer.cloud} (profile {profile})"
            if site not in where:
                where.append(site)
            continue
        sites.append(Site(profile, config, spec))
    said = tuple(f"{', '.join(where)}: {why}" for why, where in skipped.items())
    if not sites:  # one reason once, however many clouds it stops (the shipped placeholder)
        raise UsageError(f"--gpu {ask.gpu}: no cloud can launch it: {'; '.join(said)}"
                         f"{NOTHING_CREATED}")
    return GpuSites(tuple(sites), said)
