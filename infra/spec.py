"""The cloud-neutral cluster spec, validated from the stack's Pulumi config before anything exists.

Every cloud program takes a `ClusterSpec`; it never reads config itself. Keys are the config keys
of the `sortie:` namespace (camelCase, as in `stacks/profiles/Pulumi.<profile>.yaml`), and every
error names the key and what it accepts, in one line.
"""

from __future__ import annotations

import ipaddress
import json
import os
import re
from collections.abc import Mapping
from datetime import datetime, timedelta, timezone
from typing import Any, Literal

import pydantic
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    computed_field,
    field_validator,
)

from sortie.core.inventory import MAX_NODES
from sortie.infra.catalog import CATALOG, InstanceType, instance_types
from sortie.infra.cloud_facts import SpecError
from sortie.infra.clouds import CLOUDS, CloudName, facts

NAMESPACE = "sortie"

# The parts every cluster is built of (`infra/parts.py`), by the name of their component.
PartKind = Literal["Network", "Bucket", "NodeAccess", "Node"]
NETWORK: PartKind = "Network"
BUCKET: PartKind = "Bucket"
NODE_ACCESS: PartKind = "NodeAccess"
NODE: PartKind = "Node"


def part_type(cloud: str, kind: PartKind) -> str:
    """The Pulumi type of a part's component, e.g. "sortie:aws:Node"."""
    return f"sortie:{cloud}:{kind}"


def node_part_name(cluster_name: str, node_name: str) -> str:
    """A Node component's name: the cluster's, then the node's as the inventory calls it."""
    return f"{cluster_name}-{node_name}"


# Tag keys every resource carries. Dashes, lowercase: valid as AWS tags, Azure tags, GCP labels.
TAG_CLUSTER, TAG_RUN, TAG_OWNER, TAG_EXPIRES = (
    "sortie-cluster", "sortie-run", "sortie-owner", "sortie-expires-at")
# The one sortie a resource belongs to: its name plus a random suffix, new for every launch.
# Names are unique per controller home or state backend only, so two controllers in one
# account may both run "exp"; teardown sweeps by this tag, never by the name.
TAG_ID = "sortie-id"


# Tags a user adds: what AWS, Azure and GCP (whose labels are these, lowercased) all take. The
# `aws:` prefix is AWS's own, `sortie-` ours; AWS allows 50 tags, sortie adds 5.
TAG_KEY = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.:=+@-]{0,62}")
TAG_VALUE = re.compile(r"[A-Za-z0-9 _.:/=+@-]{0,256}")
MAX_USER_TAGS = 40


# The widest SSH source a profile may list without `allowWorldSsh: true`: a /8 is already 16
# million addresses, and anything wider (0.0.0.0/1 + 128.0.0.0/1 is the whole internet) is not
# "your own network".
WIDEST_SSH_PREFIX = {4: 8, 6: 32}


def too_wide_for_ssh(cidr: str) -> bool:
    """Whether a CIDR is wider than a /8 (IPv6: a /32): the internet, or much of it."""
    network = ipaddress.ip_network(cidr)
    return network.prefixlen < WIDEST_SSH_PREFIX[network.version]


# Addresses reserved for documentation (RFC 5737, RFC 3849): examples, never a real machine. A
# profile that lists one as its SSH source buys nodes that no controller can ever reach.
DOCUMENTATION_NETWORKS = tuple(ipaddress.ip_network(n) for n in (
    "192.0.2.0/24", "198.51.100.0/24", "203.0.113.0/24", "2001:db8::/32"))
# The fix, said with every refusal of such a source: the README's way to find your address.
SET_YOUR_ADDRESS = ("--set sshAllowedCidrs=$(curl -s https://checkip.amazonaws.com)/32 (or "
                    "`pulumi config set --path 'sortie:sshAllowedCidrs[0]' ADDRESS/32`)")


def placeholder_sources(cidrs: list[str]) -> list[str]:
    """The CIDRs among ``cidrs`` that lie in a documentation range: placeholders, not sources."""
    networks = [(cidr, ipaddress.ip_network(cidr)) for cidr in cidrs]
    return [cidr for cidr, network in networks
            if any(network.version == doc.version and network.subnet_of(doc)  # type: ignore[arg-type]
                   for doc in DOCUMENTATION_NETWORKS)]


