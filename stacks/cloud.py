"""Cloud sorties through Pulumi's Automation API: one Pulumi stack per sortie.

`PulumiBackend` implements the backend interface (`stacks/backend.py`) on a stack built from a
profile: `up` creates the stack and its resources, `lost_nodes` refreshes and looks for missing
machines, `replace` runs `up` again (replacing machines that exist but are lost), `down` destroys,
refreshes, sweeps the cloud by the sortie tags and only then removes the stack.

Pulumi itself sits behind `StackHandle`, the few stack operations sortie uses. `AutomationStack`
is the real one (Pulumi CLI + inline program, state in a local file backend by default, secrets
by passphrase); tests drive the same backend through an in-repo double.

State on the controller, ``$SORTIE_HOME/stacks/<name>/``: ``sortie.json`` (profile, config,
created, expiry, price), ``client_key`` (0600), ``inventory.json``, ``known_hosts``.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any, Protocol

from tenacity import Retrying, retry_if_exception_type, stop_after_attempt, wait_exponential

from infra.spec import NAMESPACE, ClusterSpec, SpecError, estimate_cost, parse_spec
from stacks import naming
from stacks.backend import LaunchError, Leftover, Placement, Teardown
from stacks.errors import SortieError, UsageError
from stacks.inventory import Inventory, inventory_from_outputs

PULUMI_INSTALL = "https://www.pulumi.com/docs/install/"
PREEMPTION_NOTICE_S = {"aws": 150.0, "gcp": 45.0, "azure": 45.0}
# The resource type of a node's machine on each cloud; its name ends with "-node-<i>".
MACHINE_TYPES = ("aws:ec2/instance:Instance", "gcp:compute/instance:Instance",
                 "azure-native:compute:VirtualMachine")
# What holds a cluster's results: left in place when they could not be verified on the controller.
BUCKET_TYPES = ("aws:s3/", "gcp:storage/", "azure-native:storage:",
                "azure-native:resources:ResourceGroup")
# ... except the nodes' access to it, which goes with the nodes.
BUCKET_GRANT_TYPES = ("gcp:storage/bucketIAMMember:",)
# The same, as the tag sweeps name them.
BUCKET_KINDS = ("s3:bucket", "storage:bucket", "storage:storageAccounts",
                "resources:resourceGroups")
# Pulumi's own bookkeeping entries, not cloud resources.
BOOKKEEPING_TYPES = ("pulumi:pulumi:Stack", "pulumi:providers:", "sortie:")


class StackError(SortieError):
    """A Pulumi operation failed; the message is its last meaningful line."""


@dataclass(frozen=True)
class StackResource:
    urn: str
    type: str
    dependencies: tuple[str, ...] = ()  # URNs this resource depends on

    @property
    def name(self) -> str:
        return self.urn.rsplit("::", 1)[-1]

    @property
    def is_cloud_resource(self) -> bool:
        return not self.type.startswith(BOOKKEEPING_TYPES)


class StackHandle(Protocol):
    """The stack operations a sortie needs. Each raises StackError on failure."""

    def up(self, config: dict[str, Any], replace: list[str] | None = None) -> dict[str, Any]:
        """Set the config, deploy, return the outputs (secrets in clear)."""
        ...

    def config(self) -> dict[str, Any]:
        """The config the last `up` set ({} for a new stack): enough to tear it down from any
        controller that shares the state backend."""
        ...

    def refresh(self) -> None: ...

    def resources(self) -> list[StackResource]: ...

    def destroy(self, targets: list[str] | None = None) -> None: ...

    def remove(self) -> None:
        """Remove the (empty) stack from the state backend."""
        ...


class StackStore(Protocol):
    def open(self, name: str) -> StackHandle:
        """Create the stack, or select it when it exists."""
        ...

    def names(self) -> list[str]: ...


Sweep = Callable[[ClusterSpec], list[Leftover]]


def sweep_by_tags(spec: ClusterSpec) -> list[Leftover]:
    """Ask the cloud itself for resources that still carry the cluster's tag."""
    from stacks import sweep

    return sweep.leftovers(spec)


