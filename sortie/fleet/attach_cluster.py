"""`sortie attach`: take on a cluster sortie did not create, once every node passed preflight.

Three sources, one path: a hosts file (`stacks/hosts.py`), a Pulumi stack's outputs as
`pulumi stack output --json --show-secrets` prints them, or the stack itself through the
Automation API. Each becomes an inventory with every host key pinned (from the file or the
stack; a host's own key only once it matches the fingerprint the user gave), then preflight
checks every node (`bootstrap/preflight.py`). Only a cluster that passed is recorded; after a
failure nothing is: the directories preflight made on the nodes are removed again.
"""

from __future__ import annotations

import re
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sortie.bootstrap.preflight import Preflight, preflight, remove_workdir
from sortie.core import statefile
from sortie.core.errors import SortieError, UsageError
from sortie.core.inventory import Inventory, Node
from sortie.core.progress import Reporter, phase
from sortie.core.userfile import read_json
from sortie.fleet import registry
from sortie.infra.catalog import CATALOG
from sortie.stacks.attached.attached_backend import AttachedBackend, Attachment
from sortie.stacks.cloud.outputs import inventory_from_outputs
from sortie.stacks.cloud.stack_api import StackStore
from sortie.stacks.hosts import hosts_inventory, load_hosts, parse_trust, same_machine_key

MAX_OUTPUTS_BYTES = 4 << 20
PRIVATE_KEY = re.compile(r"-----BEGIN OPENSSH PRIVATE KEY-----\n[A-Za-z0-9+/=\n]+"
                         r"-----END OPENSSH PRIVATE KEY-----\n?")


@dataclass(frozen=True)
class AttachRequest:
    name: str
    min_free_bytes: int = 1 << 30
    ssh_timeout_s: float = 15.0


def attach_hosts(home: Path, request: AttachRequest, path: Path, trust: tuple[str, ...],
                 reporter: Reporter) -> Preflight:
    """Attach the machines of a hosts file (`sortie attach NAME --hosts FILE`)."""
    registry.refuse_taken(home, request.name, "NAME")
    hosts, trusted = load_hosts(path), parse_trust(trust)
    unknown = sorted(set(trusted) - {host.address for host in hosts.hosts})
    if unknown:
        raise UsageError(f"--trust {unknown[0]}: no such host in {path}")
    with phase(reporter, f"Pinning the host keys of {len(hosts.hosts)} hosts"):
        inventory = hosts_inventory(hosts, request.name, trusted)
    attachment = Attachment(source="hosts file", origin=str(path.resolve()),
                            attached_at=time.time())
    return _attach(home, request, inventory, attachment, reporter)


def read_outputs_file(path: Path) -> dict[str, Any]:
    """`pulumi stack output --json --show-secrets` as saved in a file."""
    outputs = read_json(path, MAX_OUTPUTS_BYTES, "stack outputs file")
    if not isinstance(outputs, dict):
        raise UsageError(f"{path}: not the outputs of a stack (a JSON object)")
    return outputs


def attach_outputs(home: Path, request: AttachRequest, outputs: dict[str, Any],
                   attachment: Attachment, reporter: Reporter) -> Preflight:
    """Attach a stack's nodes from its outputs (`--outputs FILE`, `--pulumi-stack STACK`)."""
    registry.refuse_taken(home, request.name, "NAME")
    key = outputs.get("client_private_key")
    if key == "[secret]":
        raise UsageError("stack output client_private_key: hidden; `pulumi stack output --json "
                         "--show-secrets` shows it")
    if not isinstance(key, str) or not PRIVATE_KEY.fullmatch(key):
        raise UsageError("stack output client_private_key: missing or not an OpenSSH private "
                         "key")
    state = AttachedBackend(home).state_dir(request.name)
    inventory = inventory_from_outputs(outputs, state / "client_key")  # checked: nothing made
    inventory = inventory.model_copy(update={"cluster_id": request.name, "backend": "attached"})
    attachment = attachment.model_copy(update={"usd_per_hour": _usd_per_hour(outputs),
                                               "stack_cluster": str(outputs.get("cluster"))})

    def save_key(directory: Path) -> None:  # 0600, written whole
        statefile.write_text(directory / "client_key", key if key.endswith("\n") else key + "\n")

    return _attach(home, request, inventory, attachment, reporter, save_key,
                   gpus=inventory.nodes[0].gpus, first_boot=True)


