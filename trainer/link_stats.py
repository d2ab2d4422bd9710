"""What a node's probe reads besides time: the loss on its own TCP connections, how long its
threads waited for a CPU, and the error counters of its network devices (Ethernet, InfiniBand,
EFA), each read from the kernel as it lays them out. Sources: docs/health.md.

Nothing here imports more than the standard library: it runs in every quick probe.
"""

from __future__ import annotations

import socket
import struct
from pathlib import Path

# struct tcp_info (linux/tcp.h): tcpi_total_retrans at byte 100, tcpi_data_segs_out at 156,
# tcpi_dsack_dups at 216 (retransmissions the receiver says it had: spurious, not loss).
TCP_INFO_BYTES = 220
TOTAL_RETRANS_AT, DATA_SEGS_OUT_AT, DSACK_DUPS_AT = 100, 156, 216

NET_ROOT = Path("/sys/class/net")
FABRIC_ROOT = Path("/sys/class/infiniband")
# Ethernet devices (`statistics/`): errors mean a bad link or NIC; drops are counted beside the
# packets to be read as a share.
ETHERNET = ("rx_errors", "tx_errors", "rx_dropped", "tx_dropped", "rx_packets", "tx_packets")
# InfiniBand ports (`ports/N/counters/`, the PMA counters): the error counters infiniband-diags
# rates (rdma-core, IBswcountlimits.pm) and the link's down transitions.
INFINIBAND = ("symbol_error", "link_error_recovery", "link_downed", "port_rcv_errors",
              "local_link_integrity_errors", "port_xmit_discards")
# EFA ports (`ports/N/hw_counters/`, the efa driver's port statistics).
EFA = ("tx_pkts", "rx_drops", "retrans_pkts", "retrans_timeout_events",
       "unresponsive_remote_events", "impaired_remote_conn_events")
MAX_DEVICES = 64


def tcp_loss(sock: socket.socket) -> tuple[int, int]:
    """(segments lost, data segments sent) on ``sock`` so far: those sent again, less those
    the receiver reported it had already (D-SACK: a retransmission a delayed acknowledgement
    set off, not a loss); (0, 0) where the kernel does not say."""
    try:
        info = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, TCP_INFO_BYTES)
    except (OSError, AttributeError):
        return 0, 0
    if len(info) < TCP_INFO_BYTES:
        return 0, 0
    retrans, sent, spurious = (struct.unpack_from("I", info, at)[0] for at in (
        TOTAL_RETRANS_AT, DATA_SEGS_OUT_AT, DSACK_DUPS_AT))
    return max(0, retrans - spurious), sent


def _schedstat(path: Path) -> tuple[int, int] | None:
    """(ns on a CPU, ns waiting on a run queue for one) from a thread's ``schedstat``; None
    where the kernel does not say (or the thread has ended)."""
    try:
        fields = path.read_text().split()
        return int(fields[0]), int(fields[1])
    except (OSError, ValueError, IndexError):
        return None


def thread_wait_ns() -> int:
    """How long the calling thread has waited on a run queue for a CPU (schedstat's second
    field), 0 where the kernel does not say: a probe that waited most of its time measured the
    machine's load, not its link."""
    return (_schedstat(Path("/proc/thread-self/schedstat")) or (0, 0))[1]


def process_run_and_wait_ns(tasks: Path = Path("/proc/self/task")) -> tuple[int, int]:
    """How long this process's threads have run on a CPU, and waited on run queues for one,
    all together (a collective's work runs in its backend's threads, not the caller's); (0, 0)
    where the kernel does not say. A thread that ended meanwhile is skipped."""
    try:
        threads = list(tasks.iterdir())
    except OSError:
        return 0, 0
    read = [stat for thread in threads if (stat := _schedstat(thread / "schedstat"))]
    return sum(ran for ran, _ in read), sum(waited for _, waited in read)


def _number(path: Path) -> int | None:
    try:
        with open(path) as value:
            text = value.read(32).strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None


def device_counters(net_root: Path = NET_ROOT, fabric_root: Path = FABRIC_ROOT
                    ) -> dict[str, int]:
    """Every counter above, by ``kind:device[:port]:counter``: Ethernet devices (not loopback),
    InfiniBand and EFA ports. Read before and after the probe; `counter_problems` judges."""
    found: dict[str, int] = {}
    devices = sorted(p for p in net_root.iterdir() if p.name != "lo")[:MAX_DEVICES] \
        if net_root.is_dir() else []
    for device in devices:
        for name in ETHERNET:
            if (value := _number(device / "statistics" / name)) is not None:
                found[f"eth:{device.name}:{name}"] = value
    fabrics = sorted(fabric_root.iterdir())[:MAX_DEVICES] if fabric_root.is_dir() else []
    for device in fabrics:
        ports = sorted((device / "ports").iterdir()) if (device / "ports").is_dir() else []
        for port in ports[:MAX_DEVICES]:
            for kind, directory, names in (("ib", "counters", INFINIBAND),
                                           ("efa", "hw_counters", EFA)):
                for name in names:
                    if (value := _number(port / directory / name)) is not None:
                        found[f"{kind}:{device.name}:{port.name}:{name}"] = value
    return found


