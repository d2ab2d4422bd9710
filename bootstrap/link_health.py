"""Judging the network's links (`health.py` measures them): a node is slow, or lossy, only
against its own neighbours measured in the same turn, and only if it stays so every time it is
measured again; a node whose probes had far less CPU than its neighbours' in its last turn (or
a CPU under half the time, where it is not grossly slow) is said to be inconclusive, never held
against it.

Each link is timed by its sender (best of a few round trips), which also reads its connection's
TCP counters (retransmitted and sent segments: the link's loss, which the round trip on a fast
network hides) and how long its thread, and its receiver's, waited for a CPU.
"""

from __future__ import annotations

import re
import statistics
from collections.abc import Callable

from pydantic import BaseModel, ValidationError, computed_field

from sortie.core.errors import SortieError
from sortie.core.inventory import Node
from sortie.trainer.link_stats import LOSS_LIMIT, loss_share, too_lossy

SLOW_FRACTION = 0.5  # below half its neighbours' figure: slow
# A link that loses more than LOSS_LIMIT of its segments (TCP retransmissions) is broken: TCP's
# throughput falls as 1/sqrt(loss) (Mathis et al. 1997), RDMA transports far faster
# (docs/health.md). The node's device counters are judged by the same share, read from as
# many packets (`trainer/link_stats.py`, which the nodes run: `loss_share`): one rule for both.
# A flagged node whose probes had under this share of the CPU time its neighbours' had (each
# probe thread's time not spent waiting on a run queue) is not named: its figures measured the
# machine's load, not its link. (Every probe waits some: nodes that share a machine's cores.)
STARVED = 0.75
# ...nor one whose probes had a CPU under this share of the time they wanted one, unless it is
# grossly slow (under GROSS_FRACTION of its neighbours): with every thread waiting, as on a
# fresh clone's CI (eight nodes' probes among other tests on two cores), a healthy node received
# at 0.40 of its neighbours every turn, its probes at a CPU a third of the time; the tests'
# slowed links run at a tenth (a link of 300 Mbit/s among 3000) and a sixtieth. A node's probe
# has a CPU of its own on a real cluster.
MACHINE_BOUND = 0.5
GROSS_FRACTION = 0.25
TRACE_MIN_LOSSES = 5  # tracing a failed ring: a finished link losing this many, over the limit


class Link(BaseModel):
    """A directed link: node ``a`` sends, node ``b`` receives."""

    a: str
    b: str
    gbs: float
    retransmitted: int = 0  # the sender's TCP counters on this link's connection
    segments: int = 0
    # The share of its timing the sender's thread, and the receiver's, waited for a CPU.
    send_wait: float = 0.0
    recv_wait: float = 0.0

    @computed_field  # type: ignore[prop-decorator]
    @property
    def loss(self) -> float | None:
        return loss_share(self.retransmitted, self.segments)


class RingFailed(SortieError):
    """The ring's test did not finish on some node; ``suspect``: the node most of the failed
    links lead to (a link that loses so much that the test's bytes never arrive), if one;
    ``involved``: the nodes whose test failed and those their failures name."""

    def __init__(self, message: str, suspect: str | None = None,
                 involved: list[str] | None = None) -> None:
        super().__init__(message)
        self.suspect = suspect
        self.involved = involved or []


FAILED_PEER = re.compile(r"(?:sending to|no data from) node (\d+)")


