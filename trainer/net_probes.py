"""The network probes a node runs for the health gate (`trainer/probes.py` is their entry):
whether the others answer at all (`reach`), this node's links to its ring neighbours over plain
TCP (`ring`: no torch), and with `full` the links and an all-reduce through torch (`net`)."""

from __future__ import annotations

import json
import os
import socket
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

from .link_stats import (
    counter_problems,
    device_counters,
    loss_share,
    losses_by_peer,
    socket_losses,
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


COLLECTIVE_SLACK = 20.0  # the all-reduce may take this many times what its links allow...
COLLECTIVE_MIN_S = 10.0  # ...and never less than this, before it counts as crawling
COLLECTIVE_MAX_SHARE = 0.3  # ...and never more than this share of the probe's time
MAX_CONNECT_PAUSE_S = 0.2  # a link not yet listening is tried again after at most this
FULL_CHUNKS = 8  # `net`: each link's message goes in this many sends, so that it can stop
MORE, ROUND_END, LAST = 1.0, 0.0, -1.0  # ...said before each: a chunk, a round's end, the last


def _send_rounds(dist, receiver: int, chunks: tuple, flag, ack, iters: int, stop: float,
                 sync: Callable[[], None]) -> float:
    """Up to ``iters`` rounds of ``chunks`` to ``receiver``, each acknowledged, until time
    ``stop`` (after a chunk at least): the best bytes a second of a round."""
    best = 0.0
    for round_ in range(iters):
        began, sent = time.perf_counter(), 0
        for chunk in chunks:
            dist.send(flag.fill_(MORE), receiver)
            dist.send(chunk, receiver)
            sent += chunk.numel() * chunk.element_size()
            if time.perf_counter() > stop:
                break
        last = round_ == iters - 1 or time.perf_counter() > stop
        dist.send(flag.fill_(LAST if last else ROUND_END), receiver)
        dist.recv(ack, receiver)
        sync()
        best = max(best, sent / (time.perf_counter() - began))
        if last:
            break
    return best


def _serve_rounds(dist, sender: int, chunks: tuple, flag, ack) -> None:
    """The receiving end of `_send_rounds`."""
    at = 0
    while True:
        dist.recv(flag, sender)
        if float(flag.item()) == MORE:
            dist.recv(chunks[at % len(chunks)], sender)
            at += 1
            continue
        at = 0
        dist.send(ack, sender)
        if float(flag.item()) == LAST:
            return


def net_probe(rank: int, world: int, master: str, port: int, backend: str, size: int,
              iters: int, timeout: float, addresses: list[str] | None = None) -> dict:
    """Each link of the ring, each way, on its own (node i -> i+1 and i+1 -> i, best of
    ``iters`` round trips, cut short after `LINK_BUDGET_SHARE` of ``timeout``), then the
    all-reduce bus bandwidth over every node (nccl-tests' definition: algbw × 2(n-1)/n) under
    a time limit derived from the slowest link just measured: a crawling collective ends in
    seconds, said as ``collective_timed_out``. With the nodes' ``addresses`` (rank order),
    each link also says what its connection lost while the links were timed
    (`socket_losses`: the backend's own sockets)."""
    from datetime import timedelta

    import torch
    import torch.distributed as dist

    device = torch.device("cuda", 0) if backend == "nccl" else torch.device("cpu")
    dist.init_process_group(backend, init_method=f"tcp://{master}:{port}", rank=rank,
                            world_size=world, timeout=timedelta(seconds=timeout))
    if addresses and (len(set(addresses)) < len(addresses) or len(addresses) != world):
        addresses = None  # nodes that share an address (loopback): no telling peers apart
    try:
        connections = socket_losses() if addresses else {}
        data = torch.ones(size // 4, dtype=torch.float32, device=device)

        def sync() -> None:
            if device.type == "cuda":
                torch.cuda.synchronize()

        ack = torch.zeros(1, device=device)
        flag = torch.zeros(1, device=device)  # before each chunk: MORE, a round's end or LAST
        chunks = data.split(max(1, data.numel() // FULL_CHUNKS))
        links: list[tuple[int, int, float]] = []
        pairs = [(i, (i + 1) % world) for i in range(world)]  # each way: send and receive
        pairs += [(b, a) for a, b in pairs if world > 2]
        for sender, receiver in pairs:
            dist.barrier()
            best = 0.0
            if rank == sender:
                best = _send_rounds(dist, receiver, chunks, flag, ack, iters,
                                    time.perf_counter() + timeout * LINK_BUDGET_SHARE, sync)
            elif rank == receiver:
                _serve_rounds(dist, sender, chunks, flag, ack)
            links.append((sender, receiver, best / 1e9 if rank == sender else 0.0))
        # Every rank: the same figures (the same time limit below), each link with what its
        # connections lost meanwhile (the sender's counters, by peer rank).
        mine = losses_by_peer(connections, socket_losses()) if addresses else {}
        measured: list = [None] * world
        dist.all_gather_object(measured, (links, {
            addresses.index(ip): pair for ip, pair in mine.items()
            if addresses and ip in addresses}))
        merged = [[a, b, max(part[k][2] for part, _ in measured),
                   *(measured[a][1].get(b) or (0, 0)), 0.0]
                  for k, (a, b, _) in enumerate(links)]
        slowest = min(link[2] for link in merged) * 1e9
        limit = min(max(COLLECTIVE_MIN_S, COLLECTIVE_SLACK * size * 2 / slowest) * (iters + 1),
                    timeout * COLLECTIVE_MAX_SHARE)
        deadline, done = time.perf_counter() + limit, 0
        started = time.perf_counter()
        try:
            for round_ in range(iters + 1):  # the first warms up: connections made
                work = dist.all_reduce(data, async_op=True)
                work.wait(timeout=timedelta(seconds=max(0.1, deadline - time.perf_counter())))
                sync()
                if round_ == 0:
                    started = time.perf_counter()
                else:
                    done += 1
        except RuntimeError:  # a crawling collective: said, and this process leaves at once
            if rank == 0:
                print(json.dumps({"busbw_gbs": None, "bytes": size, "links": merged,
                                  "collective_timed_out": round(limit, 1)}), flush=True)
            sys.stdout.flush()
            os._exit(0)  # the group cannot be torn down politely while a peer is stuck in it
        per = (time.perf_counter() - started) / max(1, done)
        busbw = size / per * 2 * (world - 1) / world / 1e9
        if rank != 0:
            return {}
        return {"busbw_gbs": round(busbw, 4), "bytes": size, "links": merged}
    finally:
        dist.destroy_process_group()


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