def attach_outputs_file(home: Path, request: AttachRequest, path: Path,
                        reporter: Reporter) -> Preflight:
    """`sortie attach NAME --outputs FILE`."""
    attachment = Attachment(source="outputs file", origin=str(path.resolve()),
                            attached_at=time.time())
    return attach_outputs(home, request, read_outputs_file(path), attachment, reporter)


def attach_stack(home: Path, request: AttachRequest, stack: str, cwd: Path,
                 reporter: Reporter, stacks: StackStore | None = None) -> Preflight:
    """`sortie attach NAME --pulumi-stack STACK --cwd DIR`: the outputs of the user's own
    stack, secrets in clear, through the Automation API (the Pulumi CLI, with the user's login
    and passphrase; ``stacks``: tests' stand-in)."""
    registry.refuse_taken(home, request.name, "NAME")
    outputs = registry.user_stack(stack, cwd, stacks).outputs()
    attachment = Attachment(source="pulumi stack", origin=stack, cwd=str(cwd.resolve()),
                            attached_at=time.time())
    return attach_outputs(home, request, outputs, attachment, reporter)


def _usd_per_hour(outputs: dict[str, Any]) -> float:
    kind = CATALOG.get(str(outputs.get("instance_type")))
    if kind is None:
        return 0.0
    price = kind.price(str(outputs.get("region", "")))  # its region's, else the reference's
    return round(sum(price.spot_usd_h if node.get("spot") else price.on_demand_usd_h
                     for node in outputs["nodes"]), 4)


def shared_machines(backend: AttachedBackend, inventory: Inventory) -> list[str]:
    """The machines of ``inventory`` that another attached cluster has too, said as lines. Two
    clusters whose head and rendezvous port are the same would fight for the port whenever both
    run a job: a UsageError."""
    def place(node: Node) -> tuple[str, int]:
        return same_machine_key(node.address), node.port

    mine = {place(node): node.name for node in inventory.nodes}
    shared = []
    for other in backend.cluster_ids():
        try:
            theirs = backend.inventory(other)
        except SortieError:  # an attach that never finished, or damaged state: not in the way
            continue
        if place(theirs.head) == place(inventory.head) and \
                theirs.rdzv_port == inventory.rdzv_port:
            raise UsageError(f"rdzv_port: {inventory.rdzv_port} on {inventory.head.address} is "
                             f"the rendezvous port of attached cluster {other} too: their jobs "
                             "would fight for it; give the hosts file another rdzv_port")
        shared += [f"{mine[place(node)]} ({node.address}) is {other}'s {node.name} too"
                   for node in theirs.nodes if place(node) in mine]
    return shared


def _attach(home: Path, request: AttachRequest, inventory: Inventory, attachment: Attachment,
            reporter: Reporter, prepare_state: Callable[[Path], None] | None = None,
            gpus: int | None = None, first_boot: bool = False) -> Preflight:
    backend = AttachedBackend(home)
    for line in shared_machines(backend, inventory):
        reporter.note(f"{line}: the jobs of both share its GPUs")
    state = backend.state_dir(request.name)
    state.mkdir(parents=True, mode=0o700)
    recorded = False
    try:
        if prepare_state:
            prepare_state(state)
        with phase(reporter, f"Preflight on {len(inventory.nodes)} nodes: SSH (pinned host "
                             "keys), python, torch, GPUs, disk, rendezvous port"):
            report, conns = preflight(inventory, request.min_free_bytes, gpus,
                                      request.ssh_timeout_s, first_boot)
        try:
            if report.ok:
                checked = {row.node: row for row in report.nodes}
                nodes = [node.model_copy(update={"workdir": checked[node.name].workdir,
                                                 "gpus": checked[node.name].gpus})
                         for node in inventory.nodes]
                backend.record(request.name, inventory.model_copy(update={"nodes": nodes}),
                               attachment)
                recorded = True
            else:  # leave the nodes as they were: remove the directories preflight made
                for row in report.nodes:
                    if row.workdir and row.node in conns:
                        node = inventory.node(row.node).model_copy(
                            update={"workdir": row.workdir})
                        remove_workdir(conns[row.node], node, stop=False)
        finally:
            for conn in conns.values():
                conn.close()
    finally:
        if not recorded:
            shutil.rmtree(state, ignore_errors=True)
    return report