class ClusterSpec(BaseModel):
    """What one sortie's cluster is. Field aliases are the config keys."""

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    cluster: str  # the stack name unless set: names resources, tags them, prefixes the bucket
    cloud: CloudName
    region: str
    project: str | None = None  # GCP only: the project id
    zone: str | None = None  # None: the cloud picks (AWS, Azure) or the catalog's first (GCP)
    # Launch policy: when not every node comes up, try these zones next (then on-demand).
    fallback_zones: list[str] = Field(default_factory=list, alias="fallbackZones")
    instance_type: str = Field(alias="instanceType")
    nodes: int = Field(1, ge=1, le=MAX_NODES)
    # Spot: workers run on spot; the head stays on-demand because the rendezvous store lives
    # there (a single-node cluster is all spot). Fallback to on-demand is the launch policy.
    spot: bool = False
    spot_max_price: float | None = Field(None, alias="spotMaxPrice",  # $/h; None: on-demand
                                         allow_inf_nan=False)
    spot_fallback_on_demand: bool = Field(True, alias="spotFallbackOnDemand")
    ssh_allowed_cidrs: list[str] = Field(alias="sshAllowedCidrs", min_length=1)
    allow_world_ssh: bool = Field(False, alias="allowWorldSsh")
    bucket_name: str | None = Field(None, alias="bucketName")  # use an existing bucket
    bucket_expiry_days: int = Field(30, alias="bucketExpiryDays", ge=1, le=3650)
    ttl_hours: float = Field(4, alias="ttlHours", gt=0, le=168)
    # Held with `sortie up --idle-stop`: each node powers itself off once nothing has run on it
    # this long (the in-guest timer counts from boot, so at least the time a node takes to boot
    # and be checked).
    idle_stop_minutes: int | None = Field(None, alias="idleStopMinutes", ge=5, le=7 * 24 * 60)
    tags: dict[str, str] = Field(default_factory=dict)
    image: str | None = None  # overrides the catalog's image for the GPU generation
    root_volume_gb: int = Field(200, alias="rootVolumeGb", ge=50, le=16384)
    owner: str = "unknown"
    run: str | None = None  # the run id; defaults to the cluster name
    # This sortie among any others of the same name (set by the launch): tags, sweeps.
    sortie_id: str | None = Field(None, alias="sortieId", pattern=r"^[a-z0-9][a-z0-9-]{0,62}$")
    expires_at: datetime | None = Field(None, alias="expiresAt")  # set by `sortie run`

    @field_validator("cluster", "run")
    @classmethod
    def _dns_label(cls, value: str | None) -> str | None:
        if value is not None and not re.fullmatch(r"[a-z0-9]([a-z0-9-]{0,38}[a-z0-9])?", value):
            raise ValueError("use 1-40 lowercase letters, digits and dashes")
        return value

    @field_validator("expires_at")
    @classmethod
    def _in_utc(cls, value: datetime | None) -> datetime | None:
        """A time without a zone is UTC (tags and the TTL compare it with aware times)."""
        return value.replace(tzinfo=timezone.utc) if value and value.tzinfo is None else value

    @field_validator("spot_max_price")
    @classmethod
    def _price(cls, value: float | None) -> float | None:
        """-1 is Azure's (and our) way to say "up to the on-demand price", the default."""
        if value is not None and value <= 0 and value != -1:
            raise ValueError("give a price in $/h above 0, or -1 for up to the on-demand price")
        return None if value == -1 else value

    @field_validator("ssh_allowed_cidrs", mode="before")
    @classmethod
    def _comma_separated(cls, value: Any) -> Any:
        """`pulumi config set sortie:sshAllowedCidrs 10.0.0.0/8,192.0.2.0/24` gives text."""
        return [part.strip() for part in value.split(",")] if isinstance(value, str) else value

    @field_validator("ssh_allowed_cidrs")
    @classmethod
    def _cidrs(cls, values: list[str]) -> list[str]:
        seen = set()
        for value in values:
            try:
                network = ipaddress.ip_network(value, strict=True)
            except ValueError as exc:
                raise ValueError(f"{value!r} is not a CIDR like 203.0.113.0/24 ({exc})") from None
            if network in seen:  # the cloud refuses a rule twice, after other resources exist
                raise ValueError(f"{value} is listed twice")
            seen.add(network)
        return values

    @field_validator("tags")
    @classmethod
    def _tags(cls, tags: dict[str, str]) -> dict[str, str]:
        if len(tags) > MAX_USER_TAGS:
            raise ValueError(f"{len(tags)} tags; at most {MAX_USER_TAGS} (AWS allows 50 and "
                             "sortie adds its own)")
        for key, value in tags.items():
            if not TAG_KEY.fullmatch(key) or key.lower().startswith(("aws:", "sortie-")):
                raise ValueError(f"{key[:80]!r} is not a tag key: 1-63 letters, digits and "
                                 "_.:=+@- (not aws: or sortie-, which are taken)")
            if not TAG_VALUE.fullmatch(value):
                raise ValueError(f"{key}: not a tag value: at most 256 letters, digits, spaces "
                                 "and _.:/=+@-")
        return tags

    @field_validator("owner")
    @classmethod
    def _owner(cls, owner: str) -> str:
        if not owner or len(owner) > 63 or not TAG_VALUE.fullmatch(owner):
            raise ValueError(f"{owner[:80]!r} is not an owner tag: 1-63 letters, digits, spaces "
                             "and _.:/=+@-")
        return owner

    @field_validator("fallback_zones")
    @classmethod
    def _zones_once(cls, zones: list[str]) -> list[str]:
        twice = [zone for zone in zones if zones.count(zone) > 1]
        if twice:
            raise ValueError(f"{twice[0]} is listed twice")
        return zones

    @property
    def instance(self) -> InstanceType:
        return CATALOG[self.instance_type]

    def is_spot(self, index: int) -> bool:
        """Whether node `index` runs on spot capacity (node 0 is the head)."""
        return self.spot and (index > 0 or self.nodes == 1)

    def sortie_tags(self) -> dict[str, str]:
        """The tags every taggable resource carries (the user's extra tags first)."""
        return {**self.tags, TAG_CLUSTER: self.cluster, TAG_RUN: self.run or self.cluster,
                TAG_OWNER: self.owner, TAG_EXPIRES: self.expires_tag,
                TAG_ID: self.sortie_id or self.cluster}

    @property
    def sweep_tag(self) -> tuple[str, str]:
        """The tag teardown's sweep looks for: this sortie's id (a stack launched before ids
        were given has only its cluster name)."""
        return (TAG_ID, self.sortie_id) if self.sortie_id else (TAG_CLUSTER, self.cluster)

    @property
    def expires_tag(self) -> str:
        """When the nodes' TTL runs out, as a tag value (set by `parse_spec` when not given)."""
        return self.expires_at.strftime("%Y-%m-%dT%H:%MZ") if self.expires_at else "unset"


