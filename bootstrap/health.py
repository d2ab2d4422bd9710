"""The health gate: no GPU hour paid on a bad node. Before a job trains (`--health quick`, the
default, or `full`) and on demand (`sortie check NAME`), every node is checked on its own, then
the network across all of them, each step under its own time limit; while a job trains, a job
that stopped advancing is traced to the node whose link is cut (`unreachable`).

Per node (`trainer/probes.py node`): the GPUs seen against those expected, and from nvidia-smi's
query mode uncorrectable ECC errors, retired pages or remapped rows pending, hardware throttling,
a PCIe link narrower than the card's; bad XIDs in the kernel log since boot; `dcgmi diag -r 1`
(`-r 2` with `full`) where DCGM is installed; EFA or InfiniBand where the cluster has them.

Across nodes: `quick` times each link of a ring of the nodes over plain TCP, all at once
(`trainer/probes.py ring`: no torch, a Python start per node), and reads on each link's own
connection how many segments TCP had to send again (its loss, which a round trip of
microseconds hides) and how long each end waited for a CPU; each node's device error counters
(Ethernet, InfiniBand, EFA) are read before and after. `full` times each link on its
own, then runs an all-reduce with the job's backend (NCCL on GPUs, gloo on CPU) under a limit
derived from them, held against those links (one far below names the node they point at) and
the instance type's figure in the catalog (`infra/catalog.py`). Links are judged in
`link_health.py`: a node whose every link out (or in) is below half its neighbours' in the same
turn, or loses more than half a percent, is flagged, measured again with its neighbours, and
named only if every turn finds it so; a node whose probes had far less CPU than its neighbours'
is "inconclusive", never named: a busy machine's noise never costs one.
"""

from __future__ import annotations

import json
import shlex
import time
from collections.abc import Callable

from pydantic import ValidationError

from sortie.bootstrap import ssh
from sortie.bootstrap.choices import HealthLevel
from sortie.bootstrap.contract import cluster_environment
from sortie.bootstrap.health_report import HealthReport, NodeHealth
from sortie.bootstrap.link_health import (
    SLOW_FRACTION,
    Link,
    RingFailed,
    best_link,
    confirm,
    links_from_answers,
    neighbourhood,
)
from sortie.bootstrap.node_layout import trainer_home
from sortie.bootstrap.ssh import shell_env
from sortie.bootstrap.transport import NodeTransport
from sortie.core.errors import SortieError, last_line
from sortie.core.inventory import Expected, Inventory, Node

MAX_PROBE_OUTPUT = 64 << 10  # a node's answer, untrusted: read no more
# (all-reduce bytes, rounds) per level: small for `quick`, which runs before every job.
NET_SIZES = {"quick": (4 << 20, 3), "full": (256 << 20, 5)}
# Each node tool has its own limit on the node (`trainer/probes.py`); these bound them all.
NODE_TIMEOUT_S = {"quick": 240.0, "full": 1200.0}
NET_TIMEOUT_S = {"quick": 60.0, "full": 600.0}
# A flagged node is measured again up to this many times, each link judged on its best figure
# so far, and named only if it stays slow: a busy machine's noise passes, a slow NIC does not.
# `full` twice: once let a healthy node through on a loaded CI machine (the test's small
# messages, the machine at three test processes on two cores).
CONFIRMATIONS = {"quick": 3, "full": 2}
# A flagged node is measured again with each link of its neighbourhood alone, in turn (all
# at once, a node's links shared the machine with a different set of others than its
# neighbours' did: on a loaded CI machine a healthy node stayed "slow sending" four turns in
# a row), each the best of this many rounds.
ALONE_ROUNDS = 5
ALONE_MAX_NODES = 32  # ...where the ring is this small (link by link, 2 links a node in turn)
# `full`: an all-reduce under a tenth of the slowest link timed alone is a failure. A healthy
# collective runs near its links with NCCL, and at a third to a half of them with gloo on CPU
# (measured here); the security review's one-way slow node made it 1/45.
COLLECTIVE_FRACTION = 0.1
# ...unless its ranks waited on run queues for most of the time they wanted a CPU: then it
# measured the machine's load, said as inconclusive (two clones' tests side by side on two
# cores: a healthy cluster's all-reduce crawled twice, under a tenth, for want of CPU). A slow
# link's ranks wait on the network, off the run queue. Measured here, 3 local nodes on two
# cores: 0.59-0.81 quiet, up to 0.87 beside CPU burners (neither crawled); 0.23-0.45 with one
# node's egress slowed to 200 or 20 Mbit/s by tc (network-bound).
COLLECTIVE_STARVED = 0.5
CRAWLED = -1.0  # measure_network's bus bandwidth for an all-reduce that ran out of its time


