"""Run the real cluster program offline, under Pulumi's mock runtime (`pulumi.runtime.set_mocks`).

No cloud credentials and no Pulumi CLI: every resource the program declares is recorded with its
inputs and parent, and answered with plausible outputs (addresses, ARNs, real SSH keys), so the
outputs can be turned into an inventory exactly as after `pulumi up`. `sortie plan` and the tests
use this; the program itself does not know it is being evaluated offline.
"""

from __future__ import annotations

import base64
import copy
import ipaddress
import itertools
import json
import threading
from typing import Any

import pulumi
from google.protobuf import json_format
from pulumi.runtime import rpc
from pulumi.runtime.mocks import MockMonitor

from sortie.infra.cloud_mocks import mocks
from sortie.infra.clouds import CLOUDS
from sortie.infra.keys import ed25519_key_pair
from sortie.infra.program import declare_cluster
from sortie.infra.review import DeclaredResource, Evaluation
from sortie.infra.spec import spec_from_pulumi_config

PROJECT = "sortie"


def _openssh_key_pair() -> dict[str, str]:
    """The outputs of a `tls:index/privateKey:PrivateKey` with algorithm ED25519."""
    pair = ed25519_key_pair()
    return {"privateKeyOpenssh": pair.private_openssh, "publicKeyOpenssh": pair.public_openssh
            + "\n", "publicKeyFingerprintSha256": pair.fingerprint}


class OfflineMocks(pulumi.runtime.Mocks):
    """Answers resources and invokes the way the clouds would (each cloud's own answers in its
    folder), with documentation addresses."""

    def __init__(self) -> None:
        self._public_hosts = ipaddress.ip_network("198.18.0.0/15").hosts()  # benchmarking range
        self._private = itertools.count(10)
        # Pulumi calls the mocks from several threads at once: a generator shared between them
        # raises "generator already executing" (seen with 101 nodes).
        self._lock = threading.Lock()
        # Each cloud's own answers, by its provider's token prefix (`infra/<cloud>/mocks.py`).
        self._clouds = {m.provider: m for m in (mocks(cloud) for cloud in CLOUDS)}

    def public_ip(self) -> str:
        with self._lock:
            return str(next(self._public_hosts))

    def private_ip(self) -> str:
        with self._lock:
            n = next(self._private)
        return f"10.42.{n // 250}.{n % 250 + 4}"

    def new_resource(self, args: pulumi.runtime.MockResourceArgs) -> tuple[str, dict]:
        state = dict(args.inputs)
        if args.typ == "tls:index/privateKey:PrivateKey":
            state.update(_openssh_key_pair())
        cloud = self._clouds.get(args.typ.split(":", 1)[0])
        resource_id = cloud.new_resource(args.typ, args.name, args.inputs, state, self) \
            if cloud else None
        return resource_id or f"{args.name}-id", state

    def call(self, args: pulumi.runtime.MockCallArgs
             ) -> tuple[dict, list[tuple[str, str]] | None]:
        cloud = self._clouds.get(args.token.split(":", 1)[0])
        answer = cloud.call(args.token, dict(args.args)) if cloud else None
        if answer is None:
            raise NotImplementedError(f"offline evaluation cannot answer {args.token}")
        return answer, []  # (no check failures: Pulumi iterates them)


# Pulumi's wire format marks special values with this key: a secret, a resource reference, an
# asset or archive (sdk/proto: "4dabf18193072939515e22adb298388d" and the values below).
SIGNATURE = "4dabf18193072939515e22adb298388d"
SECRET_SIGNATURE = "1b47061264138c4ac30d75fd1eb44270"
RESOURCE_SIGNATURE = "5cf8f73096256a8f31e491e813e4eb8e"
REDACTED = "[secret]"
# Inputs that hold a secret whatever the program marked: offline, a mock's outputs (a generated
# private key) are plain values, which a real `tls.PrivateKey` would mark secret.
SECRET_INPUTS = frozenset({"secretString", "secretData", "privateKeyOpenssh", "privateKeyPem",
                           "password", "adminPassword"})


