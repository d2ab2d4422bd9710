"""Run the real cluster program offline, under Pulumi's mock runtime (`pulumi.runtime.set_mocks`).

No cloud credentials and no Pulumi CLI: every resource the program declares is recorded with its
inputs and parent, and answered with plausible outputs (addresses, ARNs, real SSH keys), so the
outputs can be turned into an inventory exactly as after `pulumi up`. `sortie plan` and the tests
use this; the program itself does not know it is being evaluated offline.
"""

from __future__ import annotations

import base64
import ipaddress
import itertools
import json
import threading
import uuid
from typing import Any

import pulumi
from google.protobuf import json_format
from pulumi.runtime import rpc
from pulumi.runtime.mocks import MockMonitor

from sortie.infra.keys import ed25519_key_pair
from sortie.infra.program import declare_cluster
from sortie.infra.review import DeclaredResource, Evaluation
from sortie.infra.spec import spec_from_pulumi_config

PROJECT = "sortie"
AZURE_SUBSCRIPTION = "00000000-0000-0000-0000-0000000ff11e"
AZURE_OFFLINE_TENANT = "00000000-0000-0000-0000-000000007e4a"
AZURE_OFFLINE_PRINCIPAL = "00000000-0000-0000-0000-0000000c11e4"
# Azure resources whose name is an input (the rest are auto-named from the Pulumi name).
AZURE_NAME_INPUTS = {"resources:ResourceGroup": "resourceGroupName",
                     "storage:StorageAccount": "accountName", "compute:VirtualMachine": "vmName",
                     "storage:BlobContainer": "containerName",
                     "compute:AvailabilitySet": "availabilitySetName",
                     "keyvault:Vault": "vaultName", "keyvault:Secret": "secretName"}


def _openssh_key_pair() -> dict[str, str]:
    """The outputs of a `tls:index/privateKey:PrivateKey` with algorithm ED25519."""
    pair = ed25519_key_pair()
    return {"privateKeyOpenssh": pair.private_openssh, "publicKeyOpenssh": pair.public_openssh
            + "\n", "publicKeyFingerprintSha256": pair.fingerprint}