def _probe_command(node: Node, inventory: Inventory, args: list[str], timeout: float) -> str:
    """The probe under `timeout` on the node too: one that outlives its SSH channel (a timed-out
    command) would hold the rendezvous port the job needs next."""
    env = {**cluster_environment(inventory, node), "PYTHONPATH": trainer_home(node),
           "PYTHONUNBUFFERED": "1"}
    return (f"cd {shlex.quote(node.workdir)} && {shell_env(env)} timeout -k 5 {timeout:g} "
            f"{shlex.join([node.python, '-m', 'trainer.probes', *args])}")


def _probe(conn: NodeTransport, node: Node, inventory: Inventory, args: list[str], timeout: float,
           what: str, answers: bool = True) -> dict:
    """Run a probe on ``node``; its JSON answer (untrusted input: a bad one is an error naming
    the node), or {} when it gives none (``answers`` False: a network probe's other ranks)."""
    command = _probe_command(node, inventory, args, timeout)
    try:
        result = conn.run(command, timeout=timeout + 15, warn=True, hide=True)
    except Exception as exc:  # noqa: BLE001 - a timeout or a broken connection: the node's fault
        raise SortieError(f"{node.name}: the {what} probe did not finish within {timeout:g}s "
                          f"({type(exc).__name__})") from None
    if not result.ok:
        tail = last_line(result.stderr, f"exit {result.exited}", 200)
        raise SortieError(f"{node.name}: the {what} probe failed: {tail}")
    if not answers:
        return {}
    lines = result.stdout[-MAX_PROBE_OUTPUT:].strip().splitlines()
    try:
        answer = json.loads(lines[-1]) if lines else None
    except ValueError:
        answer = None
    if not isinstance(answer, dict):
        raise SortieError(f"{node.name}: the {what} probe printed "
                          f"{result.stdout.strip()[-160:]!r}, not its answer")
    return answer


def net_backend(inventory: Inventory) -> str:
    hidden = inventory.train_env.get("CUDA_VISIBLE_DEVICES") == ""
    return "nccl" if inventory.head.gpus and not hidden else "gloo"


def fabric_flags(env: dict[str, str], expected: Expected | None) -> list[str]:
    """The probe's fabric checks: the instance type's devices where the job uses its fabric
    (EFA: FI_PROVIDER=efa; InfiniBand: unless NCCL_IB_DISABLE=1), else what the job's
    environment asks for (at least one)."""
    efa = env.get("FI_PROVIDER") == "efa"
    ib_off = env.get("NCCL_IB_DISABLE") == "1"
    if expected and expected.fabric == "efa" and efa:
        return ["--efa", str(expected.devices)]
    if expected and expected.fabric == "infiniband" and not ib_off:
        return ["--infiniband", str(expected.devices), "--ib-gbps", str(expected.gbps)]
    ib = not ib_off and any(k.startswith("NCCL_IB_") for k in env)
    return ["--efa"] * efa + ["--infiniband"] * ib


def check_nodes(conns: dict[str, NodeTransport], inventory: Inventory, level: HealthLevel,
                ring: bool = False, expected: Expected | None = None
                ) -> list[tuple[NodeHealth, dict]]:
    """Every node's own checks, in parallel; a node that cannot be probed is a bad node. With
    ``ring``, each node's probe first times its link of the ring (`ring_links`), in the same
    process: one Python start and one round trip per node, not two. Returns each node's row
    and its probe's whole answer."""
    env = inventory.train_env
    flags = ["--dcgm", "2" if level == "full" else "1", *fabric_flags(env, expected)]

    def one(node: Node) -> tuple[NodeHealth, dict]:
        rank = inventory.node_rank(node.name)
        args = ["quick", *_ring_args(inventory, inventory.nodes, rank)] if ring else ["node"]
        args += ["--gpus", str(node.gpus), *flags]
        try:
            answer = _probe(conns[node.name], node, inventory, args, NODE_TIMEOUT_S[level]
                            + (NET_TIMEOUT_S[level] if ring else 0), "node")
            problems = [str(p)[:300] for p in [*answer.get("problems", []),
                                               *answer.get("link_problems", [])]][:20]
            checks = {str(k)[:40]: str(v)[:200] for k, v in answer.get("checks", {}).items()}
        except (SortieError, AttributeError) as exc:
            problem = str(exc).removeprefix(f"{node.name}: ")
            return NodeHealth(node=node.name, problems=[problem]), {}
        return NodeHealth(node=node.name, problems=problems, checks=checks), answer

    return ssh.on_all(inventory.nodes, one)