class PulumiBackend:
    """A profile's cluster as one Pulumi stack per sortie."""

    def __init__(self, profile: str, config: dict[str, Any], stacks: StackStore,
                 home: Path, sweep: Sweep = sweep_by_tags, retry_wait_s: float = 5.0) -> None:
        self.profile, self.config, self.stacks, self.sweep = profile, config, stacks, sweep
        self.home, self.retry_wait_s = home, retry_wait_s
        self.spec = self._spec("profile-check", config)  # a bad profile fails before anything
        self.name = self.spec.cloud
        self.preemption_notice_s = PREEMPTION_NOTICE_S[self.name]

    @staticmethod
    def _spec(cluster_id: str, config: dict[str, Any]) -> ClusterSpec:
        prefix = NAMESPACE + ":"
        values = {k[len(prefix):]: v for k, v in config.items() if k.startswith(prefix)}
        try:
            return parse_spec(values, cluster_id)
        except SpecError as exc:
            raise UsageError(str(exc)) from None

    def state_dir(self, cluster_id: str) -> Path:
        return naming.state_dir(self.home / "stacks", cluster_id)

    # -- up -------------------------------------------------------------------------------------

    def placements(self) -> list[Placement]:
        """The profile's zone, then each fallback zone; then on-demand if spot may fall back."""
        zones = [self.spec.zone, *self.spec.fallback_zones]
        attempts = [Placement(zone=zone) for zone in zones]
        if self.spec.spot and self.spec.spot_fallback_on_demand:
            attempts.append(Placement(zone=zones[0], spot=False))
        return attempts

    def up(self, cluster_id: str, nodes: int, placement: Placement | None = None) -> Inventory:
        placement = placement or Placement()
        expires = datetime.now(timezone.utc) + timedelta(hours=self.spec.ttl_hours)
        config = {**self.config, f"{NAMESPACE}:nodes": nodes,
                  # Fixed at launch: every later `up` (recovery) keeps the same tags and expiry.
                  f"{NAMESPACE}:expiresAt": expires.strftime("%Y-%m-%dT%H:%M:00Z")}
        if placement.zone is not None:
            config[f"{NAMESPACE}:zone"] = placement.zone
        if placement.spot is not None:
            config[f"{NAMESPACE}:spot"] = placement.spot
        spec = self._spec(cluster_id, config)
        state = self.state_dir(cluster_id)
        state.mkdir(parents=True, exist_ok=True, mode=0o700)
        (state / "sortie.json").write_text(json.dumps({
            "cluster": cluster_id, "profile": self.profile, "cloud": spec.cloud,
            "region": spec.region, "nodes": nodes, "created": time.time(),
            "expires_at": expires.timestamp(), "config": config,
            "usd_per_hour": usd_per_hour(spec)}, indent=2))
        stack = self.stacks.open(cluster_id)
        try:
            outputs = stack.up(config)
        except StackError as exc:
            self._destroy(stack, cluster_id)  # all or nothing: the partial cluster goes
            raise LaunchError(str(exc)) from None
        return self._inventory(cluster_id, outputs)

    def _inventory(self, cluster_id: str, outputs: dict[str, Any]) -> Inventory:
        state = self.state_dir(cluster_id)
        key_path = state / "client_key"
        key = outputs.pop("client_private_key", None)
        if not key:
            raise LaunchError("stack output client_private_key: missing")
        key_path.touch(mode=0o600)
        key_path.write_text(key if key.endswith("\n") else key + "\n")
        inventory = inventory_from_outputs(outputs, key_path)
        inventory.save_state(state)
        return inventory

    def _settings(self, cluster_id: str) -> dict[str, Any]:
        return json.loads((self.state_dir(cluster_id) / "sortie.json").read_text())

    # -- lost nodes -----------------------------------------------------------------------------

    def _machines(self, stack: StackHandle, cluster_id: str) -> dict[str, StackResource]:
        return {r.name.removeprefix(f"{cluster_id}-"): r for r in stack.resources()
                if r.type in MACHINE_TYPES}

    def lost_nodes(self, inventory: Inventory) -> list[str]:
        """Refresh the stack; a node whose machine the cloud no longer has is lost."""
        stack = self.stacks.open(inventory.cluster_id)
        stack.refresh()
        machines = self._machines(stack, inventory.cluster_id)
        return [n.name for n in inventory.nodes if n.name not in machines]

    def replace(self, inventory: Inventory, lost: list[str]) -> Inventory:
        """`up` again: Pulumi re-creates machines the refresh found gone; machines that still
        exist but were lost (SSH dead, preemption notice) are replaced explicitly."""
        stack = self.stacks.open(inventory.cluster_id)
        machines = self._machines(stack, inventory.cluster_id)
        replace = [machines[name].urn for name in lost if name in machines]
        config = self._settings(inventory.cluster_id)["config"]
        return self._inventory(inventory.cluster_id, stack.up(config, replace=replace))

    # -- down -----------------------------------------------------------------------------------

    def _destroy(self, stack: StackHandle, cluster_id: str,
                 targets: list[str] | None = None) -> None:
        """Destroy, retried: a cloud API may refuse once (a dependency still draining)."""
        retrying = Retrying(stop=stop_after_attempt(3), reraise=True,
                            wait=wait_exponential(multiplier=self.retry_wait_s, max=60),
                            retry=retry_if_exception_type(StackError))
        try:
            retrying(stack.destroy, targets)
        except StackError as exc:
            raise SortieError(f"destroying {cluster_id} failed 3 times: {exc}; run "
                              f"`sortie down {cluster_id}` again") from None

    def down(self, cluster_id: str, keep_bucket: bool = False) -> Teardown:
        """Destroy, then prove: a refresh shows 0 resources and a sweep of the cloud by the
        sortie tags finds none. With ``keep_bucket`` the bucket stays, in the stack."""
        report = Teardown(cluster_id)
        if not self.state_dir(cluster_id).exists() and cluster_id not in self.stacks.names():
            report.state_removed = True
            return report
        stack = self.stacks.open(cluster_id)
        stack.refresh()
        before = [r for r in stack.resources() if r.is_cloud_resource]
        buckets = [r for r in before if r.type.startswith(BUCKET_TYPES)
                   and not r.type.startswith(BUCKET_GRANT_TYPES)]
        kept = _with_dependencies(before, buckets) if keep_bucket else []
        targets = [r.urn for r in before if r not in kept] if kept else None
        if targets != []:
            try:
                self._destroy(stack, cluster_id, targets)
            except SortieError as exc:
                report.leftovers.append(Leftover("stack", cluster_id, str(exc)))
        stack.refresh()
        remaining = [r for r in stack.resources() if r.is_cloud_resource and r not in kept]
        report.removed = len(before) - len(kept) - len(remaining)
        report.leftovers += [Leftover(r.type, r.name, f"sortie down {cluster_id}")
                             for r in remaining]
        config = self._settings(cluster_id)["config"] \
            if (self.state_dir(cluster_id) / "sortie.json").exists() else stack.config()
        spec = self._spec(cluster_id, config or self.config)
        report.leftovers += [leftover for leftover in self.sweep(spec)
                             if not (kept and leftover.kind in BUCKET_KINDS)]
        if kept:
            report.kept.append(f"the bucket ({len(kept)} resources) in stack {cluster_id}; "
                               f"`sortie down {cluster_id}` removes it")
        elif not report.leftovers:
            stack.remove()
            shutil.rmtree(self.state_dir(cluster_id), ignore_errors=True)
            report.state_removed = True
        return report


