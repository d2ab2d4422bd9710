"""A rehearsal of a cloud profile (`sortie run --stack PROFILE --rehearse`): the profile's program
evaluated offline (as `sortie plan` does: the mock runtime, `infra/offline.py`), and one booted
local node per planned node handed exactly the user data the program declares for it. What the
node's image and the cloud give it besides, as the cloud would:

- its login user, made from the key pair (the cloud's agent; here cloud-init's default user,
  with the program's client key in the NoCloud meta-data);
- its torch environment where the cloud's image has it (the controller's, bound there);
- stand-ins for the cloud's metadata service and secret store at the cloud's own address and
  names (`stacks/booted/standins.py`, answering as `infra/<cloud>/rehearsal.py` says), whose
  TLS certificate the node trusts (a CA made per cluster, added to the node's trust store);
- delays: the secret store refuses the node until its grant has propagated (`key`), the node
  answers on its address only once that is attached (`address`), and it boots late (`boot`).

The plan (per node: its user data, its secret, its identity) is kept in the cluster's state, so
a replacement node, started by any process, gets the same.

    <state>/rehearsal.json       the plan
    <state>/rehearsal/           the CA and the stand-ins' certificate and key
"""

from __future__ import annotations

import dataclasses
import datetime
import ipaddress
import json
import os
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field

from sortie.core import statefile
from sortie.core.errors import UsageError
from sortie.core.inventory import Node
from sortie.cost.money import usd_per_hour
from sortie.infra.cloud_rehearsal import METADATA_ADDRESS, CloudRehearsal, NodeSide, rehearsal
from sortie.infra.spec import SpecError, estimate_cost
from sortie.stacks.booted.node import BootedNode
from sortie.stacks.booted.standins import StandinConfig
from sortie.stacks.listing import SortieRow
from sortie.stacks.profiles import apply_overrides, load_profile

PLAN_FILE = "rehearsal.json"
TLS_DIR = "rehearsal"
DELAYS_ENV = "SORTIE_REHEARSE_DELAYS"  # e.g. "boot=60,key=30,address=10,notice=120"
# By default a container boots and its address answers at once; a role grant takes what the
# cloud documents (`grant_s`: AWS seconds, GCP typically 2 minutes, Azure up to 10), and a spot
# node lives its documented notice (`notice_s`), so that a controller that waits too little
# fails here as it would there.
MAX_DELAY_S = 3600.0


class Delays(BaseModel):
    boot: float = Field(ge=0, le=MAX_DELAY_S)
    key: float = Field(ge=0, le=MAX_DELAY_S)
    address: float = Field(ge=0, le=MAX_DELAY_S)
    notice: float = Field(ge=0, le=MAX_DELAY_S)


class RehearsedNode(BaseModel):
    name: str
    user_data: str
    host_key: str  # the pinned public half (the program's outputs)
    secret_id: str
    secret_value: str  # the host private key, as the cloud's secret store holds it
    identity: dict[str, str] = Field(default_factory=dict)


class RehearsalPlan(BaseModel):
    profile: str
    cloud: str
    region: str
    instance_type: str = Field(default="", max_length=80)  # what the metadata stand-in says
    login_user: str
    workdir: str
    python: str  # the outputs' (the probe's link)
    python_home: str
    hostnames: list[str]
    train_env: dict[str, str]
    client_private_key: str
    delays: Delays
    nodes: list[RehearsedNode]
    # What `status` says of it: what the cloud would charge (at the profile's terms), and its
    # TTL, which the program's own timer keeps on the booted nodes (they power off).
    usd_per_hour: float = Field(default=0.0, ge=0, allow_inf_nan=False)
    ttl_hours: float | None = Field(default=None, gt=0)

    def node(self, index: int) -> RehearsedNode:
        return self.nodes[index]


PHASES = ("boot", "key", "address", "notice")


def given_delays(given: str | None = None) -> dict[str, float]:
    """$SORTIE_REHEARSE_DELAYS (or ``given``), checked: ``phase=seconds,...`` (asked before a
    rehearsal starts: a bad one is one line, exit 2, with nothing made)."""
    values: dict[str, float] = {}
    text = os.environ.get(DELAYS_ENV, "") if given is None else given
    for entry in filter(None, (e.strip() for e in text.split(","))):
        phase, _, seconds = entry.partition("=")
        if phase not in PHASES:
            raise UsageError(f"{DELAYS_ENV}: {phase[:40]!r} is not a phase ({', '.join(PHASES)})")
        try:
            values[phase] = float(seconds)
        except ValueError:
            raise UsageError(f"{DELAYS_ENV}: {entry[:40]!r}: seconds expected (e.g. key=30)"
                             ) from None
        if not 0 <= values[phase] <= MAX_DELAY_S:
            raise UsageError(f"{DELAYS_ENV}: {entry[:40]!r}: between 0 and {MAX_DELAY_S:g} s")
    return values


