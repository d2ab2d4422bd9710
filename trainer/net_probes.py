"""The network probes a node runs for the health gate (`trainer/probes.py` is their entry):
whether the others answer at all (`reach`) and this node's links to its ring neighbours over
plain TCP (`ring`: no torch). `full`'s, through torch, are in `collective_probe.py`."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable
from typing import Any

from .link_stats import (
    counter_problems,
    device_counters,
    loss_share,
    tcp_loss,
    thread_wait_ns,
)


def reach_probe(addresses: list[str], port: int, timeout: float) -> dict:
    """Which addresses answer at all: a connection accepted or refused is a live link (a refusal
    is the peer's kernel answering); a timeout is a cut or dead one. Needs no listener."""
    def answers(address: str) -> bool:
        try:
            socket.create_connection((address, port), timeout=timeout).close()
        except ConnectionRefusedError:
            return True
        except OSError:
            return False
        return True
    return {"reached": dict(zip(addresses, in_threads(answers, addresses), strict=True))}


def in_threads(work: Callable, items: list) -> list:
    """``work`` on every item at once, one thread each; results in order (an error in any is
    raised). (Not concurrent.futures: on a node, importing it and the logging it pulls in cost
    more than the rest of a quick probe's start, paid on every node of a cluster at once.)"""
    results: list = [None] * len(items)
    errors: list[BaseException] = []

    def one(index: int) -> None:
        try:
            results[index] = work(items[index])
        except BaseException as exc:  # noqa: BLE001 - raised below, in the caller's thread
            errors.append(exc)
    threads = [threading.Thread(target=one, args=(i,), daemon=True) for i in range(len(items))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if errors:
        raise errors[0]
    return results


MAX_CONNECT_PAUSE_S = 0.2  # a link not yet listening is tried again after at most this


def ring_port(addresses: list[str], rank: int, port: int) -> int:
    """Where node ``rank`` listens: ``port`` on its own address; nodes that share one address
    (local nodes where only 127.0.0.1 binds) each take the next port."""
    return port + rank if addresses.count(addresses[rank]) > 1 else port


def _read(conn: socket.socket, size: int, buffer: bytearray) -> None:
    view, got = memoryview(buffer), 0
    while got < size:
        n = conn.recv_into(view[got:size])
        if not n:
            raise ConnectionError("the peer closed the link")
        got += n


CHUNK = 256 << 10  # the ring test sends in frames of this many bytes at most...
DONE = 0xFFFFFFFF  # ...each a length first; 0 ends a round (acknowledged), this the link's test
PING = 0xFFFFFFFE  # a connection's first word instead of a rank: is this node's probe up?
# A link's round trips stop after this share of the probe's time (after a frame at least): a
# link that loses one packet in ten takes minutes over megabytes, each loss a retransmission
# timeout; it shows in what it managed and what it lost, within the time the ring has.
LINK_BUDGET_SHARE = 0.05
LINK_OVERTIME = 3  # ...or up to this many times that, while too few segments tell its loss


def framed(length: int) -> bytes:
    return length.to_bytes(4, "big") + bytes(length)


def ring_color(rank: int, world: int) -> int:
    """When node ``rank`` sends in the ring test: no two neighbours share a color (3 colors
    go round any ring of 3 or more), and colors send in order, so that no node sends while
    it receives. That matters: a node's receive queue also carries the acknowledgements of
    what it sends, and a node slow to receive would look slow to send too."""
    if world == 2:
        return rank
    return 1 if world % 3 == 1 and rank == world - 1 else rank % 3


def serial_turn(rank: int, world: int, first: int = 0) -> tuple[list[int], list[int]]:
    """(whom node ``rank`` waits to hear from, whom it sends to, in order) when each link goes
    alone: node ``first`` starts; each node sends to its previous neighbour, then its next,
    whose turn it is once that last link is done."""
    previous = (rank - 1) % world
    waits = [] if rank == first % world else [previous]
    return waits, ([previous] if world == 2 else [previous, (rank + 1) % world])


def ring_probe(rank: int, addresses: list[str], port: int, size: int, iters: int,
               timeout: float, alone: bool = False, first: int = 0) -> dict:
    """This node's links to its two neighbours of the ring (node i -> i+1 and i -> i-1) over
    plain TCP between the nodes' private addresses, each the best of ``iters`` round trips of
    ``size`` bytes (cut short after `LINK_BUDGET_SHARE` of ``timeout``), while it serves
    theirs: every node is measured as a sender (twice) and as a receiver (twice), so a node
    slow one way only shows (a degraded NIC, a transmit queue).
    Two nodes: one link each way. A node sends once its neighbours of lower colors
    (`ring_color`) have sent to it; no torch is imported (the quick check costs a Python
    start). A link that never connects fails within ``timeout``.
    ``alone``: each link of the ring on its own, one after another from node ``first``
    (`serial_turn`), for a node measured again: nodes measured at once share a machine's CPUs,
    a switch's ports."""
    world = len(addresses)
    targets = sorted({(rank + 1) % world, (rank - 1) % world} - {rank},
                     key=lambda peer: (peer - rank) % world)  # the next first
    deadline = time.monotonic() + timeout
    started, counted = time.monotonic(), device_counters()
    server = socket.create_server((addresses[rank], ring_port(addresses, rank, port)),
                                  backlog=8)
    server.settimeout(timeout)
    received = {peer: threading.Event() for peer in targets}
    starved: dict[int, float] = {}  # each peer's link into this node: its receiver's CPU wait
    failures: list[BaseException] = []

    def serve_one(conn: socket.socket, peer: int) -> None:
        try:
            with conn:
                header, buffer = bytearray(4), bytearray(CHUNK)
                waited, began = thread_wait_ns(), time.perf_counter_ns()
                while True:  # frames of a round, a round's end (0), the link's end (DONE)
                    _read(conn, 4, header)
                    length = int.from_bytes(header, "big")
                    if length == DONE:
                        break
                    if length == 0:
                        conn.sendall(b"k")
                    elif length <= CHUNK:
                        _read(conn, length, buffer)
                    else:
                        raise ConnectionError(f"node {peer} sent a frame of {length} bytes")
                starved[peer] = (thread_wait_ns() - waited) / max(
                    1, time.perf_counter_ns() - began)
            received[peer].set()
        except BaseException as exc:  # said below, in this probe's answer
            failures.append(exc)

    def serve() -> None:
        try:
            served = 0
            while served < len(targets):
                conn, _ = server.accept()
                conn.settimeout(max(0.1, deadline - time.monotonic()))
                header = bytearray(4)
                _read(conn, 4, header)
                if int.from_bytes(header, "big") == PING:
                    conn.close()
                    continue
                served += 1
                threading.Thread(target=serve_one, args=(conn, int.from_bytes(header, "big")),
                                 daemon=True).start()
        except BaseException as exc:
            failures.append(exc)

    def connect(peer: int) -> socket.socket:
        pause = 0.01
        while True:
            try:
                return socket.create_connection(
                    (addresses[peer], ring_port(addresses, peer, port)),
                    timeout=max(0.1, min(5.0, deadline - time.monotonic())))
            except OSError:  # its server is not up yet, or the link is cut: until the deadline
                if time.monotonic() >= deadline:
                    raise
                # Backing off: hundreds of probes polling every 10 ms while the others start
                # (a large cluster, or many nodes on one host) slowed those starts tenfold.
                time.sleep(pause)
                pause = min(pause * 2, MAX_CONNECT_PAUSE_S)

    def to_peer(peer: int, work: Callable[[socket.socket], Any]) -> Any:
        """``work`` on a new connection to ``peer``; a failure names the peer."""
        try:
            with connect(peer) as sock:
                return work(sock)
        except OSError as exc:
            raise ConnectionError(f"sending to node {peer}: {exc or type(exc).__name__}"
                                  ) from None

    def ping(peer: int) -> None:
        to_peer(peer, lambda sock: sock.sendall(PING.to_bytes(4, "big")))

    def send_to(peer: int) -> list[float]:
        """[GB/s at best, segments lost, data segments sent, the share of the sending time
        this thread waited for a CPU]; a failure names the peer."""
        return to_peer(peer, timed)

    def timed(sock: socket.socket) -> list[float]:
        sock.settimeout(max(0.1, deadline - time.monotonic()))
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # a round's end: now
        sock.sendall(rank.to_bytes(4, "big"))
        full, tail = framed(CHUNK), framed(size % CHUNK)  # (each made once, sent again)
        frames = [full] * (size // CHUNK) + ([tail] if size % CHUNK else [])
        ack, best = bytearray(1), 0.0
        waited, sending = thread_wait_ns(), time.perf_counter_ns()
        budget, began_link = timeout * LINK_BUDGET_SHARE, time.monotonic()

        def done() -> bool:  # its time is up, and its loss can be read (or far past it)
            spent = time.monotonic() - began_link
            if spent <= budget:
                return False
            lost, segments = tcp_loss(sock)  # (0, 0): a kernel that does not say
            return (spent > budget * LINK_OVERTIME or not segments
                    or loss_share(lost, segments) is not None)
        for _ in range(iters):
            began, sent = time.perf_counter(), 0
            for frame in frames:
                sock.sendall(frame)
                sent += len(frame) - 4
                if done():
                    break
            sock.sendall(bytes(4))
            _read(sock, 1, ack)
            best = max(best, sent / (time.perf_counter() - began))
            if done():
                break
        sock.sendall(DONE.to_bytes(4, "big"))
        wait_share = (thread_wait_ns() - waited) / max(1, time.perf_counter_ns() - sending)
        retransmitted, segments = tcp_loss(sock)
        return [best / 1e9, retransmitted, segments, wait_share]

    def heard(peers: list[int]) -> bool:
        return all(received[p].wait(max(0.0, deadline - time.monotonic())) for p in peers)

    threading.Thread(target=serve, daemon=True).start()
    mine = ring_color(rank, world)
    try:
        waits, order = serial_turn(rank, world, first) if alone else (
            [peer for peer in targets if ring_color(peer, world) < mine], None)
        if alone and not waits:  # the first to send waits for every probe to be up: one
            # still starting takes CPU from its links on a shared machine
            in_threads(ping, [peer for peer in range(world) if peer != rank])
        if not heard(waits):
            raise ConnectionError(f"no data from node {waits[0]} in {timeout:g}s")
        sent = dict(zip(targets, in_threads(send_to, targets), strict=True)) if order is None \
            else {peer: send_to(peer) for peer in order}  # (in turn: each link alone)
        rates = [sent[peer] for peer in targets]
        if not heard(targets):
            late = next(p for p in targets if not received[p].is_set())
            raise ConnectionError(failures[0] if failures else
                                  f"no data from node {late} in {timeout:g}s")
    finally:  # on any way out: the port is the job's next (a failed link: `quick` goes on)
        server.close()
    # Each link out: [this node, peer, GB/s, retransmitted, sent, CPU wait share]; each link
    # in: [peer, the receiving thread's CPU wait share]; what the device counters say.
    return {"links": [[rank, peer, round(gbs, 6), int(retrans), int(sent), round(wait, 3)]
                      for peer, (gbs, retrans, sent, wait) in zip(targets, rates, strict=True)],
            "served": [[peer, round(share, 3)] for peer, share in sorted(starved.items())],
            "link_problems": counter_problems(counted, device_counters(),
                                              time.monotonic() - started)}
