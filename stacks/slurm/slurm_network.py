"""An allocation's nodes as the job sees their network, asked once when it starts running: each
node's own interface (gloo and NCCL bind there; sites name them per node) and the ports already
listening there, which the sortie's own rendezvous port avoids (other jobs share the nodes)."""

from __future__ import annotations

import re

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


def network_facts(node: Node) -> tuple[str, set[int]]:
    """The network interface that holds the node's address there ("" when none does), and the
    TCP ports listening there (`ss`; none known without it)."""
    # The interface's line always comes first, empty when none holds it: the ports follow.
    script = (f"ip -o addr show 2>/dev/null | awk -v a={node.private_address} "
              "'{ split($4, p, \"/\"); if (p[1] == a) { n = $2; exit } } END { print n }'; "
              "ss -Htln 2>/dev/null | awk '{ print $4 }' | head -n 5000")
    try:
        done = connect(node).run(script, timeout=SLURM_TIMEOUT_S)
    except CommandTimedOut:
        return "", set()
    return read_network_facts(done.stdout)


def read_network_facts(shown: str) -> tuple[str, set[int]]:
    """`network_facts`' answer read (untrusted): the interface's line, then listening
    addresses. (Before: an empty interface line lost the ports with it.)"""
    name, _, listening = shown.partition("\n")
    ports = {int(port) for port in re.findall(r":(\d{1,5})$", listening, re.MULTILINE)}
    return (name.strip() if INTERFACE.fullmatch(name.strip()) else ""), ports


def free_port(job_id: str, taken: set[int]) -> int:
    """The first of allocation ``job_id``'s candidates that no node listens on."""
    return next((port for port in port_candidates(job_id) if port not in taken),
                port_candidates(job_id)[0])