def redacted(value: Any, key: str = "") -> Any:
    """Inputs as JSON data a reviewer may see: secrets (marked, named as such, or holding key
    material) replaced by ``REDACTED``, a resource reference by its URN, and a value known only
    after `up` said to be so."""
    if key in SECRET_INPUTS:
        return REDACTED
    if isinstance(value, dict):
        signature = value.get(SIGNATURE)
        if signature == SECRET_SIGNATURE:
            return REDACTED
        if signature == RESOURCE_SIGNATURE:
            return value.get("urn", "")
        if signature is not None:
            return f"[{signature}]"
        return {name: redacted(item, name) for name, item in value.items()}
    if isinstance(value, list):
        return [redacted(item) for item in value]
    if isinstance(value, str):
        if value == rpc.UNKNOWN:
            return "[known after up]"
        if "PRIVATE KEY" in value or "PRIVATE KEY" in _base64_text(value):
            return REDACTED
    return value


def _base64_text(value: str) -> str:
    """``value`` decoded, when it is base64 (a launch template's user data), else ""."""
    if len(value) < 64 or len(value) % 4:
        return ""
    try:
        return base64.b64decode(value, validate=True).decode("utf-8", "replace")
    except ValueError:
        return ""


class RecordingMonitor(MockMonitor):
    """The mock engine, remembering each resource's parent, what it depends on and its inputs
    as declared (the mocks never see the first two, and see secrets unmarked)."""

    def __init__(self, mocks: pulumi.runtime.Mocks) -> None:
        super().__init__(mocks)
        self.parents: dict[str, str] = {}
        self.dependencies: dict[str, tuple[str, ...]] = {}  # what each resource waits for
        self.inputs: dict[str, dict[str, Any]] = {}

    def RegisterResource(self, request: Any) -> Any:  # noqa: N802 (the engine's RPC name)
        response = super().RegisterResource(request)
        self.parents[response.urn] = request.parent
        self.dependencies[response.urn] = tuple(request.dependencies)
        self.inputs[response.urn] = redacted(json_format.MessageToDict(request.object))
        return response

    def declared(self) -> list[DeclaredResource]:
        found = []
        for urn, registration in self.resources.items():
            token, name = urn.split("::")[2].split("$")[-1], urn.split("::")[3]
            found.append(DeclaredResource(urn, token, name, self.parents.get(urn, ""),
                                          dict(registration.state), registration.id or "",
                                          self.dependencies.get(urn, ()),
                                          self.inputs.get(urn, {})))
        return found


def config_strings(values: dict[str, Any]) -> dict[str, str]:
    """Profile values the way Pulumi hands config to a program: text, JSON for structures."""
    return {key: value if isinstance(value, str) else json.dumps(value)
            for key, value in values.items()}


def _without_sdk_aliases(
        args: pulumi.ResourceTransformationArgs) -> pulumi.ResourceTransformationResult | None:
    """A resource's options without the aliases its SDK gave it. azure-native names every older
    API version of a type as an alias (~24 a resource): a real engine matches them against a
    stack's state, which an offline run has none of, and turning each into a URN was about half
    of an Azure evaluation's time (1.6 s of 2.5 s, 956 URNs for 40 resources)."""
    if not args.opts.aliases:
        return None
    opts = copy.copy(args.opts)
    opts.aliases = None
    return pulumi.ResourceTransformationResult(args.props, opts)


def evaluate(config: dict[str, Any], stack: str,
             mocks: pulumi.runtime.Mocks | None = None) -> Evaluation:
    """Run the program for `config` (full keys like "sortie:nodes") and record what it declares.

    Raises `infra.spec.SpecError` for a bad config before any resource is declared."""
    monitor = RecordingMonitor(mocks or OfflineMocks())
    pulumi.runtime.set_mocks(monitor.mocks, project=PROJECT, stack=stack, preview=False,
                             monitor=monitor)
    pulumi.runtime.set_all_config(config_strings(config))
    spec = spec_from_pulumi_config()
    outputs: dict[str, Any] = {}

    @pulumi.runtime.test
    def program() -> pulumi.Output:
        root = pulumi.runtime.get_root_resource()  # (kept from one evaluation to the next)
        if root is not None and _without_sdk_aliases not in (root._transformations or []):
            pulumi.runtime.register_stack_transformation(_without_sdk_aliases)
        cluster = declare_cluster(spec)
        return pulumi.Output.all(**cluster.outputs).apply(outputs.update)

    program()
    return Evaluation(spec, monitor.declared(), outputs)
