"""Make a fresh cluster ready to train: reach every node, verify it, install the trainer."""

from __future__ import annotations

import threading

from sortie.bootstrap import checks, ssh
from sortie.bootstrap.contract import cluster_environment
from sortie.bootstrap.trainer_bundle import trainer_bundle
from sortie.bootstrap.transport import NodeTransport
from sortie.core.inventory import Inventory, Node

MAX_EARLY_KEYS = 4  # a node's word, kept short: the early keys said (run.json, the terminal)


def prepare(inventory: Inventory, ssh_timeout_s: float = 120.0,
            nodes: list[Node] | None = None,
            facts: dict[str, checks.NodeFacts] | None = None) -> ssh.Connections:
    """Connect to every node (or just ``nodes``: replacements), pinned host key, wait for its
    first-boot setup on a cloud, check it and install the trainer (one round trip).

    Each node goes through its steps on its own, without waiting for the others between steps,
    so one node's round trips overlap another's work. Returns the open connections by node name
    (the caller closes them). ``facts`` receives what each node's check found. On failure, every
    connection opened is closed and the first error (naming its node) is raised."""
    bundle = trainer_bundle()
    opened: list[NodeTransport] = []
    lock = threading.Lock()

    def bootstrap_node(node: Node) -> NodeTransport:
        early: list[str] = []  # host keys a booting node's sshd showed before its pinned one
        conn = ssh.wait_for_ssh(node, ssh_timeout_s, booting=inventory.booted, seen=early)
        with lock:
            opened.append(conn)
        # cloud-init installs what the checks look for, and arms the node's TTL
        said = checks.wait_for_cloud_init(conn, node, require_ttl=True) if inventory.booted \
            else ""
        # (the trainer too: installed by the check)
        found = checks.check_node(conn, node, cluster_environment(inventory, node), bundle)
        found.cloud_init = said
        found.early_host_keys = early[:MAX_EARLY_KEYS]
        if facts is not None:
            facts[node.name] = found  # (one key per thread: no lock needed)
        return conn

    targets = inventory.nodes if nodes is None else nodes
    try:
        conns = ssh.on_all(targets, bootstrap_node)
    except BaseException:
        for conn in opened:
            conn.close()
        raise
    return ssh.Connections(zip((node.name for node in targets), conns, strict=True))