# Judged over the probe's window (seconds). Rates and shares, with their sources in
# docs/health.md; each must hold on a healthy device under load.
IB_ERRORS_PER_S = 10.0  # infiniband-diags' "excessive rate" for these counters
LOSS_LIMIT = 0.005  # a share of packets lost or retransmitted: a link above it is broken
MIN_PACKETS = 1000  # fewer sent in the window: too few to read a share from...
MIN_LOSSES = 20  # ...unless this many were lost: a share known to about a fifth either way


def loss_share(lost: int, packets: int) -> float | None:
    """The share of ``packets`` lost, where the counts can tell it: enough packets that
    `LOSS_LIMIT` of them would be a handful, or losses enough on their own (a link that
    loses one packet in ten sends few in a time-bounded test, and loses many of those)."""
    if packets <= 0 or (packets < MIN_PACKETS and lost < MIN_LOSSES):
        return None
    return lost / packets


def too_lossy(lost: int, packets: int) -> bool:
    """Whether these counts say a link loses more than `LOSS_LIMIT`."""
    share = loss_share(lost, packets)
    return share is not None and share > LOSS_LIMIT


def counter_problems(before: dict[str, int], after: dict[str, int], seconds: float
                     ) -> list[str]:
    """What the counters say went wrong between two readings ``seconds`` apart."""
    delta = {key: after[key] - before[key] for key in after
             if key in before and after[key] >= before[key]}
    seconds = max(seconds, 1.0)
    problems = []
    for key, grew in sorted(delta.items()):
        kind, *where, name = key.split(":")
        device = ":".join(where)
        if not grew:
            continue
        if kind == "eth" and name in ("rx_errors", "tx_errors"):
            problems.append(f"{device}: {grew} {name.replace('_', ' ')} during the check")
        elif kind == "eth" and name in ("rx_dropped", "tx_dropped"):
            packets = delta.get(f"eth:{device}:{name.split('_')[0]}_packets", 0)
            if too_lossy(grew, packets):
                problems.append(f"{device}: dropped {grew} of {packets} packets "
                                f"({name.split('_')[0]}) during the check")
        elif kind == "ib" and name == "link_downed":
            problems.append(f"InfiniBand {device}: the link went down {grew} "
                            f"time{'' if grew == 1 else 's'} during the check")
        elif kind == "ib" and name in INFINIBAND and grew / seconds > IB_ERRORS_PER_S:
            problems.append(f"InfiniBand {device}: {name} at {grew / seconds:.0f}/s (over "
                            f"{IB_ERRORS_PER_S:g}/s)")
        elif kind == "efa" and name in ("unresponsive_remote_events",
                                        "impaired_remote_conn_events"):
            problems.append(f"EFA {device}: {grew} {name.replace('_', ' ')} during the check")
        elif kind == "efa" and name in ("retrans_pkts", "rx_drops"):
            packets = delta.get(f"efa:{device}:tx_pkts", 0)
            if too_lossy(grew, packets):
                problems.append(f"EFA {device}: {name} {grew} of {packets} packets sent "
                                "during the check")
    return problems


def tcp_counters(path: str = "/proc/net/snmp") -> tuple[int, int]:
    """(RetransSegs, OutSegs) of this network namespace's TCP (`/proc/net/snmp`)."""
    try:
        with open(path) as snmp:
            rows = [line.split() for line in snmp if line.startswith("Tcp:")]
        fields = dict(zip(rows[0][1:], rows[1][1:], strict=True))
        return int(fields["RetransSegs"]), int(fields["OutSegs"])
    except (OSError, IndexError, KeyError, ValueError):
        return 0, 0


def socket_losses(shown: str | None = None) -> dict[str, tuple[int, int]]:
    """Each established TCP connection of this network namespace, by ``local -> peer``
    address:port: (segments lost, data segments sent), as `ss -ti` shows them (lost: sent again
    less those the receiver already had, D-SACK). What `full`'s collective (gloo, NCCL's
    sockets) sends is read this way: its sockets are the library's, not the probe's."""
    if shown is None:
        import subprocess

        try:
            shown = subprocess.run(["ss", "-tinH", "state", "established"], capture_output=True,
                                   text=True, timeout=10).stdout
        except (OSError, subprocess.TimeoutExpired):
            return {}
    found: dict[str, tuple[int, int]] = {}
    lines = shown.splitlines()[:20_000]
    for head, info in zip(lines[::2], lines[1::2], strict=False):
        ends = head.split()[-2:]
        if len(ends) != 2 or not info[:1].isspace():
            continue
        fields = dict(item.split(":", 1) for item in info.split() if ":" in item)
        try:
            retrans = int(fields.get("retrans", "0/0").split("/")[-1])
            lost = max(0, retrans - int(fields.get("dsack_dups", "0")))
            found[f"{ends[0]} -> {ends[1]}"] = (lost, int(fields.get("data_segs_out", "0")))
        except ValueError:
            continue
    return found


def losses_by_peer(before: dict[str, tuple[int, int]], after: dict[str, tuple[int, int]]
                   ) -> dict[str, tuple[int, int]]:
    """What each peer address's connections lost and sent between two `socket_losses`."""
    peers: dict[str, tuple[int, int]] = {}
    for key, (lost, sent) in after.items():
        was_lost, was_sent = before.get(key, (0, 0))
        peer = key.rsplit(" -> ", 1)[-1].rsplit(":", 1)[0].strip("[]")
        total = peers.get(peer, (0, 0))
        peers[peer] = (total[0] + max(0, lost - was_lost), total[1] + max(0, sent - was_sent))
    return peers
