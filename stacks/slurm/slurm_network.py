"""An allocation's nodes as the job sees them, asked once when it starts running: each node's own
interface (gloo and NCCL bind there; sites name them per node), the ports already listening
there, which the sortie's own rendezvous port avoids (other jobs share the nodes), and the
allocation's CPUs there, which every step asks for."""

from __future__ import annotations

import re
from dataclasses import dataclass

from invoke.exceptions import CommandTimedOut

from sortie.bootstrap.ssh import connect
from sortie.core.inventory import INTERFACE, Node
from sortie.stacks.slurm.slurm_queue import SLURM_TIMEOUT_S

# A sortie's rendezvous port on Slurm: from its job id, in a range below Linux's ephemeral ports
# (32768 up), then the next one free on every node. A fixed one (29400) made two sorties that
# Slurm put on the same nodes fight for it: the second died (`Address already in use`).
PORT_BASE, PORT_SPAN, PORT_TRIES = 29500, 3000, 32


def port_candidates(job_id: str) -> list[int]:
    """The ports to try for allocation ``job_id``, in order."""
    start = int(job_id) % PORT_SPAN if job_id.isdigit() else 0
    return [PORT_BASE + (start + i) % PORT_SPAN for i in range(PORT_TRIES)]


@dataclass(frozen=True)
class NodeFacts:
    """What a node's step says of it."""

    interface: str = ""  # the one that holds the node's address ("" when none does)
    ports: frozenset[int] = frozenset()  # TCP ports listening there (none known without `ss`)
    cpus: int | None = None  # the allocation's CPUs there (`SLURM_CPUS_ON_NODE`)


def node_facts(node: Node) -> NodeFacts:
    """The node's interface, listening ports and CPUs, in one step."""
    # Its CPUs' line first, then the interface's (empty when none holds it), then the ports.
    script = ('echo "${SLURM_CPUS_ON_NODE:-}"; '
              f"ip -o addr show 2>/dev/null | awk -v a={node.private_address} "
              "'{ split($4, p, \"/\"); if (p[1] == a) { n = $2; exit } } END { print n }'; "
              "ss -Htln 2>/dev/null | awk '{ print $4 }' | head -n 5000")
    try:
        done = connect(node).run(script, timeout=SLURM_TIMEOUT_S)
    except CommandTimedOut:
        return NodeFacts()
    return read_node_facts(done.stdout)


def read_node_facts(shown: str) -> NodeFacts:
    """`node_facts`' answer read (untrusted): the CPUs' line, the interface's, then listening
    addresses. (Before: an empty interface line lost the ports with it.)"""
    cpus, _, rest = shown.partition("\n")
    name, _, listening = rest.partition("\n")
    ports = {int(port) for port in re.findall(r":(\d{1,5})$", listening, re.MULTILINE)}
    count = int(cpus) if re.fullmatch(r"[1-9][0-9]{0,4}", cpus.strip()) else None
    return NodeFacts(name.strip() if INTERFACE.fullmatch(name.strip()) else "",
                     frozenset(ports), count)


def free_port(job_id: str, taken: set[int]) -> int:
    """The first of allocation ``job_id``'s candidates that no node listens on."""
    return next((port for port in port_candidates(job_id) if port not in taken),
                port_candidates(job_id)[0])