def _suspect(ring: list[Node], answers: list[dict]) -> str | None:
    """The node whose links to its neighbours are bad, every one, where no other's are: a
    link is bad when it failed (each failure names its peer) or finished but lost more than
    `LOSS_LIMIT`, from a handful of losses (`TRACE_MIN_LOSSES`: a ring that failed already
    says something is wrong, and a link that loses one packet in ten sends few segments in
    its time). Its neighbours have one bad link each, the one to it."""
    bad: set[frozenset[int]] = set()
    for rank, answer in enumerate(answers):
        if not isinstance(answer, dict):
            continue
        for peer in {int(p) for p in FAILED_PEER.findall(str(answer.get("ring_error", ""))[:300])}:
            bad.add(frozenset((rank, peer)))
        for entry in answer.get("links", []) if isinstance(answer.get("links"), list) else []:
            try:
                _a, b, _gbs, lost, sent, *_ = entry
                if too_lossy(int(lost), int(sent)) or (
                        int(lost) >= TRACE_MIN_LOSSES and int(lost) > LOSS_LIMIT * int(sent)):
                    bad.add(frozenset((rank, int(b))))
            except (TypeError, ValueError):
                continue
    count = {rank: sum(rank in pair for pair in bad if len(pair) == 2)
             for rank in range(len(ring))}
    ranked = sorted(count.items(), key=lambda item: item[1], reverse=True)
    if len(ring) >= 3 and ranked[0][1] >= 2 and ranked[1][1] < ranked[0][1]:
        return ring[ranked[0][0]].name
    return None


def _involved(ring: list[Node], answers: list[dict]) -> list[str]:
    ranks = {rank for rank, answer in enumerate(answers)
             if isinstance(answer, dict) and "ring_error" in answer}
    ranks |= {int(peer) for rank in ranks
              for peer in FAILED_PEER.findall(str(answers[rank]["ring_error"])[:300])
              if int(peer) < len(ring)}
    return [ring[rank].name for rank in sorted(ranks)]


def links_from_answers(ring: list[Node], answers: list[dict]) -> list[Link]:
    """The ring's links from every node's answer (each node's to its neighbours, next first;
    each link's receiver says how long it waited for a CPU), in ring order. Untrusted: a
    non-answer, or a failed link, is an error naming its node."""
    links, world = [], len(ring)
    waits: dict[tuple[int, int], float] = {}
    for rank, answer in enumerate(answers):
        for peer, share in answer.get("served", []) if isinstance(answer, dict) else []:
            if isinstance(peer, int) and isinstance(share, int | float):
                waits[peer, rank] = float(share)
    for rank, answer in enumerate(answers):
        if "ring_error" in answer:
            raise RingFailed(f"{ring[rank].name}: the network probe failed: "
                             f"{str(answer['ring_error'])[:200]}", _suspect(ring, answers),
                             _involved(ring, answers))
        neighbours = {(rank + 1) % world, (rank - 1) % world} - {rank}
        try:
            found = answer["links"]
            if not isinstance(found, list) or len(found) != len(neighbours):
                raise ValueError
            for a, b, gbs, *more in found:
                if int(a) != rank or int(b) not in neighbours:
                    raise ValueError
                retransmitted, segments, wait = (more + [0, 0, 0.0])[:3]
                links.append(Link(a=ring[rank].name, b=ring[int(b)].name, gbs=float(gbs),
                                  retransmitted=max(0, int(retransmitted)),
                                  segments=max(0, int(segments)),
                                  send_wait=min(1.0, max(0.0, float(wait))),
                                  recv_wait=min(1.0, max(0.0, waits.get((rank, int(b)), 0.0)))))
        except (KeyError, TypeError, ValueError, ValidationError):
            raise SortieError(f"{ring[rank].name}: the network probe's answer is not "
                              "one") from None
    return links


def best_link(links: list[Link], name: str, sending: bool) -> float | None:
    """Node ``name``'s best link out (``sending``) or in, GB/s: low only if it is slow that way."""
    return max((link.gbs for link in links if (link.a if sending else link.b) == name),
               default=None)


def _neighbours(links: list[Link], name: str) -> set[str]:
    return {link.b for link in links if link.a == name} | \
        {link.a for link in links if link.b == name}