class OfflineMocks(pulumi.runtime.Mocks):
    """Answers resources and invokes the way the clouds would, with documentation addresses."""

    def __init__(self) -> None:
        self._public_hosts = ipaddress.ip_network("198.18.0.0/15").hosts()  # benchmarking range
        self._private = itertools.count(10)
        # Pulumi calls the mocks from several threads at once: a generator shared between them
        # raises "generator already executing" (seen with 101 nodes).
        self._lock = threading.Lock()

    def _public_ip(self) -> str:
        with self._lock:
            return str(next(self._public_hosts))

    def _private_ip(self) -> str:
        with self._lock:
            n = next(self._private)
        return f"10.42.{n // 250}.{n % 250 + 4}"

    def new_resource(self, args: pulumi.runtime.MockResourceArgs) -> tuple[str, dict]:
        state = dict(args.inputs)
        resource_id = f"{args.name}-id"
        token = args.typ
        if token == "tls:index/privateKey:PrivateKey":
            state.update(_openssh_key_pair())
        elif token in ("aws:ec2/instance:Instance", "aws:ec2/eip:Eip"):
            state.update(publicIp=self._public_ip(), privateIp=self._private_ip(),
                         primaryNetworkInterfaceId=f"eni-{args.name}")
        elif token == "aws:s3/bucket:Bucket":
            state["bucket"] = f"{args.inputs.get('bucketPrefix', 'sortie-')}offline"
            resource_id = state["bucket"]
        elif token == "aws:ec2/launchTemplate:LaunchTemplate":
            state["latestVersion"] = 1
        elif token == "aws:ec2/keyPair:KeyPair":
            state["keyName"] = f"{args.inputs.get('keyNamePrefix', '')}offline"
        elif token == "gcp:compute/instance:Instance":
            state["networkInterfaces"] = [
                {**nic, "networkIp": self._private_ip(),
                 "accessConfigs": [{**access, "natIp": self._public_ip()}
                                   for access in nic.get("accessConfigs", [])]}
                for nic in args.inputs.get("networkInterfaces", [])]
        elif token == "gcp:serviceaccount/account:Account":
            state["email"] = f"{args.inputs['accountId']}@offline.iam.gserviceaccount.com"
            state["member"] = f"serviceAccount:{state['email']}"
        elif token == "gcp:secretmanager/secret:Secret":
            state.setdefault("project", "offline-project")  # the provider's default project
            state["name"] = f"projects/{state['project']}/secrets/{args.inputs['secretId']}"
            resource_id = state["name"]
        elif token == "gcp:storage/bucket:Bucket":
            state.setdefault("name", f"{args.name}-offline")  # Pulumi's auto-name
        elif token == "gcp:compute/resourcePolicy:ResourcePolicy":
            state["selfLink"] = f"https://compute.googleapis.com/offline/{args.name}"
        elif token.startswith("azure-native:"):
            resource_id = self._azure(token, args.name, args.inputs, state)
        if token.startswith("aws:"):
            resource = token.split(":")[1].split("/")[0]
            state.setdefault("arn", f"arn:aws:{resource}:::{state.get('bucket', resource_id)}")
            state.setdefault("name", args.name)
        return resource_id, state

    def _azure(self, token: str, name: str, inputs: dict, state: dict) -> str:
        """Fill in what Azure computes; return an ARM-shaped resource id."""
        kind = token.split(":", 1)[1]
        if kind in AZURE_NAME_INPUTS:
            state["name"] = inputs[AZURE_NAME_INPUTS[kind]]
        state.setdefault("name", name)
        if kind == "network:PublicIPAddress":
            state["ipAddress"] = self._public_ip()
        elif kind == "network:NetworkInterface":
            state["ipConfigurations"] = [{**config, "privateIPAddress": self._private_ip()}
                                         for config in inputs.get("ipConfigurations", [])]
        elif kind == "managedidentity:UserAssignedIdentity":
            state["principalId"] = str(uuid.uuid5(uuid.NAMESPACE_URL, name))
            state["clientId"] = str(uuid.uuid5(uuid.NAMESPACE_DNS, name))
        elif kind == "compute:VirtualMachine" and "identity" in inputs:
            # In v3 the identities go in as a list of ids and come back as a map by id.
            identity = inputs["identity"]
            state["identity"] = {**identity, "userAssignedIdentities": {
                i: {} for i in identity.get("userAssignedIdentities", [])}}
        elif kind == "keyvault:Vault":
            state["properties"] = {**inputs["properties"],
                                   "vaultUri": f"https://{state['name']}.vault.azure.net/"}
        subscription = f"/subscriptions/{AZURE_SUBSCRIPTION}"
        if kind == "resources:ResourceGroup":
            return f"{subscription}/resourceGroups/{state['name']}"
        if kind == "keyvault:Secret":  # a child of its vault
            return (f"{subscription}/resourceGroups/{inputs['resourceGroupName']}/providers/"
                    f"Microsoft.KeyVault/vaults/{inputs['vaultName']}/secrets/{state['name']}")
        module, cls = kind.split(":")
        return (f"{subscription}/resourceGroups/{inputs.get('resourceGroupName', 'none')}/"
                f"providers/Microsoft.{module}/{cls[0].lower()}{cls[1:]}s/{state['name']}")

    def call(self, args: pulumi.runtime.MockCallArgs) -> dict:
        if args.token == "aws:ec2/getAmi:getAmi":
            return {"id": "ami-0offline0000000000", "name": "offline DLAMI",
                    "rootDeviceName": "/dev/sda1", "architecture": "x86_64"}
        if args.token == "azure-native:authorization:getClientConfig":
            return {"clientId": AZURE_OFFLINE_PRINCIPAL, "objectId": AZURE_OFFLINE_PRINCIPAL,
                    "subscriptionId": AZURE_SUBSCRIPTION, "tenantId": AZURE_OFFLINE_TENANT}
        if args.token == "aws:ec2/getInstanceTypeOfferings:getInstanceTypeOfferings":
            # Offline, every zone offers every type: the real `up` asks the region.
            region = args.args.get("region", "us-east-1")
            zones = [f"{region}{letter}" for letter in "abc"]
            return {"id": region, "locations": zones, "locationTypes": ["availability-zone"] * 3,
                    "instanceTypes": [args.args["filters"][0]["values"][0]] * 3}
        raise NotImplementedError(f"offline evaluation cannot answer {args.token}")


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
        cluster = declare_cluster(spec)
        return pulumi.Output.all(**cluster.outputs).apply(outputs.update)

    program()
    return Evaluation(spec, monitor.declared(), outputs)