def delays(cloud: CloudRehearsal, given: str | None = None) -> Delays:
    """$SORTIE_REHEARSE_DELAYS over the cloud's documented figures."""
    values: dict[str, Any] = {"boot": 0.0, "key": cloud.grant_s, "address": 0.0,
                              "notice": cloud.notice_s}
    return Delays(**{**values, **given_delays(given)})


def _pinned(node: Node) -> str:
    if not node.host_key:  # (a cloud program's outputs always pin one)
        raise UsageError(f"{node.name}: the program's outputs pin no host key")
    return node.host_key


def plan_rehearsal(profile: str, overrides: tuple[str, ...], cluster_id: str) -> RehearsalPlan:
    """Evaluate ``profile`` (with ``--set`` overrides) for ``cluster_id`` offline, and take from
    what its program declares each node's user data, secret and identity."""
    from sortie.stacks.cloud.outputs import inventory_from_outputs  # (a rehearsal's only)

    try:
        # Pulumi's runtime loads only for a rehearsal (a third of a second at every start).
        from sortie.infra.offline import evaluate

        evaluation = evaluate(apply_overrides(load_profile(profile), overrides), cluster_id)
    except SpecError as exc:
        raise UsageError(f"profile {profile}: {exc}") from None
    spec, outputs = evaluation.spec, evaluation.outputs
    cloud = rehearsal(spec.cloud)
    inventory = inventory_from_outputs(outputs, Path("/nonexistent"))  # (validated outputs)
    private_keys = {r.state.get("publicKeyOpenssh", "").strip(): r.state["privateKeyOpenssh"]
                    for r in evaluation.of_type("tls:index/privateKey:PrivateKey")}
    nodes = [RehearsedNode(name=node.name, user_data=cloud.user_data(evaluation, node.name),
                           host_key=_pinned(node), secret_id=cloud.secret_id(evaluation, node.name),
                           secret_value=private_keys[_pinned(node).strip()],
                           identity=cloud.identity(evaluation, node.name))
             for node in inventory.nodes]
    head = inventory.nodes[0]
    return RehearsalPlan(
        profile=profile, cloud=spec.cloud, region=spec.region,
        instance_type=spec.instance_type, login_user=head.user,
        workdir=head.workdir, python=head.python, python_home=cloud.python_home,
        hostnames=list(cloud.hostnames(evaluation)), train_env=dict(inventory.train_env),
        client_private_key=outputs["client_private_key"], delays=delays(cloud),
        nodes=nodes, usd_per_hour=estimate_cost(spec).usd_per_hour(spec.spot),
        ttl_hours=spec.ttl_hours)


def save_plan(state: Path, plan: RehearsalPlan) -> None:
    statefile.write_json(state / PLAN_FILE, plan.model_dump())
    (state / PLAN_FILE).chmod(0o600)  # host private keys


def load_plan(state: Path) -> RehearsalPlan | None:
    path = state / PLAN_FILE
    return statefile.read_model(RehearsalPlan, path) if path.is_file() else None


def described_rehearsal(row: SortieRow, plan: RehearsalPlan, created: float, now: float) -> None:
    """A rehearsed cluster's `status` row: the cloud and profile it rehearses, what that cloud
    would charge (its $/h here is the local one's), and its TTL (the program's timer powers its
    nodes off)."""
    row.backend, row.profile = f"{plan.cloud} rehearsal", plan.profile
    row.rehearsal_usd_per_hour = plan.usd_per_hour
    if plan.ttl_hours is not None:
        row.ttl_left_s = round(max(0.0, created + plan.ttl_hours * 3600 - now))
    said = (f"rehearsal of profile {plan.profile} ({plan.cloud}, {plan.region}), its nodes "
            f"booted here; on {plan.cloud} it would cost {usd_per_hour(plan.usd_per_hour)}")
    row.detail = f"{said}; {row.detail}" if row.detail else said


# -- the stand-ins' TLS: a CA per cluster, which its nodes trust ----------------------------------

def make_tls(state: Path, hostnames: list[str]) -> Path:
    """A CA and a certificate for ``hostnames`` (and the metadata address) signed by it;
    returns the directory (ca.pem, server.pem, server.key)."""
    # cryptography loads when a rehearsal starts, not with every local cluster's backend.
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    directory = state / TLS_DIR
    directory.mkdir(mode=0o700, exist_ok=True)
    now = datetime.datetime.now(datetime.UTC)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "sortie rehearsal CA")])
    ca = (x509.CertificateBuilder().subject_name(ca_name).issuer_name(ca_name)
          .public_key(ca_key.public_key()).serial_number(x509.random_serial_number())
          .not_valid_before(now - datetime.timedelta(hours=1))
          .not_valid_after(now + datetime.timedelta(days=2))
          .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
          .add_extension(x509.KeyUsage(False, False, False, False, False, True, True, False,
                                       False), critical=True)
          .sign(ca_key, hashes.SHA256()))
    key = ec.generate_private_key(ec.SECP256R1())
    names: list[x509.GeneralName] = [x509.DNSName(name) for name in hostnames]
    names.append(x509.IPAddress(ipaddress.ip_address(METADATA_ADDRESS)))
    server = (x509.CertificateBuilder()
              .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, hostnames[0])]))
              .issuer_name(ca_name).public_key(key.public_key())
              .serial_number(x509.random_serial_number())
              .not_valid_before(now - datetime.timedelta(hours=1))
              .not_valid_after(now + datetime.timedelta(days=2))
              .add_extension(x509.SubjectAlternativeName(names), critical=False)
              .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
              .sign(ca_key, hashes.SHA256()))
    pem = serialization.Encoding.PEM
    (directory / "ca.pem").write_bytes(ca.public_bytes(pem))
    (directory / "server.pem").write_bytes(server.public_bytes(pem))
    (directory / "server.key").write_bytes(key.private_bytes(
        pem, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()))
    (directory / "server.key").chmod(0o600)
    return directory