def judge(links: list[Link], names: list[str]) -> dict[str, str]:
    """Of ``names``, the nodes these links (one turn's) say are bad, and why: every link out
    (or in) below half the median of its neighbours' best that way (three nodes at least: with
    two there is no telling which end is slow), or losing more than `LOSS_LIMIT`."""
    bad: dict[str, str] = {}
    three = len({link.a for link in links} | {link.b for link in links}) >= 3
    for name in names:
        whys = [why for _, why in slow_ways(links, name)] if three else []
        whys += lossy_ways(links, name) if three else []
        if whys:
            bad[name] = "; ".join(whys)
    return bad


def slow_ways(links: list[Link], name: str) -> list[tuple[bool, str]]:
    """The ways node ``name`` is slow by these links ((sending, why) each): its best link that
    way under half the median of its neighbours' links that way. (Their links, not their best:
    a node beside a slow receiver has one good link out where they have two, and the best of
    two beat its one by a hair under load, naming a healthy node in CI.)"""
    ways = []
    for way, sending in (("sending", True), ("receiving", False)):
        share, theirs = _share_of_neighbours(links, name, sending)
        if share is not None and share < SLOW_FRACTION:
            ways.append((sending, f"slow {way}: {best_link(links, name, sending):.3g} GB/s at "
                                  f"best, under half its neighbours' {theirs:.3g} GB/s"))
    return ways


def _share_of_neighbours(links: list[Link], name: str, sending: bool
                         ) -> tuple[float | None, float]:
    """(node ``name``'s best link that way as a share of the median of its neighbours' links
    that way, that median), or (None, 0) where there is no telling."""
    best = best_link(links, name, sending)
    theirs = [link.gbs for peer in _neighbours(links, name) for link in links
              if (link.a if sending else link.b) == peer]
    median = statistics.median(theirs) if theirs else 0.0
    return (best / median if best is not None and median > 0 else None), median


def lossy_ways(links: list[Link], name: str) -> list[str]:
    """How node ``name`` loses, by these links: what it sends (its every link out retransmits
    more than `LOSS_LIMIT`), what it receives (its every link in), each said with the least."""
    whys = []
    for verb, sending in (("sends", True), ("receives", False)):
        losses = [link.loss for link in links if (link.a if sending else link.b) == name]
        if losses and all(loss is not None and loss > LOSS_LIMIT for loss in losses):
            least = min(loss for loss in losses if loss is not None)
            whys.append(f"loses {least:.1%} or more of what it {verb} (TCP "
                        f"retransmissions on its every link {'out' if sending else 'in'})")
    return whys


def _cpu_had(links: list[Link], name: str, sending: bool, besides: str = "") -> float | None:
    """The least share of their time the probe threads of ``name``'s links that way (but
    those to or from ``besides``) had a CPU when they wanted one, either end's: a sender
    blocks on a receiver that is slow to read, and waits for no CPU of its own meanwhile."""
    waits = [max(link.send_wait, link.recv_wait) for link in links
             if (link.a, link.b)[0 if sending else 1] == name and besides not in (link.a, link.b)]
    return 1.0 - max(waits) if waits else None


def starved_on(links: list[Link], name: str, sending: bool) -> bool:
    """Whether the threads of ``name``'s links that way had much less CPU than those of its
    neighbours' other links that way, in this turn. (That way only: a thread sending at
    gigabytes a second waits for a CPU far more than one held to a slow link, whatever the
    machine.)"""
    mine = _cpu_had(links, name, sending)
    theirs = [had for peer in _neighbours(links, name)
              if (had := _cpu_had(links, peer, sending, besides=name)) is not None]
    return mine is not None and bool(theirs) and mine < STARVED * statistics.median(theirs)


def machine_bound(links: list[Link], name: str, sending: bool) -> bool:
    """Whether ``name``'s probes that way had a CPU under `MACHINE_BOUND` of the time they
    wanted one, and it is not grossly slow that way (`GROSS_FRACTION`)."""
    had = _cpu_had(links, name, sending)
    share, _ = _share_of_neighbours(links, name, sending)
    return had is not None and had < MACHINE_BOUND and share is not None and \
        share >= GROSS_FRACTION