def _check_against_catalog(spec: ClusterSpec) -> None:
    """Cross-field rules: the catalog, the region, the zone, world-open SSH."""
    choices = instance_types(spec.cloud)
    unbuilt = {name: why for name, _, why in facts(spec.cloud).not_built}
    if spec.instance_type in unbuilt:
        raise SpecError(f"{NAMESPACE}:instanceType: {spec.instance_type} is not built by sortie "
                        f"yet: {unbuilt[spec.instance_type]}")
    if spec.instance_type not in choices:
        raise SpecError(f"{NAMESPACE}:instanceType: {spec.instance_type!r} is not in the catalog "
                        f"for {spec.cloud}; choose one of {', '.join(choices)}")
    regions = spec.instance.regions
    if spec.region not in regions:
        raise SpecError(f"{NAMESPACE}:region: {spec.region} does not offer {spec.instance_type}; "
                        f"choose one of {', '.join(regions)}")
    zones = regions[spec.region]
    for key, zone in [("zone", spec.zone), *(("fallbackZones", z) for z in spec.fallback_zones)]:
        # No zones listed (AWS): a zone is the region and a letter, a to f (us-east-1a).
        if zone is not None and (zone not in zones if zones else
                                 not re.fullmatch(re.escape(spec.region) + r"[a-f]", zone)):
            allowed = ", ".join(zones) if zones else f"a zone of {spec.region}, e.g. {spec.region}a"
            raise SpecError(f"{NAMESPACE}:{key}: {zone} cannot host {spec.instance_type} in "
                            f"{spec.region}; choose {allowed}")
    cloud = facts(spec.cloud)
    if spec.image is not None and not cloud.image_rule.fullmatch(spec.image):
        raise SpecError(f"{NAMESPACE}:image: {spec.image[:80]!r} is not {cloud.image_kinds}")
    if spec.project is not None and not cloud.takes_project:
        raise SpecError(f"{NAMESPACE}:project: is a GCP setting; remove it for {spec.cloud}")
    cloud.check(spec)
    wide = [c for c in spec.ssh_allowed_cidrs if too_wide_for_ssh(c)]
    if wide and not spec.allow_world_ssh:
        raise SpecError(f"{NAMESPACE}:sshAllowedCidrs: {wide[0]} opens SSH to more than a /8 "
                        "(IPv6: a /32) of the internet; list your own networks, or set "
                        f"{NAMESPACE}:allowWorldSsh to true if you mean it")


