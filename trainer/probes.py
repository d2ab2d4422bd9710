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
import sys
from pathlib import Path

from .collective_probe import net_probe
from .interfaces import socket_problem
from .net_probes import reach_probe, ring_probe

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
    import shutil  # here: a CPU node's quick probe runs no tool, and starts on every node
    import subprocess

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
    import shutil
    import subprocess

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


def node_probe(gpus: int, dcgm_level: int, efa: int, infiniband: int, ib_gbps: int = 0) -> dict:
    """A node's own checks: its GPUs, kernel log and DCGM; its fabric (``efa``: the EFA devices
    the instance type has, ``infiniband``: its InfiniBand ports, each at ``ib_gbps``; 0: none
    expected)."""
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
        checks["efa"], found = efa_devices(efa)
        problems += found
    if infiniband:
        checks["infiniband"], found = infiniband_ports(infiniband, ib_gbps)
        problems += found
    return {"checks": checks, "problems": problems}


def efa_devices(expected: int) -> tuple[str, list[str]]:
    """(what `fi_info -p efa` shows, problems): each EFA device is a domain with an RDM
    endpoint ("rdmap16s27-rdm"); fewer than the type has is a node short of its fabric."""
    code, out = tool(["fi_info", "-p", "efa"])
    if code is None and os.path.exists("/opt/amazon/efa/bin/fi_info"):
        code, out = tool(["/opt/amazon/efa/bin/fi_info", "-p", "efa"])
    if code != 0:
        return "missing", ["EFA expected, `fi_info -p efa` finds none"]
    devices = len(set(re.findall(r"domain:\s*(\S+)-rdm\b", out))) or out.count("provider: efa")
    short = [f"EFA: {devices} of the {expected} devices the type has (fi_info -p efa)"] \
        if devices < expected else []
    return f"{devices} efa devices", short


def _ports(out: str, starts: tuple[str, ...]) -> list[dict[str, str]]:
    """Each port's "key: value" lines (ibv_devinfo's or ibstat's), with its device's name."""
    ports: list[dict[str, str]] = []
    device = "?"
    for line in out.splitlines():
        text = line.strip()
        if text.startswith(("hca_id:", "CA '")):
            device = text.split("'")[1] if "'" in text else text.partition(":")[2].strip()
        elif text.startswith(starts):
            ports.append({"device": device})
        elif ports and ":" in text:
            key, _, value = text.partition(":")
            ports[-1][key.strip().lower()] = value.strip()
    return ports


def infiniband_ports(expected: int, gbps: int) -> tuple[str, list[str]]:
    """(what ibv_devinfo and ibstat show, problems): the type's InfiniBand ports active (an
    Ethernet RDMA port, Azure's accelerated networking, is not one), each at its rate, and the
    NCCL topology file the image's nccl.conf names present."""
    code, out = tool(["ibv_devinfo"])
    active = sum(1 for port in _ports(out, ("port:",)) if port.get("state", "").startswith(
        "PORT_ACTIVE") and port.get("link_layer", "InfiniBand") == "InfiniBand") \
        if code == 0 else 0
    if not active:
        return "0 active ports", ["InfiniBand expected, no active port (ibv_devinfo)"]
    problems = [f"InfiniBand: {active} of the {expected} ports the type has are active"] \
        if active < expected else []
    code, out = tool(["ibstat"])
    for port in _ports(out, ("Port ",)) if gbps and code == 0 else []:
        rate = port.get("rate", "")
        if port.get("state") == "Active" and port.get("link layer", "InfiniBand") == \
                "InfiniBand" and rate.isdigit() and int(rate) < gbps:
            problems.append(f"InfiniBand: {port['device']} at {rate} Gb/s, {gbps} expected")
    topology = nccl_topology_problem()
    return f"{active} active ports", problems + ([topology] if topology else [])


def nccl_topology_problem(conf: str = "/etc/nccl.conf") -> str | None:
    """A topology file the image's nccl.conf names (Azure's HPC image: per size) that is not
    there: NCCL then maps GPUs to NICs without it, slower across nodes."""
    try:
        text = Path(conf).read_text(errors="replace")[:10000]
    except OSError:
        return None
    named = re.search(r"^\s*NCCL_TOPO_FILE\s*=\s*(\S+)", text, re.MULTILINE)
    if named and not os.path.exists(named[1]):
        return f"NCCL_TOPO_FILE {named[1][:200]} ({conf}) is missing"
    return None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m trainer.probes")
    sub = parser.add_subparsers(dest="probe", required=True)
    node = sub.add_parser("node")
    net = sub.add_parser("net")
    net.add_argument("--world", type=int, required=True)
    net.add_argument("--master", required=True)
    net.add_argument("--backend", default="gloo", choices=("gloo", "nccl"))
    net.add_argument("--addresses", nargs="*", default=None)
    ring = sub.add_parser("ring")
    quick = sub.add_parser("quick")
    for checked in (node, quick):
        checked.add_argument("--gpus", type=int, default=0)
        checked.add_argument("--dcgm", type=int, default=0, choices=(0, 1, 2))
        # the fabric's devices the type has (a bare flag: at least one)
        checked.add_argument("--efa", type=int, nargs="?", const=1, default=0)
        checked.add_argument("--infiniband", type=int, nargs="?", const=1, default=0)
        checked.add_argument("--ib-gbps", type=int, default=0)
    for ringed in (ring, quick):
        ringed.add_argument("addresses", nargs="+")
    ring.add_argument("--alone", action="store_true", help="each link on its own, in turn")
    ring.add_argument("--first", type=int, default=0, help="with --alone: the rank to start")
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
        out = node_probe(args.gpus, args.dcgm, args.efa, args.infiniband, args.ib_gbps)
    elif args.probe == "reach":
        out = reach_probe(args.addresses, args.port, args.timeout)
    elif args.probe in ("ring", "quick"):
        # The ring first, while every node starts at about the same moment; a link that fails
        # is said in the answer (`ring_error`: the controller traces whose link it is), with
        # `quick` beside this node's own checks.
        try:
            out = ring_probe(args.rank, args.addresses, args.port, args.bytes, args.iters,
                             args.timeout, alone=getattr(args, "alone", False),
                             first=getattr(args, "first", 0))
        except OSError as exc:
            out = {"ring_error": str(exc)[:300] or type(exc).__name__}
        if args.probe == "quick":
            out |= node_probe(args.gpus, args.dcgm, args.efa, args.infiniband, args.ib_gbps)
            problem = socket_problem(args.addresses[args.rank])
            out["problems"] += [problem] if problem else []
    else:
        out = net_probe(args.rank, args.world, args.master, args.port, args.backend, args.bytes,
                        args.iters, args.timeout, args.addresses)
    if out:
        print(json.dumps(out), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