Collective = tuple[float | None, float | None]  # (bus bandwidth GB/s, its ranks' CPU wait)


def measure_network(conns: dict[str, NodeTransport], inventory: Inventory,
                    level: HealthLevel) -> tuple[Collective, int, list[Link]]:
    """(the all-reduce, message bytes, the ring's links): one probe process per node.
    `quick` times each link of the ring over plain TCP, all at once (no torch: `ring_links`);
    `full` times each link on its own with the job's backend, then an all-reduce."""
    if level != "full":
        return (None, None), NET_SIZES["quick"][0], ring_links(conns, inventory)
    size, rounds = NET_SIZES["full"]
    nodes, timeout = inventory.nodes, NET_TIMEOUT_S["full"]
    common = ["--world", str(len(nodes)), "--master", inventory.head.private_address,
              "--port", str(inventory.rdzv_port), "--backend", net_backend(inventory),
              "--bytes", str(size), "--iters", str(rounds), "--timeout", str(timeout / 2),
              "--addresses", *(n.private_address for n in nodes)]

    def one(node: Node) -> dict:
        rank = inventory.node_rank(node.name)
        return _probe(conns[node.name], node, inventory, ["net", "--rank", str(rank), *common],
                      timeout, "network", answers=rank == 0)

    answer = ssh.on_all(nodes, one)[0]
    try:
        crawled = answer.get("collective_timed_out")
        busbw = CRAWLED if crawled is not None else float(answer["busbw_gbs"])
        waited = answer.get("collective_cpu_wait")
        cpu_wait = float(waited) if waited is not None else None
        if cpu_wait is not None and not 0.0 <= cpu_wait <= 1.0:
            cpu_wait = None  # a share or nothing: NaN or out of range must not excuse a crawl
        links = [Link(a=nodes[int(a)].name, b=nodes[int(b)].name, gbs=float(gbs),
                      retransmitted=max(0, int(lost)), segments=max(0, int(sent)))
                 for a, b, gbs, *more in answer["links"][:2 * len(nodes)]
                 for lost, sent in [(more + [0, 0])[:2]]]
    except (KeyError, TypeError, ValueError, IndexError, ValidationError):
        raise SortieError(f"{nodes[0].name}: the network probe's answer is not one") from None
    return (busbw, cpu_wait), size, links


def _ring_args(inventory: Inventory, ring: list[Node], rank: int,
               alone: int | None = None) -> list[str]:
    """The ring probe's arguments for node ``rank`` of ``ring`` (some of the nodes, in order);
    ``alone``: each link on its own, from that rank on, best of `ALONE_ROUNDS`."""
    size, rounds = NET_SIZES["quick"]
    return ["--rank", str(rank), "--port", str(inventory.rdzv_port), "--bytes",
            str(size), "--iters", str(rounds if alone is None else ALONE_ROUNDS), "--timeout",
            str(NET_TIMEOUT_S["quick"] / 2),
            *([] if alone is None else ["--alone", "--first", str(alone)]),
            *(n.private_address for n in ring)]


def ring_links(conns: dict[str, NodeTransport], inventory: Inventory,
               ring: list[Node] | None = None, suspects: list[str] | None = None) -> list[Link]:
    """Each node's links to its neighbours of ``ring`` (every node by default), timed by the
    nodes themselves over TCP between their private addresses (`trainer/probes.py ring`): the
    path the job's traffic takes, at the cost of a Python start per node. With ``suspects``
    (nodes measured again) and a ring of `ALONE_MAX_NODES` at most: each link on its own, in
    turn, begun by a node not suspected (the first to send starts beside the others' Python
    starts, and was named for it on a loaded machine)."""
    ring = ring or inventory.nodes
    rank = {node.name: i for i, node in enumerate(ring)}
    alone = None if suspects is None or len(ring) > ALONE_MAX_NODES else next(
        (i for i, node in enumerate(ring) if node.name not in suspects), 0)
    answers = ssh.on_all(ring, lambda node: _probe(conns[node.name], node, inventory, [
        "ring", *_ring_args(inventory, ring, rank[node.name], alone)], NET_TIMEOUT_S["quick"],
        "network"))
    return links_from_answers(ring, answers)