def _one_line(error: ValidationError) -> str:
    first = error.errors()[0]
    key = ".".join(str(part) for part in first["loc"]) or "config"
    message = first["msg"].removeprefix("Value error, ")
    if first["type"] == "extra_forbidden":
        known = sorted(f.alias or name for name, f in ClusterSpec.model_fields.items())
        message = f"unknown setting; known settings: {', '.join(known)}"
    elif first["type"] == "missing":
        message = "required, not set"
    elif first["type"] == "literal_error":
        message = f"must be one of {', '.join(CLOUDS)}"
    got = first.get("input")
    suffix = f" (got {got!r})" if got is not None and first["type"] not in (
        "missing", "extra_forbidden") and not isinstance(got, dict) else ""
    return f"{NAMESPACE}:{key}: {message}{suffix}"


def parse_spec(values: Mapping[str, Any], stack: str) -> ClusterSpec:
    """Validate `sortie:` config values (keys without the namespace) into a spec.

    Values may be typed (from a YAML profile) or strings (as Pulumi hands them to a program:
    numbers and booleans as text, lists and maps as JSON)."""
    data: dict[str, Any] = {key: _decode(value) for key, value in values.items()}
    data.setdefault("cluster", re.sub(r"[^a-z0-9-]+", "-", stack.lower()).strip("-")[:40])
    user = re.sub(r"[^A-Za-z0-9 _.:/=+@-]", "-", os.environ.get("USER", ""))[:63]
    data.setdefault("owner", user or "unknown")
    try:
        spec = ClusterSpec.model_validate(data)
    except ValidationError as exc:
        raise SpecError(_one_line(exc)) from None
    _check_against_catalog(spec)
    if spec.expires_at is None:
        now = datetime.now(timezone.utc).replace(second=0, microsecond=0)
        spec = spec.model_copy(update={"expires_at": now + timedelta(hours=spec.ttl_hours)})
    return spec


def _decode(value: Any) -> Any:
    if isinstance(value, str) and value[:1] in ("[", "{"):
        try:
            return json.loads(value)
        except json.JSONDecodeError:
            return value
    return value


def spec_from_pulumi_config() -> ClusterSpec:
    """The spec of the running Pulumi program (`pulumi up`, or the mock runtime of a plan)."""
    import pulumi
    from pulumi.runtime.config import CONFIG, get_config_env

    everything = {**get_config_env(), **CONFIG.get()}
    prefix = NAMESPACE + ":"
    values = {key[len(prefix):]: value for key, value in everything.items()
              if key.startswith(prefix)}
    return parse_spec(values, pulumi.get_stack())


@pydantic.dataclasses.dataclass(frozen=True)
class CostEstimate:
    """Compute cost (no traffic or storage): enough to decide before launch; plus what stays
    billed after the TTL until teardown (``idle_usd_h``: addresses and disks the cloud keeps)."""

    on_demand_usd_h: float  # every node on-demand
    spot_usd_h: float  # as configured with spot: workers on spot, head on-demand
    ttl_hours: float
    price_date: str
    price_source: str
    idle_usd_h: float = 0.0  # after the TTL, until teardown
    idle_what: str = ""  # what is billed then

    def usd_per_hour(self, spot: bool) -> float:
        """At the launch terms: with spot (workers on spot, the head on-demand) or on-demand."""
        return self.spot_usd_h if spot else self.on_demand_usd_h

    @computed_field  # type: ignore[prop-decorator]
    @property
    def on_demand_ttl_usd(self) -> float:
        return round(self.on_demand_usd_h * self.ttl_hours, 2)

    @computed_field  # type: ignore[prop-decorator]
    @property
    def spot_ttl_usd(self) -> float:
        return round(self.spot_usd_h * self.ttl_hours, 2)


def launch_terms(spot: bool, nodes: int) -> str:
    """The terms a cluster is priced at, in words (sortie launches a spot cluster's head
    on-demand)."""
    return "spot workers, on-demand head" if spot and nodes > 1 else \
        "spot" if spot else "on-demand"


def estimate_cost(spec: ClusterSpec) -> CostEstimate:
    price = spec.instance.price(spec.region)
    with_spot = spec.model_copy(update={"spot": True})
    spot = sum(price.spot_usd_h if with_spot.is_spot(i) else price.on_demand_usd_h
               for i in range(spec.nodes))
    return CostEstimate(round(price.on_demand_usd_h * spec.nodes, 4), round(spot, 4),
                        spec.ttl_hours, price.date, price.source,
                        *facts(spec.cloud).idle_after_ttl(spec))