def excused(links: list[Link], name: str) -> bool:
    """Whether a flagged node's turn says more of the machine than of it: starved every way it
    is slow (against its neighbours, or waiting for a CPU most of the time: `machine_bound`),
    and not lossy (starvation delays, it does not drop: a receiver slow to read is acknowledged
    late, and what TCP sent again needlessly the receiver reports as a duplicate, subtracted)."""
    slow = slow_ways(links, name)
    return bool(slow) and not lossy_ways(links, name) and all(
        starved_on(links, name, sending) or machine_bound(links, name, sending)
        for sending, _ in slow)


def confirm(links: list[Link], names: list[str], times: int,
            measure: Callable[[list[str]], list[Link]]
            ) -> tuple[list[Link], dict[str, str], dict[str, str]]:
    """(each link's best figure over every turn, the nodes named, the nodes left inconclusive):
    a node flagged in the first turn is measured again (``measure``: a turn of its links, with
    its neighbours) ``times`` times, and named only if every turn finds it bad; one whose last
    turn was starved (its probes had far less CPU than its neighbours': `starved_on`), and not
    lossy, is inconclusive: said, not named. Noise passes; a slow NIC or a lossy link is bad every
    time."""
    best = {(link.a, link.b): link for link in links}
    flagged, judged = judge(links, names), links
    starved = {name for name in flagged if excused(links, name)}
    for _ in range(times if flagged else 0):
        try:
            turn = measure(list(flagged))
        except RingFailed as exc:  # measured again, its links could not even finish the test
            lossy = {name for name in flagged if lossy_ways(judged, name)}
            return list(best.values()), _unfinished(flagged, exc, lossy), {}
        judged = turn
        for link in turn:
            known = best.get((link.a, link.b))
            if known is not None and link.gbs > known.gbs:
                best[link.a, link.b] = link
        flagged = judge(turn, list(flagged))  # (a good figure clears a node, starved or not)
        starved = {name for name in flagged if excused(turn, name)}
        if not flagged:
            break
    inconclusive = {name: f"{why} (inconclusive: its probes had far less CPU than its "
                          "neighbours', or a CPU under half the time: the machine was the "
                          "bound, not named)"
                    for name, why in flagged.items() if name in starved}
    named = {name: why for name, why in flagged.items() if name not in starved}
    return list(best.values()), named, inconclusive


def _unfinished(flagged: dict[str, str], exc: RingFailed, lossy: set[str]) -> dict[str, str]:
    """Who is named when the flagged nodes' links could not finish the test again: the flagged
    nodes whenever one of them took part (bad in a finished turn, then the link they were in
    failed: a lossy sender's link is charged to its receiver, the `suspect`, which is not the
    fault), and of them the ``lossy`` ones where any is (a node flagged only as slow beside a
    lossy one is slowed by it: a CI run named node-3, slow sending into node-2, which lost 10 %
    both ways, with node-2's reasons); the suspect only when no flagged node took part (the
    first turn flagged the wrong one). Each is said with its own reason."""
    if exc.suspect is None or exc.suspect in flagged or \
            any(name in flagged for name in exc.involved):
        return {name: f"{why}; then its links did not finish the test"
                for name, why in flagged.items() if name in lossy or not lossy}
    return {exc.suspect: "its links did not finish the test"}


def neighbourhood(nodes: list[Node], names: list[str]) -> list[Node]:
    """The nodes ``names`` and their neighbours in the ring of ``nodes``, in order: a ring of
    these gives each named node its four links of the whole ring, at a few nodes' cost."""
    at = [i for i, node in enumerate(nodes) if node.name in names]
    wanted = {(i + step) % len(nodes) for i in at for step in (-1, 0, 1)}
    return [nodes[i] for i in sorted(wanted)]
