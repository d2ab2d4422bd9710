"""A local cluster's own network, as root: each node in a network namespace of its own, joined
by veth pairs to a bridge in a switch namespace the cluster makes and removes, so that one
node's link can be slowed, made lossy or cut (`tc`, `ip`) for tests and rehearsals.

Nothing of it is in the machine's own namespace: the addresses (10.77.0.0/24) exist only inside
the cluster's namespaces, with no route anywhere else and no NAT, so they can never shadow a
real network of the machine and nothing is ever sent off it. SSH (the control path) still
reaches each node's sshd on loopback; every command it runs enters the node's namespace, so the
job's traffic (the data path: rendezvous, gloo, NCCL) crosses the node's link.

    <prefix>-sw       br0, and n<i> per node (the switch side of node i's link)
    <prefix>-n<i>     eth0 (10.77.0.<i+1>/24) and lo
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
from pathlib import Path

from sortie.core.errors import SortieError, UsageError
from sortie.core.home import setting

NETWORK_ENV = "SORTIE_LOCAL_NETWORK"  # loopback (the default) or netns
# Rehearse a slow node: each node's link rate in Mbit/s at launch, in node order ("1000,100"; an
# empty entry or a missing one: not shaped). A replacement node gets a fresh, unshaped link.
LINKS_ENV = "SORTIE_LOCAL_LINK_MBIT"
SUBNET = "10.77.0"
# A registry of the cluster's own (a site's, on its cluster network): the switch's address,
# which booted nodes' image trusts over plain HTTP (`booted/image.py`); nothing listens there
# unless someone starts it (the tests' `image_lab.Registry`).
NAMESPACED_MAX_NODES = 253  # 10.77.0.1 to .253: the next is the registry's
REGISTRY_ADDRESS = f"{SUBNET}.{NAMESPACED_MAX_NODES + 1}:5000"
IFNAME = "eth0"  # a node's side of its link, inside its namespace
NETNS_DIR = Path("/run/netns")
SFTP_SERVERS = ("/usr/lib/openssh/sftp-server", "/usr/libexec/openssh/sftp-server",
                "/usr/lib/ssh/sftp-server", "/usr/libexec/sftp-server")
IP_TIMEOUT_S = 10


def network_mode() -> str:
    """What $SORTIE_LOCAL_NETWORK asks for, checked: namespaces need root and iproute2."""
    mode = setting(NETWORK_ENV, ("loopback", "netns"))
    if mode == "netns":
        if os.geteuid() != 0:
            raise UsageError(f"{NETWORK_ENV}=netns: network namespaces need root")
        for tool in ("ip", "tc", "nsenter"):
            if not shutil.which(tool):
                raise UsageError(f"{NETWORK_ENV}=netns: `{tool}` not found (apt-get install "
                                 "iproute2 util-linux)")
        if not sftp_server():
            raise UsageError(f"{NETWORK_ENV}=netns: OpenSSH's sftp-server not found")
    return mode


def link_rates(nodes: int) -> list[float | None]:
    """$SORTIE_LOCAL_LINK_MBIT for ``nodes`` nodes, checked."""
    given = os.environ.get(LINKS_ENV, "")
    rates: list[float | None] = []
    for entry in given.split(",") if given else []:
        try:
            rates.append(float(entry) if entry.strip() else None)
        except ValueError:
            raise UsageError(f"{LINKS_ENV}: {entry!r} is not a rate in Mbit/s (e.g. 1000,100)"
                             ) from None
        if rates[-1] is not None and not 0 < rates[-1] <= 100_000:
            raise UsageError(f"{LINKS_ENV}: {entry!r} is not a rate between 0 and 100000 Mbit/s")
    if rates and os.environ.get(NETWORK_ENV) != "netns":
        raise UsageError(f"{LINKS_ENV}: shaping links needs {NETWORK_ENV}=netns")
    return (rates + [None] * nodes)[:nodes]


def check_local_network() -> None:
    """$SORTIE_LOCAL_NETWORK and $SORTIE_LOCAL_LINK_MBIT, checked before a local launch."""
    network_mode()
    link_rates(0)


def sftp_server() -> str | None:
    return next((path for path in SFTP_SERVERS if os.access(path, os.X_OK)), None)


def _run(tool: str, *args: str, check: bool = True) -> None:
    """iproute2's ``tool`` (ip, tc); a failure it reports is an error naming the command."""
    done = subprocess.run([tool, *args], capture_output=True, text=True, timeout=IP_TIMEOUT_S)
    if check and done.returncode:
        raise SortieError(f"{tool} {' '.join(args)}: {done.stderr.strip()[:200]}")