def _crawls(report: HealthReport) -> bool:
    """Whether the all-reduce ran under a tenth of the slowest link alone (or out of time)."""
    if report.busbw_gbs is None or not report.links:
        return False
    floor = min(link.gbs for link in report.links)
    return report.busbw_gbs == CRAWLED or report.busbw_gbs < COLLECTIVE_FRACTION * floor


def confirm_collective(report: HealthReport, measure: Callable[[], Collective],
                       times: int) -> None:
    """An all-reduce that crawled is measured again, up to ``times`` in all, its best figure
    kept with its CPU wait: a crawl is named only once it crawls every time, as a slow link
    is (one all-reduce on a loaded machine ran at 1/10 of its links alone, two clones' tests
    side by side)."""
    for _ in range(times - 1):
        if not _crawls(report):
            return
        busbw, cpu_wait = measure()
        if (busbw or CRAWLED) > (report.busbw_gbs or CRAWLED):
            report.busbw_gbs, report.collective_cpu_wait = busbw, cpu_wait


def _starved_collective(report: HealthReport) -> str | None:
    """Why a crawling all-reduce says nothing of the network, if its most starved rank spent
    most of the CPU time it wanted waiting on a run queue; None otherwise."""
    wait = report.collective_cpu_wait
    if wait is None or wait < COLLECTIVE_STARVED or not _crawls(report):
        return None
    return (f"the all-reduce crawled while a rank waited for a CPU through {wait:.0%} of the "
            "CPU time it wanted (inconclusive: the machine's load, not its network)")


def _crawling_collective(report: HealthReport) -> dict[str, str]:
    """`full`: an all-reduce far below what every link measured alone (or one that ran out of
    its time, derived from those links) is a failure, named on the node the per-link tests
    point at: the one whose best link out or in is the lowest."""
    if not _crawls(report):
        return {}
    floor = min(link.gbs for link in report.links)
    crawled = report.busbw_gbs == CRAWLED
    names = sorted({link.a for link in report.links} | {link.b for link in report.links})

    def worst(name: str) -> float:
        return min(best_link(report.links, name, way) or float("inf") for way in (True, False))

    suspect = min(names, key=worst)
    said = "did not finish in the time its links allow" if crawled else \
        f"ran at {report.busbw_gbs:.3g} GB/s"
    if crawled:
        report.busbw_gbs = None
    return {suspect: f"the all-reduce {said}, under a tenth of the slowest link alone "
                     f"({floor:.3g} GB/s); this node's links are the slowest"}


def _first_ring(conns: dict[str, NodeTransport], inventory: Inventory,
                checked: list[tuple[NodeHealth, dict]]) -> list[Link]:
    """The links `quick` timed beside each node's checks; a ring that failed with no node to
    blame (one link failed: either end) and no node cut off is measured once more, each link
    alone, where a lossy node's every link shows its loss, or a second failure names it."""
    try:
        return links_from_answers(inventory.nodes, [answer for _, answer in checked])
    except RingFailed as exc:
        if exc.suspect is not None or unreachable(conns, inventory):
            raise
        return ring_links(conns, inventory, neighbourhood(inventory.nodes, exc.involved),
                          suspects=exc.involved)


