"""`full`'s network probe (`net`), through torch and the job's backend: each link of the ring
on its own, then an all-reduce over every node, with how long its ranks waited for a CPU (a
collective that crawled on a starved machine measured the machine, not its network)."""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Callable

from .link_stats import losses_by_peer, process_run_and_wait_ns, socket_losses
from .net_probes import LINK_BUDGET_SHARE

COLLECTIVE_SLACK = 20.0  # the all-reduce may take this many times what its links allow...
COLLECTIVE_MIN_S = 10.0  # ...and never less than this, before it counts as crawling
COLLECTIVE_MAX_SHARE = 0.3  # ...and never more than this share of the probe's time
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
        started, before = time.perf_counter(), process_run_and_wait_ns()

        def cpu_wait() -> float:
            # Of the time the timed rounds' threads wanted a CPU, the share they waited for
            # one: a collective that crawled while its ranks waited most of it measured the
            # machine's load (a slow link's ranks wait on the network, wanting no CPU).
            (ran, waited), (ran_before, waited_before) = process_run_and_wait_ns(), before
            ran, waited = ran - ran_before, waited - waited_before
            return round(waited / max(1, ran + waited), 3)

        try:
            for round_ in range(iters + 1):  # the first warms up: connections made
                work = dist.all_reduce(data, async_op=True)
                work.wait(timeout=timedelta(seconds=max(0.1, deadline - time.perf_counter())))
                sync()
                if round_ == 0:
                    started, before = time.perf_counter(), process_run_and_wait_ns()
                else:
                    done += 1
        except RuntimeError:  # a crawling collective: said, and this process leaves at once
            if rank == 0:
                print(json.dumps({"busbw_gbs": None, "bytes": size, "links": merged,
                                  "collective_timed_out": round(limit, 1),
                                  "collective_cpu_wait": cpu_wait()}), flush=True)
            sys.stdout.flush()
            os._exit(0)  # the group cannot be torn down politely while a peer is stuck in it
        per = (time.perf_counter() - started) / max(1, done)
        busbw = size / per * 2 * (world - 1) / world / 1e9
        waits: list = [None] * world
        dist.all_gather_object(waits, cpu_wait())  # the most starved rank's share
        if rank != 0:
            return {}
        return {"busbw_gbs": round(busbw, 4), "bytes": size, "links": merged,
                "collective_cpu_wait": max(waits)}
    finally:
        dist.destroy_process_group()