def _ip(*args: str, check: bool = True) -> None:
    _run("ip", *args, check=check)


def _tc(namespace: str, *args: str, check: bool = True) -> None:
    _run("tc", "-n", namespace, *args, check=check)


class NodeNetwork:
    """The namespaces of one local cluster, named from its state directory (so `down` finds
    them from the state alone, and two clusters never share a name)."""

    def __init__(self, state: Path) -> None:
        digest = hashlib.sha256(str(state.resolve()).encode()).hexdigest()[:10]
        self.prefix = f"sortie-{digest}"
        self.switch = f"{self.prefix}-sw"

    def namespace(self, index: int) -> str:
        return f"{self.prefix}-n{index}"

    @staticmethod
    def address(index: int) -> str:
        if not 0 <= index < NAMESPACED_MAX_NODES:  # refused before a launch (`launch_target`)
            raise ValueError(f"node {index}: a cluster's network has {NAMESPACED_MAX_NODES}")
        return f"{SUBNET}.{index + 1}"

    def exists(self) -> bool:
        return (NETNS_DIR / self.switch).exists()

    def create(self) -> None:
        _ip("netns", "add", self.switch)
        _ip("-n", self.switch, "link", "add", "br0", "type", "bridge")
        _ip("-n", self.switch, "link", "set", "br0", "up")

    def add_node(self, index: int, ifname: str = IFNAME) -> str:
        """Node ``index``'s namespace and link, fresh (a replaced node gets a healthy link),
        named ``ifname`` inside (a Slurm lab names them per node, as sites do); returns its
        address."""
        self.remove_node(index)
        node, port = self.namespace(index), f"n{index}"
        _ip("netns", "add", node)
        _ip("-n", self.switch, "link", "add", port, "type", "veth", "peer", "name", ifname,
            "netns", node)
        _ip("-n", self.switch, "link", "set", port, "master", "br0", "up")
        _ip("-n", node, "addr", "add", f"{self.address(index)}/24", "dev", ifname)
        _ip("-n", node, "link", "set", ifname, "up")
        _ip("-n", node, "link", "set", "lo", "up")
        # A replacement has the old node's address and a new MAC: the other nodes forget the
        # old one (as a cloud's network would), else they send to it until their ARP entry
        # ages out (~30 s) and a node that waits to be spoken to first is never reached.
        for other in self.namespaces():
            if other not in (self.switch, node):
                _ip("-n", other, "neigh", "flush", "to", self.address(index), check=False)
        return self.address(index)

    def add_metadata_address(self, index: int, address: str = "169.254.169.254") -> None:
        """The clouds' link-local metadata address on node ``index``'s loopback: stand-ins for
        the cloud's services listen there, inside the node's namespace only."""
        _ip("-n", self.namespace(index), "addr", "add", f"{address}/32", "dev", "lo")

    def remove_node(self, index: int) -> None:
        """Its link first (a namespace outlives its name while a process is still in it, and
        its devices go only once it is gone), then the namespace's name."""
        if self.exists():
            _ip("-n", self.switch, "link", "del", f"n{index}", check=False)
        if (NETNS_DIR / self.namespace(index)).exists():
            _ip("netns", "del", self.namespace(index), check=False)

    def enter_script(self, index: int) -> str:
        """sshd's ForceCommand for node ``index``: whatever the client asked for (a command,
        sftp, or a login shell) runs inside the node's namespace."""
        return ("#!/bin/sh\n"
                f"exec nsenter --net={NETNS_DIR / self.namespace(index)} -- "
                '"$SHELL" -c "${SSH_ORIGINAL_COMMAND:-exec $SHELL -l}"\n')

    def namespaces(self) -> list[str]:
        """This cluster's namespaces that exist now."""
        if not NETNS_DIR.is_dir():
            return []
        return sorted(p.name for p in NETNS_DIR.iterdir()
                      if p.name.startswith(f"{self.prefix}-"))

    def pids(self, index: int | None = None) -> set[int]:
        """The processes inside node ``index``'s namespace (every node's: None): the kernel's
        own record of what runs on a node, whatever it changed about itself."""
        wanted = [self.namespace(index)] if index is not None else \
            [n for n in self.namespaces() if n != self.switch]
        inodes = set()
        for name in wanted:
            try:
                inodes.add(os.stat(NETNS_DIR / name).st_ino)
            except OSError:
                continue
        found: set[int] = set()
        if not inodes:
            return found
        for entry in Path("/proc").iterdir():
            if entry.name.isdigit():
                try:
                    if os.stat(entry / "ns" / "net").st_ino in inodes:
                        found.add(int(entry.name))
                except OSError:
                    continue
        return found

    def destroy(self) -> list[str]:
        """Remove every namespace of the cluster (their links and bridge go with them); returns
        those still there."""
        for name in self.namespaces():
            _ip("netns", "del", name, check=False)
        return self.namespaces()

    # -- rehearsals: a slow, lossy or cut link ------------------------------------------------

    def shape(self, index: int, rate_mbit: float | None = None, delay_ms: float = 0.0,
              loss_pct: float = 0.0) -> None:
        """Slow node ``index``'s link both ways, or clear it (no arguments): a rate (tbf), or a
        delay and loss (netem, where the kernel has it)."""
        for namespace, device in ((self.switch, f"n{index}"), (self.namespace(index), IFNAME)):
            _tc(namespace, "qdisc", "del", "dev", device, "root", check=False)
            if delay_ms or loss_pct:
                _tc(namespace, "qdisc", "add", "dev", device, "root", "netem",
                    *(["delay", f"{delay_ms}ms"] if delay_ms else []),
                    *(["loss", f"{loss_pct}%"] if loss_pct else []),
                    *(["rate", f"{rate_mbit}mbit"] if rate_mbit else []))
            elif rate_mbit:
                # A burst of at least one timer tick's worth of bytes, or tbf caps below rate.
                burst = max(64 << 10, int(rate_mbit * 125_000 / 100))
                _tc(namespace, "qdisc", "add", "dev", device, "root", "tbf", "rate",
                    f"{rate_mbit}mbit", "burst", str(burst), "latency", "100ms")

    def lose(self, index: int, share: float, sending: bool = True,
             receiving: bool = True) -> None:
        """Drop a random ``share`` of what node ``index`` receives (its own INPUT) and of what
        it sends, as a lossy wire would: dropped as it arrives at the others (their INPUT,
        from its address). A drop in its own OUTPUT is no loss: the kernel refuses the send, and
        TCP neither loses the segment nor sends it again (measured: `containers-and-loss.md`).
        iptables' `statistic` match; `apt-get install iptables`."""
        iptables = shutil.which("iptables-legacy") or shutil.which("iptables")
        if iptables is None:
            raise SortieError("a lossy link needs iptables (apt-get install iptables)")
        drop = ["-m", "statistic", "--mode", "random", "--probability", f"{share:.6f}", "-j",
                "DROP"]
        # A wire loses packets of one MTU; between namespaces a sender hands its veth 64 KB
        # segmentation-offload packets, and iptables would drop ~44 segments at a time. So the
        # nodes send packets of one segment each here, as on a wire.
        for name in self.namespaces():
            if name != self.switch:
                _ip("-n", name, "link", "set", "dev", IFNAME, "gso_max_segs", "1")
        rules = [(self.namespace(index), ["-i", IFNAME])] if receiving else []
        rules += [(name, ["-i", IFNAME, "-s", self.address(index)]) for name in
                  self.namespaces() if sending and name not in (self.switch,
                                                                self.namespace(index))]
        for namespace, match in rules:
            _run("ip", "netns", "exec", namespace, iptables, "-w", "-A", "INPUT", *match, *drop)

    def cut(self, index: int, up: bool = False) -> None:
        """Cut node ``index``'s link (or restore it): its packets go nowhere, as a dead NIC's."""
        _ip("-n", self.switch, "link", "set", f"n{index}", "up" if up else "down")
