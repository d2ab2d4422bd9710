"""Health probes that run on a node, each printing one JSON line for the controller
(`bootstrap/health.py`), which reads it as untrusted input.

    python -m trainer.probes node --gpus 8 --dcgm 1    this node's GPUs, their errors, DCGM
    python -m trainer.probes net --rank R --world N --master ADDR --port P --backend gloo
                                                       all-reduce bus bandwidth over all nodes,
                                                       then each link of a ring of the nodes
    python -m trainer.probes ring --rank R --port P ADDR...
                                                       this node's link to the next of the ring,
                                                       over plain TCP: no torch to import
    python -m trainer.probes quick --rank R --port P ADDR... [node's flags]
                                                       ring, then node: the quick check's one
                                                       process per node
    python -m trainer.probes reach ADDR...             which nodes this one reaches

Each external tool runs under its own time limit: a hung `nvidia-smi` or `dcgmi` (seen on
p4d/p5 in ParallelCluster's prolog, aws-parallelcluster #6777) fails its check, not the probe.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

# nvidia-smi's machine-readable fields (`nvidia-smi --help-query-gpu`).
GPU_FIELDS = ("index", "pci.bus_id", "ecc.errors.uncorrected.volatile.total",
              "retired_pages.pending", "clocks_throttle_reasons.active",
              "pcie.link.width.current", "pcie.link.width.max", "temperature.gpu")
# Throttle reasons that mean hardware trouble (nvml.h): HW slowdown, SW/HW thermal, power brake.
BAD_THROTTLE = {0x8: "hardware slowdown", 0x20: "software thermal slowdown",
                0x40: "hardware thermal slowdown", 0x80: "hardware power brake"}
# XIDs that mean a bad GPU or link, not a bad program (NVIDIA's XID catalog): double-bit ECC,
# row remapping, NVLink, fallen off the bus, uncontained ECC, GSP and contained errors.
BAD_XIDS = {48, 63, 64, 74, 79, 92, 94, 95, 119, 120}
TOOL_TIMEOUT_S = 20.0
# `dcgmi diag -r 1` takes about 10 s, `-r 2` 2.5 to 10.5 min (AWS's GPU health-check suite).
DCGM_TIMEOUT_S = {1: 90.0, 2: 900.0}


def tool(argv: list[str], timeout: float = TOOL_TIMEOUT_S) -> tuple[int | None, str]:
    """(exit code, output) of a tool; (None, why) when it is missing or hangs."""
    if not shutil.which(argv[0]):
        return None, f"{argv[0]} not installed"
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return None, f"{argv[0]} did not answer within {timeout:g}s"
    return done.returncode, (done.stdout + done.stderr)[-4000:]


def gpu_problems(csv: str) -> list[str]:
    """What is wrong with each GPU, from `nvidia-smi --query-gpu=<GPU_FIELDS>` output."""
    problems = []
    for line in csv.strip().splitlines():
        values = dict(zip(GPU_FIELDS, (v.strip() for v in line.split(",")), strict=False))
        gpu = f"GPU {values.get('index', '?')}"
        if values.get("ecc.errors.uncorrected.volatile.total", "0") not in ("0", "[N/A]", "N/A"):
            problems.append(f"{gpu}: {values['ecc.errors.uncorrected.volatile.total']} "
                            "uncorrectable ECC errors")
        if values.get("retired_pages.pending", "").lower() == "yes":
            problems.append(f"{gpu}: retired pages pending (reset the GPU)")
        try:
            reasons = int(values.get("clocks_throttle_reasons.active", "0"), 16)
        except ValueError:
            reasons = 0
        problems += [f"{gpu}: {why}" for bit, why in BAD_THROTTLE.items() if reasons & bit]
        width, widest = values.get("pcie.link.width.current"), values.get("pcie.link.width.max")
        if width and widest and width.isdigit() and widest.isdigit() and int(width) < int(widest):
            problems.append(f"{gpu}: PCIe link x{width}, the card's is x{widest}")
    return problems


# The driver's own line (its printk), after journalctl's `-o cat` nothing or dmesg's timestamp:
# "NVRM: Xid (PCI:0000:10:1c): 79, pid=0, ...". A process's name in a kernel line (a segfault:
# "NAME[pid]: segfault at ...") is at most 15 characters and cannot forge it.
XID_LINE = re.compile(r"^(?:\[[^\]]*\]\s*)?NVRM: Xid \(PCI:[0-9A-Fa-f:.]+\): (\d+),")
MAX_KERNEL_LOG = 64 << 20  # bytes of the kernel log since boot read at most


def xid_problems(kernel_log: str) -> list[str]:
    """Bad XIDs in the kernel log since boot, from the driver's own lines only."""
    found = set()
    for line in kernel_log.splitlines():
        match = XID_LINE.match(line)
        if match and int(match[1]) in BAD_XIDS:
            found.add(f"XID {match[1]} in the kernel log")
    return sorted(found)