# -- a rehearsed node: what its image and its cloud put on it ----------------------------------

NOTICE_FILE = "spot-notice"  # in the node's state: the metadata service posts a notice
CA_BUNDLE = "/etc/ssl/certs/ca-certificates.crt"  # Debian's (OpenSSL's default file)


def write_key_pair(path: Path, private_openssh: str) -> None:
    """The program's client key, saved as the cloud path saves it (0600), and its public half."""
    from cryptography.hazmat.primitives import serialization

    key = serialization.load_ssh_private_key(private_openssh.encode(), password=None)
    statefile.write_text(path, private_openssh if private_openssh.endswith("\n")
                         else private_openssh + "\n")
    path.chmod(0o600)
    public = key.public_key().public_bytes(serialization.Encoding.OpenSSH,
                                           serialization.PublicFormat.OpenSSH).decode()
    path.with_name(path.name + ".pub").write_text(public + "\n")


# The login user's id, made so: its podman's store is a directory of the machine's (the node's
# container store, bound in) that only it may write, made before it boots.
LOGIN_UID = 1000


def prepare_rehearsed_node(node: BootedNode, plan: RehearsalPlan, ca: Path) -> None:
    """The image's side of a cloud node, on its disk before it boots: the cloud's login user
    (cloud-init's default user, which gets the key pair's public key) and its podman's store
    (`LOGIN_UID`), the stand-ins' names and their CA trusted (also by the AWS SDK, which keeps
    its own bundle otherwise), and a /root others may pass through (the controller's Python
    may live below it)."""
    user = {"name": plan.login_user, "uid": LOGIN_UID, "lock_passwd": True, "groups": ["sudo"],
            "sudo": ["ALL=(ALL) NOPASSWD:ALL"], "shell": "/bin/bash"}
    store = node.user_store(LOGIN_UID)
    store.parent.mkdir(mode=0o711, exist_ok=True)
    store.mkdir(mode=0o700, exist_ok=True)
    os.chown(store, LOGIN_UID, LOGIN_UID)
    node.write("/etc/cloud/cloud.cfg.d/91-sortie-rehearsal.cfg",
               json.dumps({"system_info": {"default_user": user}}) + "\n")
    template = node.root / "etc/cloud/templates/hosts.debian.tmpl"
    node.write(str(template.relative_to(node.root)), template.read_text()
               + f"{METADATA_ADDRESS} {' '.join(plan.hostnames)}\n")
    bundle = node.root / CA_BUNDLE.lstrip("/")
    node.write(CA_BUNDLE, bundle.read_text() + ca.read_text())
    node.write("/etc/systemd/system.conf.d/91-sortie-rehearsal.conf",
               f"[Manager]\nDefaultEnvironment=AWS_CA_BUNDLE={CA_BUNDLE} "
               f"REQUESTS_CA_BUNDLE={CA_BUNDLE}\n")
    (node.root / "root").chmod(0o711)


# The fast interconnect's environment (EFA, InfiniBand: libfabric, NCCL, their libraries): no
# such hardware here, and the health gate would rightly fail a node that is told to use it.
INTERCONNECT_ENV = ("FI_", "NCCL_", "LD_LIBRARY_PATH")


def rehearsed_env(train_env: dict[str, str]) -> dict[str, str]:
    """The program's trainer environment as a rehearsal uses it: the cloud's spot notice kept,
    the interconnect's settings left out, the bucket the cluster's shared directory."""
    return {name: value for name, value in train_env.items()
            if not name.startswith(INTERCONNECT_ENV) and name != "SORTIE_CHECKPOINT_URL"}


def standin_config(plan: RehearsalPlan, index: int, cluster_id: str, tls_dir: Path,
                   notice_file: Path, grant_at: float) -> StandinConfig:
    node = plan.node(index)
    side = NodeSide(cluster=cluster_id, node=node.name, instance_id=f"i-{cluster_id}-{index}",
                    region=plan.region, instance_type=plan.instance_type,
                    secret_id=node.secret_id,
                    secret_value=node.secret_value, identity=node.identity)
    return StandinConfig(cloud=plan.cloud, side=dataclasses.asdict(side) | {"tokens": []},
                         tls_dir=tls_dir, notice_file=notice_file, grant_at=grant_at)