def _with_dependencies(resources: list[StackResource],
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


# -- the real thing: Pulumi CLI through the Automation API ------------------------------------


def missing_for(cloud: str) -> list[str]:
    """What `sortie run --stack` on ``cloud`` lacks here: the Pulumi CLI, credentials."""
    missing = []
    if shutil.which("pulumi") is None:
        missing.append(f"the Pulumi CLI is not on PATH (install it: {PULUMI_INSTALL})")
    if not _has_credentials(cloud):
        missing.append({
            "aws": "no AWS credentials (set AWS_PROFILE or AWS_ACCESS_KEY_ID and "
                   "AWS_SECRET_ACCESS_KEY, or run `aws configure`)",
            "gcp": "no Google Cloud credentials (set GOOGLE_APPLICATION_CREDENTIALS or run "
                   "`gcloud auth application-default login`)",
            "azure": "no Azure credentials (set ARM_CLIENT_ID, ARM_CLIENT_SECRET, "
                     "ARM_TENANT_ID and ARM_SUBSCRIPTION_ID, or run `az login`)"}[cloud])
    return missing


def _has_credentials(cloud: str) -> bool:
    env, home = os.environ, Path.home()
    if cloud == "aws":
        import boto3
        from botocore.exceptions import BotoCoreError

        try:
            return boto3.session.Session().get_credentials() is not None
        except BotoCoreError:  # e.g. AWS_PROFILE names a profile that does not exist
            return False
    if cloud == "gcp":
        adc = env.get("GOOGLE_APPLICATION_CREDENTIALS") or str(
            home / ".config/gcloud/application_default_credentials.json")
        return bool(env.get("GOOGLE_CREDENTIALS")) or Path(adc).is_file()
    return bool(env.get("ARM_CLIENT_ID") and (env.get("ARM_CLIENT_SECRET")
                                              or env.get("ARM_USE_MSI")
                                              or env.get("ARM_USE_OIDC"))) or \
        (home / ".azure" / "azureProfile.json").is_file()


def _passphrase(home: Path) -> str:
    """The passphrase that encrypts stack secrets: PULUMI_CONFIG_PASSPHRASE if set, else one
    generated once per SORTIE_HOME (0600), so `sortie reap` from cron can decrypt too."""
    if "PULUMI_CONFIG_PASSPHRASE" in os.environ:
        return os.environ["PULUMI_CONFIG_PASSPHRASE"]
    path = home / "pulumi" / "passphrase"
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        path.touch(mode=0o600)
        path.write_text(secrets.token_urlsafe(32))
    return path.read_text().strip()


def _one_line(exc: Exception) -> str:
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    errors = [line for line in lines if "error:" in line.lower()]
    return (errors or lines or [type(exc).__name__])[-1][:400]


class AutomationStack:
    """A Pulumi stack driven through the Automation API, running `infra.program.main` inline."""

    def __init__(self, stack: Any) -> None:
        self.stack = stack

    def _call(self, what: str, operation: Callable[[], Any]) -> Any:
        from pulumi.automation.errors import CommandError

        try:
            return operation()
        except CommandError as exc:
            raise StackError(f"pulumi {what}: {_one_line(exc)}") from None

    def up(self, config: dict[str, Any], replace: list[str] | None = None) -> dict[str, Any]:
        from pulumi import automation as auto

        self.stack.set_all_config({
            key: auto.ConfigValue(value if isinstance(value, str) else json.dumps(value))
            for key, value in config.items()})
        result = self._call("up", lambda: self.stack.up(replace=replace or None,
                                                         on_output=lambda _line: None))
        return {key: output.value for key, output in result.outputs.items()}

    def config(self) -> dict[str, Any]:
        # Values as `up` set them: strings, lists and numbers as JSON (parse_spec reads both).
        config = self._call("config", self.stack.get_all_config)
        return {key: value.value for key, value in config.items()}

    def refresh(self) -> None:
        self._call("refresh", lambda: self.stack.refresh(on_output=lambda _line: None))

    def resources(self) -> list[StackResource]:
        deployment = self._call("stack export", self.stack.export_stack).deployment or {}
        return [StackResource(r["urn"], r["type"], tuple(r.get("dependencies") or ()))
                for r in deployment.get("resources", [])]

    def destroy(self, targets: list[str] | None = None) -> None:
        self._call("destroy", lambda: self.stack.destroy(target=targets,
                                                          on_output=lambda _line: None))

    def remove(self) -> None:
        self._call("stack rm", lambda: self.stack.workspace.remove_stack(self.stack.name))


class AutomationStacks:
    """Stacks of the `sortie` project in a state backend: a local file backend by default
    (`$SORTIE_HOME/pulumi/state`, no Pulumi Cloud account needed) or a bucket URL."""

    def __init__(self, home: Path, backend_url: str | None = None) -> None:
        self.home = home
        state = home / "pulumi" / "state"
        self.backend_url = backend_url or f"file://{state}"
        if backend_url is None:
            state.mkdir(parents=True, exist_ok=True, mode=0o700)

    def _options(self, name: str) -> Any:
        from pulumi import automation as auto

        work_dir = self.home / "pulumi" / "work"
        work_dir.mkdir(parents=True, exist_ok=True)
        return auto.LocalWorkspaceOptions(
            work_dir=str(work_dir), secrets_provider="passphrase",
            env_vars={"PULUMI_CONFIG_PASSPHRASE": _passphrase(self.home)},
            project_settings=auto.ProjectSettings(
                name="sortie", runtime="python",
                backend=auto.ProjectBackend(url=self.backend_url)))

    def open(self, name: str) -> AutomationStack:
        from pulumi import automation as auto

        from infra.program import main

        return AutomationStack(auto.create_or_select_stack(
            stack_name=name, project_name="sortie", program=main, opts=self._options(name)))

    def names(self) -> list[str]:
        from pulumi import automation as auto

        workspace = auto.LocalWorkspace(**vars(self._options("")))
        return [summary.name for summary in workspace.list_stacks()]


# -- sorties this controller launched ----------------------------------------------------------


def cloud_sortie_names(home: Path) -> list[str]:
    stacks = home / "stacks"
    return [name for name in naming.names_in(stacks)
            if (stacks / name / "sortie.json").is_file()]


def sortie_settings(home: Path, name: str) -> dict[str, Any]:
    """What `up` recorded about a cloud sortie (profile, config, created, expiry, $/h)."""
    return json.loads((naming.state_dir(home / "stacks", name) / "sortie.json").read_text())


@dataclass(frozen=True)
class CloudSortie:
    """A cloud sortie as `status` and `reap` see it."""

    name: str
    cloud: str
    nodes: int
    created: float  # epoch seconds
    expires_at: float
    usd_per_hour: float
    config: dict[str, Any]  # what it was launched with: enough to tear it down from anywhere

    def status_row(self, now: float) -> dict[str, Any]:
        age, ttl_left = now - self.created, self.expires_at - now
        return {"name": self.name, "backend": self.cloud, "nodes": self.nodes, "nodes_up": None,
                "age_s": round(age), "state": "expired" if ttl_left <= 0 else "up",
                "usd_so_far": round(self.usd_per_hour * age / 3600, 2),
                "ttl_left_s": round(max(0.0, ttl_left))}


def recorded_sorties(home: Path) -> list[CloudSortie]:
    """The cloud sorties this controller launched, from what their `up` recorded."""
    found = []
    for name in cloud_sortie_names(home):
        settings = sortie_settings(home, name)
        found.append(CloudSortie(name, settings["cloud"], settings["nodes"], settings["created"],
                                 settings["expires_at"], settings["usd_per_hour"],
                                 settings["config"]))
    return found


def sorties_in_backend(stacks: StackStore, skip: set[str]) -> list[CloudSortie]:
    """The sorties in a state backend, whichever controller launched them (``skip``: those
    already known), from each stack's own config: launched at its expiry less its TTL. A stack
    without `sortie:expiresAt` was not launched by `sortie run` and is left out."""
    found = []
    for name in stacks.names():
        if name in skip:
            continue
        config = stacks.open(name).config()
        if not config.get(f"{NAMESPACE}:expiresAt"):
            continue
        spec = PulumiBackend._spec(name, config)
        assert spec.expires_at is not None  # set from the config above
        expires = spec.expires_at.timestamp()
        found.append(CloudSortie(name, spec.cloud, spec.nodes, expires - spec.ttl_hours * 3600,
                                 expires, usd_per_hour(spec), config))
    return found


def usd_per_hour(spec: ClusterSpec) -> float:
    """The cluster's estimated $/h at its launch terms (spot or on-demand)."""
    cost = estimate_cost(spec)
    return cost.spot_usd_h if spec.spot else cost.on_demand_usd_h


def backend_stacks(home: Path, backend_url: str | None) -> AutomationStacks | None:
    """The state backend to list: --backend-url, else this controller's file backend when it
    has one. None when there is none to look in."""
    if backend_url is None and not (home / "pulumi" / "state").is_dir():
        return None
    if shutil.which("pulumi") is None:
        if backend_url is None:
            return None  # no CLI: this controller never created a stack there
        raise UsageError(f"--backend-url: listing stacks needs the Pulumi CLI, which is not on "
                         f"PATH (install it: {PULUMI_INSTALL})")
    return AutomationStacks(home, backend_url)


def require_cloud_tools(cloud: str, what: str) -> None:
    """One line naming everything missing to drive ``cloud`` here, before anything is created."""
    missing = missing_for(cloud)
    if missing:
        raise UsageError(f"cannot {what}: {' and '.join(missing)}; nothing was created")


def backend_for_profile(profile: str, config: dict[str, Any], home: Path,
                        backend_url: str | None = None) -> PulumiBackend:
    """The real backend for a profile, after checking the CLI and credentials are there."""
    spec = PulumiBackend._spec("profile-check", config)  # a bad profile is named first
    require_cloud_tools(spec.cloud, f"run stack {profile}")
    return PulumiBackend(profile, config, AutomationStacks(home, backend_url), home)


def backend_for_stack(home: Path, name: str, config: dict[str, Any],
                      stacks: StackStore) -> PulumiBackend:
    """The backend for a stack another controller launched, from the stack's own config."""
    spec = PulumiBackend._spec(name, config)
    require_cloud_tools(spec.cloud, f"tear down {name}")
    return PulumiBackend("(from the state backend)", config, stacks, home)


def backend_for_sortie(home: Path, name: str, backend_url: str | None = None) -> PulumiBackend:
    settings = sortie_settings(home, name)
    require_cloud_tools(settings["cloud"], f"tear down {name}")
    return PulumiBackend(settings["profile"], settings["config"],
                         AutomationStacks(home, backend_url), home)