def kernel_log() -> tuple[str | None, str]:
    """(the kernel's messages since boot, where from) or (None, why none could be read): the
    journal (`journalctl -k -b`), else the ring buffer (`dmesg`). "No journal files" (no
    journald, or no persistent journal in a container) is no kernel log, not an empty one."""
    whys = []
    for argv in (["journalctl", "-k", "-b", "--no-pager", "-q", "-o", "cat"], ["dmesg"]):
        if not shutil.which(argv[0]):
            whys.append(f"{argv[0]} not installed")
            continue
        try:
            done = subprocess.run(argv, capture_output=True, timeout=TOOL_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            whys.append(f"{argv[0]} did not answer within {TOOL_TIMEOUT_S:g}s")
            continue
        said = done.stderr.decode(errors="replace").strip()
        if done.returncode == 0 and "No journal files" not in said and done.stdout.strip():
            return done.stdout[-MAX_KERNEL_LOG:].decode(errors="replace"), argv[0]
        whys.append(f"{argv[0]}: {(said.splitlines() or [f'exit {done.returncode}'])[-1][:120]}")
    return None, "; ".join(whys)


def node_probe(gpus: int, dcgm_level: int, efa: bool, infiniband: bool) -> dict:
    checks: dict[str, str] = {}
    problems: list[str] = []
    if gpus:
        code, out = tool(["nvidia-smi", f"--query-gpu={','.join(GPU_FIELDS)}",
                          "--format=csv,noheader,nounits"])
        if code == 0:
            seen = len(out.strip().splitlines())
            checks["gpus"] = f"{seen} seen"
            problems += [f"{seen} GPUs seen, {gpus} expected"] if seen != gpus else []
            problems += gpu_problems(out)
        else:
            problems.append(f"nvidia-smi: {out.strip().splitlines()[-1] if out.strip() else code}")
        code, out = tool(["nvidia-smi", "--query-remapped-rows=gpu_bus_id,remapped_rows.pending,"
                          "remapped_rows.failure", "--format=csv,noheader"])
        if code == 0:
            for line in out.strip().splitlines():
                parts = [p.strip().lower() for p in line.split(",")]
                if len(parts) == 3 and ("yes" in parts[1:] or parts[1:] == ["1", "1"]):
                    problems.append(f"GPU {parts[0]}: row remapping pending or failed")
        log, source = kernel_log()
        if log is None:  # never a pass: an unread log says nothing of the GPUs' XIDs
            checks["xid"] = "kernel log unreadable"
            problems.append(f"XID: kernel log unreadable ({source})")
        else:
            checks["xid"] = f"read ({source})"
            problems += xid_problems(log)
        if dcgm_level:
            code, out = tool(["dcgmi", "diag", "-r", str(dcgm_level)],
                             timeout=DCGM_TIMEOUT_S[dcgm_level])
            checks["dcgm"] = "not installed" if code is None and "installed" in out else \
                "passed" if code == 0 else "failed"
            if checks["dcgm"] == "failed":
                problems.append(f"dcgmi diag -r {dcgm_level}: {out.strip()[-200:]}")
    if efa:
        code, out = tool(["fi_info", "-p", "efa"])
        if code is None and os.path.exists("/opt/amazon/efa/bin/fi_info"):
            code, out = tool(["/opt/amazon/efa/bin/fi_info", "-p", "efa"])
        checks["efa"] = f"{out.count('provider: efa')} efa endpoints" if code == 0 else "missing"
        problems += [] if code == 0 else ["EFA expected, `fi_info -p efa` finds none"]
    if infiniband:
        code, out = tool(["ibv_devinfo"])
        active = out.count("PORT_ACTIVE") if code == 0 else 0
        checks["infiniband"] = f"{active} active ports"
        problems += [] if active else ["InfiniBand expected, no active port (ibv_devinfo)"]
    return {"checks": checks, "problems": problems}


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
    with ThreadPoolExecutor(max_workers=max(1, min(32, len(addresses)))) as pool:
        return {"reached": dict(zip(addresses, pool.map(answers, addresses), strict=True))}


COLLECTIVE_SLACK = 20.0  # the all-reduce may take this many times what its links allow...
COLLECTIVE_MIN_S = 10.0  # ...and never less than this, before it counts as crawling


def net_probe(rank: int, world: int, master: str, port: int, backend: str, size: int,
              iters: int, timeout: float) -> dict:
    """Each link of the ring, each way, on its own (node i -> i+1 and i+1 -> i, best of
    ``iters`` round trips), then the all-reduce bus bandwidth over every node (nccl-tests'
    definition: algbw × 2(n-1)/n) under a time limit derived from the slowest link just
    measured: a crawling collective ends in seconds, said as ``collective_timed_out``."""
    from datetime import timedelta

    import torch
    import torch.distributed as dist

    device = torch.device("cuda", 0) if backend == "nccl" else torch.device("cpu")
    dist.init_process_group(backend, init_method=f"tcp://{master}:{port}", rank=rank,
                            world_size=world, timeout=timedelta(seconds=timeout))
    try:
        data = torch.ones(size // 4, dtype=torch.float32, device=device)

        def sync() -> None:
            if device.type == "cuda":
                torch.cuda.synchronize()

        ack = torch.zeros(1, device=device)
        links: list[list[float]] = []
        pairs = [(i, (i + 1) % world) for i in range(world)]  # each way: send and receive
        pairs += [(b, a) for a, b in pairs if world > 2]
        for sender, receiver in pairs:
            dist.barrier()
            best = float("inf")
            for _ in range(iters):
                if rank == sender:
                    began = time.perf_counter()
                    dist.send(data, receiver)
                    dist.recv(ack, receiver)
                    best = min(best, time.perf_counter() - began)
                elif rank == receiver:
                    dist.recv(data, sender)
                    dist.send(ack, sender)
            links.append([sender, receiver, size / best / 1e9 if rank == sender else 0.0])
        measured = [None] * world
        dist.all_gather_object(measured, links)  # every rank: the same figures, the same limit
        merged = [[a, b, max(part[k][2] for part in measured)]
                  for k, (a, b, _) in enumerate(links)]
        slowest = min(gbs for _, _, gbs in merged) * 1e9
        limit = max(COLLECTIVE_MIN_S, COLLECTIVE_SLACK * size * 2 / slowest) * (iters + 1)
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


def ring_color(rank: int, world: int) -> int:
    """When node ``rank`` sends in the ring test: no two neighbours share a color (3 colors
    go round any ring of 3 or more), and colors send in order, so that no node sends while
    it receives. That matters: a node's receive queue also carries the acknowledgements of
    what it sends, and a node slow to receive would look slow to send too."""
    if world == 2:
        return rank
    return 1 if world % 3 == 1 and rank == world - 1 else rank % 3


def ring_probe(rank: int, addresses: list[str], port: int, size: int, iters: int,
               timeout: float) -> dict:
    """This node's links to its two neighbours of the ring (node i -> i+1 and i -> i-1) over
    plain TCP between the nodes' private addresses, each the best of ``iters`` round trips of
    ``size`` bytes, while it serves theirs: every node is measured as a sender (twice) and as
    a receiver (twice), so a node slow one way only shows (a degraded NIC, a transmit queue).
    Two nodes: one link each way. A node sends once its neighbours of lower colors
    (`ring_color`) have sent to it; no torch is imported (the quick check costs a Python
    start). A link that never connects fails within ``timeout``."""
    world = len(addresses)
    targets = sorted({(rank + 1) % world, (rank - 1) % world} - {rank},
                     key=lambda peer: (peer - rank) % world)  # the next first
    deadline = time.monotonic() + timeout
    server = socket.create_server((addresses[rank], ring_port(addresses, rank, port)),
                                  backlog=8)
    server.settimeout(timeout)
    received = {peer: threading.Event() for peer in targets}
    failures: list[BaseException] = []

    def serve_one(conn: socket.socket) -> None:
        try:
            with conn:
                conn.settimeout(max(0.1, deadline - time.monotonic()))
                header = bytearray(4)
                _read(conn, 4, header)
                peer = int.from_bytes(header, "big")
                buffer = bytearray(size)
                for _ in range(iters):
                    _read(conn, size, buffer)
                    conn.sendall(b"k")
            received[peer].set()
        except BaseException as exc:  # said below, in this probe's answer
            failures.append(exc)

    def serve() -> None:
        try:
            for _ in targets:
                conn, _ = server.accept()
                threading.Thread(target=serve_one, args=(conn,), daemon=True).start()
        except BaseException as exc:
            failures.append(exc)

    def send_to(peer: int) -> float:
        while True:
            try:
                sock = socket.create_connection(
                    (addresses[peer], ring_port(addresses, peer, port)),
                    timeout=max(0.1, min(5.0, deadline - time.monotonic())))
                break
            except OSError:  # its server is not up yet, or the link is cut: until the deadline
                if time.monotonic() >= deadline:
                    raise
                time.sleep(0.01)
        with sock:
            sock.settimeout(max(0.1, deadline - time.monotonic()))
            sock.sendall(rank.to_bytes(4, "big"))
            payload, ack, best = bytes(size), bytearray(1), float("inf")
            for _ in range(iters):
                began = time.perf_counter()
                sock.sendall(payload)
                _read(sock, 1, ack)
                best = min(best, time.perf_counter() - began)
        return size / best / 1e9

    def heard(peers: list[int]) -> bool:
        return all(received[p].wait(max(0.0, deadline - time.monotonic())) for p in peers)

    threading.Thread(target=serve, daemon=True).start()
    mine = ring_color(rank, world)
    try:
        first = [peer for peer in targets if ring_color(peer, world) < mine]
        if not heard(first):
            raise ConnectionError(f"no data from node {first[0]} in {timeout:g}s")
        with ThreadPoolExecutor(max_workers=len(targets)) as pool:
            rates = list(pool.map(send_to, targets))
        if not heard(targets):
            late = next(p for p in targets if not received[p].is_set())
            raise ConnectionError(failures[0] if failures else
                                  f"no data from node {late} in {timeout:g}s")
    finally:  # on any way out: the port is the job's next (a failed link: `quick` goes on)
        server.close()
    return {"links": [[rank, peer, round(rate, 6)] for peer, rate in zip(targets, rates,
                                                                          strict=True)]}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m trainer.probes")
    sub = parser.add_subparsers(dest="probe", required=True)
    node = sub.add_parser("node")
    net = sub.add_parser("net")
    net.add_argument("--world", type=int, required=True)
    net.add_argument("--master", required=True)
    net.add_argument("--backend", default="gloo", choices=("gloo", "nccl"))
    ring = sub.add_parser("ring")
    quick = sub.add_parser("quick")
    for checked in (node, quick):
        checked.add_argument("--gpus", type=int, default=0)
        checked.add_argument("--dcgm", type=int, default=0, choices=(0, 1, 2))
        checked.add_argument("--efa", action="store_true")
        checked.add_argument("--infiniband", action="store_true")
    for ringed in (ring, quick):
        ringed.add_argument("addresses", nargs="+")
    for timed in (net, ring, quick):  # the network tests: this node's place, what each sends
        timed.add_argument("--rank", type=int, required=True)
        timed.add_argument("--port", type=int, required=True)
        timed.add_argument("--bytes", type=int, default=4 << 20)
        timed.add_argument("--iters", type=int, default=3)
        timed.add_argument("--timeout", type=float, default=30.0)
    reach = sub.add_parser("reach")
    reach.add_argument("addresses", nargs="+")
    reach.add_argument("--port", type=int, required=True)
    reach.add_argument("--timeout", type=float, default=2.0)
    args = parser.parse_args(argv)
    if args.probe == "node":
        out = node_probe(args.gpus, args.dcgm, args.efa, args.infiniband)
    elif args.probe == "reach":
        out = reach_probe(args.addresses, args.port, args.timeout)
    elif args.probe == "ring":
        out = ring_probe(args.rank, args.addresses, args.port, args.bytes, args.iters,
                         args.timeout)
    elif args.probe == "quick":
        # The ring first, while every node starts at about the same moment; a link that fails
        # is said in the answer (`ring_error`), beside this node's own checks.
        try:
            out = ring_probe(args.rank, args.addresses, args.port, args.bytes, args.iters,
                             args.timeout)
        except OSError as exc:
            out = {"ring_error": str(exc)[:300] or type(exc).__name__}
        out |= node_probe(args.gpus, args.dcgm, args.efa, args.infiniband)
    else:
        out = net_probe(args.rank, args.world, args.master, args.port, args.backend, args.bytes,
                        args.iters, args.timeout)
    if out:
        print(json.dumps(out), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