def check_health(conns: dict[str, NodeTransport], inventory: Inventory, level: HealthLevel,
                 expected: Expected | None = None) -> HealthReport:
    """Check every node, then the network; ``expected``: what the catalog says of the instance
    type (its fabric's devices, counted on every node; its bus bandwidth, held against the
    measurement with `full`)."""
    started = time.perf_counter()
    # `quick`'s link test is light: each node runs it in the same probe as its own checks.
    # It counts only where every node passed those (as if it had run after them).
    together = level == "quick" and len(inventory.nodes) > 1

    def measure_again(flagged: list[str]) -> list[Link]:
        # Either level: a ring of the flagged nodes and their neighbours, link by link (`full`
        # again in full named a healthy node slow sending, 0.51 against 1.15, in CI).
        return ring_links(conns, inventory, neighbourhood(inventory.nodes, flagged),
                          suspects=flagged)

    checked = check_nodes(conns, inventory, level, ring=together, expected=expected)
    rows = [row for row, _ in checked]
    report = HealthReport(level=level, nodes=rows,
                          backend=net_backend(inventory) if level == "full" else "tcp")
    report.bad = {row.node: "; ".join(row.problems) for row in rows if row.problems}
    if not report.bad and len(inventory.nodes) > 1:
        names = [n.name for n in inventory.nodes]
        try:
            collective, report.message_bytes, report.links = (
                ((None, None), NET_SIZES["quick"][0], _first_ring(conns, inventory, checked))
                if together else measure_network(conns, inventory, level))
            report.busbw_gbs, report.collective_cpu_wait = collective
            report.links, named, inconclusive = confirm(report.links, names,
                                                        CONFIRMATIONS[level], measure_again)
            report.bad.update(named)
            report.warnings += [f"{name}: {why}" for name, why in inconclusive.items()]
            confirm_collective(report, lambda: measure_network(conns, inventory, level)[0],
                               CONFIRMATIONS[level])
            starved = _starved_collective(report)
            crawling = _crawling_collective(report)  # (a crawled figure is cleared)
            if starved:
                report.warnings.append(starved)
            elif not report.bad:
                report.bad.update(crawling)
        except SortieError as exc:  # a cut link blocks every rank: find whose it is
            cut = unreachable(conns, inventory)
            if not cut and isinstance(exc, RingFailed) and exc.suspect:
                report.bad[exc.suspect] = (
                    f"its links did not carry the network test within "
                    f"{NET_TIMEOUT_S['quick'] / 2:g}s, though every node reaches it: its "
                    f"neighbours' test data was lost on the way (a lossy link)")
            elif not cut:
                raise SortieError(f"health ({level}): the network test failed and every node "
                                  f"reaches the others: {exc}") from None
            report.bad.update({name: "unreachable over the job's network" for name in cut})
        for row in rows:
            send, recv = (best_link(report.links, row.node, way) for way in (True, False))
            row.send_gbs = round(send, 4) if send is not None else None
            row.recv_gbs = round(recv, 4) if recv is not None else None
    busbw = expected.busbw if expected else None
    if busbw and report.busbw_gbs is not None:
        report.expected_busbw_gbs, report.expected_source = busbw
        if level == "full" and report.busbw_gbs < SLOW_FRACTION * busbw[0]:
            report.warnings.append(
                f"bus bandwidth {report.busbw_gbs:.3g} GB/s is under half the "
                f"{busbw[0]:g} GB/s expected of this instance type ({busbw[1]})")
    report.seconds = round(time.perf_counter() - started, 3)
    return report


def unreachable(conns: dict[str, NodeTransport], inventory: Inventory,
                timeout_s: float = 3.0) -> list[str]:
    """Nodes the others cannot reach over the job's network (a cut link, a dead NIC), judged by
    every node probing every other's private address: a node that most of the others cannot
    reach. SSH (the control path) may still reach it."""
    nodes = [n for n in inventory.nodes if n.name in conns]
    if len(nodes) < 2:
        return []
    addresses = [n.private_address for n in inventory.nodes]

    def one(node: Node) -> dict[str, bool]:
        others = [a for a in addresses if a != node.private_address]
        args = ["reach", *others, "--port", str(inventory.rdzv_port), "--timeout",
                str(timeout_s)]
        try:
            answer = _probe(conns[node.name], node, inventory, args, timeout_s * 3 + 10, "reach")
            return {str(k): bool(v) for k, v in dict(answer.get("reached", {})).items()}
        except (SortieError, TypeError, ValueError):
            return {}  # it could not even ask: it says nothing about the others

    seen = dict(zip((n.name for n in nodes), ssh.on_all(nodes, one), strict=True))
    lost = []
    for node in inventory.nodes:
        votes = [reached[node.private_address] for name, reached in seen.items()
                 if name != node.name and node.private_address in reached]
        if votes and sum(votes) * 2 < len(votes):
            lost.append(node.name)
    return lost
