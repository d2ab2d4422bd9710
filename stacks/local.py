"""The local backend: a cluster of real OpenSSH daemons on loopback addresses.

Each node is an ``sshd`` run as the invoking user on its own address (127.0.1.1, 127.0.1.2, ...)
with its own host key, and a work directory that stands for its disk. Everything after
provisioning (Fabric over SSH, torchrun, collection, teardown) is the same code path as a cloud.

State lives in ``$SORTIE_HOME/clusters/<cluster-id>/`` (default ``~/.sortie``)::

    client_key, client_key.pub      the controller's key for this cluster (0600)
    authorized_keys, known_hosts    what sshd accepts / the pinned host keys
    inventory.json                  the Inventory bootstrap consumes
    nodes/node-<i>/                 sshd_config, host key, sshd.log, disk/ (the node's workdir)
    bucket/                         the cluster's "bucket": checkpoints every node reaches, as a
                                    cloud cluster's nodes reach its storage bucket

A lost node (its sshd gone: killed, or `reclaim`ed the way a cloud reclaims a spot machine) is
replaced by a new one on the same address, with a new host key and an empty disk.
"""

from __future__ import annotations

import contextlib
import getpass
import json
import os
import random
import shutil
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil

from bootstrap import statefile
from bootstrap.errors import SortieError, UsageError
from bootstrap.inventory import INVENTORY_FILE, Inventory, Node
from infra.keys import ed25519_key_pair
from stacks import naming
from stacks.backend import LaunchError, Leftover, Placement, Teardown
from stacks.records import Controller, Job

SSHD_CANDIDATES = ("/usr/sbin/sshd", "/usr/bin/sshd")
CONTROLLER_FILE = "controller.json"  # the process a cluster belongs to (absent: held)
JOB_FILE = "job.json"  # what was launched on it, for a controller that takes over
STARTUP_TIMEOUT_S = 10.0
STOP_GRACE_S = 3.0
# Rehearse a launch that runs out of capacity half-way: the local "cloud" then has room for this
# many nodes only, and the node after them fails to start after the first ones did.
CAPACITY_ENV = "SORTIE_LOCAL_CAPACITY"
HOME_ENV = "SORTIE_HOME"
LOCAL_MAX_NODES = 254  # 127.0.1.1 to 127.0.1.254
RDZV_PORT_FLOOR = 20000  # rendezvous ports are drawn from here up to the ephemeral range


def sortie_home() -> Path:
    """Where this controller keeps its state: $SORTIE_HOME (default ~/.sortie), made absolute
    once (a relative one would name another directory from every other directory), and a
    directory or not yet there; a UsageError naming SORTIE_HOME otherwise."""
    given = os.environ.get(HOME_ENV)
    if given is None:
        return Path.home() / ".sortie"
    if not given.strip() or not given.isprintable():
        raise UsageError(f"{HOME_ENV}: {given!r} is not a directory name; unset it for "
                         "~/.sortie")
    home = Path(os.path.abspath(Path(given).expanduser()))
    existing = statefile.first_existing(home)
    if not existing.is_dir():
        raise UsageError(f"{HOME_ENV}: {existing} is not a directory"
                         + (f" (so {home} cannot be one)" if existing != home else ""))
    return home


def find_sshd() -> str:
    for candidate in (*SSHD_CANDIDATES, shutil.which("sshd")):
        if candidate and os.access(candidate, os.X_OK):
            return candidate  # sshd must be started by absolute path (it re-executes itself)
    raise SortieError("sshd not found: install OpenSSH's server (apt-get install openssh-server)")


def free_port(address: str) -> int:
    with socket.socket() as sock:
        sock.bind((address, 0))
        return sock.getsockname()[1]


def rendezvous_port() -> int:
    """A port for torchrun's c10d store. The store listens on every address, not only the
    head's, and a held cluster keeps its port between jobs without holding it open; so the
    port must be free on all addresses and outside the kernel's ephemeral range, from which
    every sshd port, outgoing connection and worker port of another sortie on this machine is
    drawn (a collision there left a node waiting 60 s for a store that never came)."""
    low = ephemeral_port_range()[0]
    for _attempt in range(50):
        port = random.randrange(RDZV_PORT_FLOOR, low) if low > RDZV_PORT_FLOOR + 1000 else 0
        try:
            return free_port_everywhere(port)
        except OSError:
            continue
    return free_port_everywhere(0)


def free_port_everywhere(port: int) -> int:
    with socket.socket() as sock:
        sock.bind(("", port))
        return sock.getsockname()[1]


def ephemeral_port_range() -> tuple[int, int]:
    try:
        low, high = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
        return int(low), int(high)
    except (OSError, ValueError):
        return 32768, 60999  # Linux's default


def node_addresses(count: int) -> list[str]:
    """127.0.1.1, 127.0.1.2, ... where the kernel lets us bind them, else 127.0.0.1 for all."""
    wanted = [f"127.0.1.{i + 1}" for i in range(count)]
    if count > LOCAL_MAX_NODES:
        raise UsageError(f"nodes: {count}: a local cluster has at most {LOCAL_MAX_NODES} (one "
                         "loopback address each)")
    try:
        for address in wanted:
            free_port(address)
    except OSError:
        return ["127.0.0.1"] * count  # distinct ports keep the nodes apart
    return wanted


def keygen(path: Path, comment: str) -> str:
    """An ed25519 key pair at ``path`` (private, 0600) and ``path.pub``; returns the public key."""
    pair = ed25519_key_pair()
    statefile.write_text(path, pair.private_openssh)
    statefile.write_text(path.with_name(path.name + ".pub"), f"{pair.public_openssh} {comment}\n",
                         mode=0o644)
    return pair.public_openssh


def _is_listening(address: str, port: int) -> bool:
    with socket.socket() as sock:
        sock.settimeout(0.5)
        return sock.connect_ex((address, port)) == 0


def _alive(proc: psutil.Process) -> bool:
    try:
        return proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _wait_gone(procs: list[psutil.Process], timeout: float) -> list[psutil.Process]:
    """Wait until the processes are gone (zombies count as gone); return those still alive.

    psutil.wait_procs would wait out the full timeout on a zombie whose parent never reaps it
    (PID 1 in many containers), so poll liveness instead and reap our own children."""
    deadline = time.monotonic() + timeout
    alive = list(procs)
    while alive and time.monotonic() < deadline:
        alive = [p for p in alive if _alive(p)]
        if alive:
            time.sleep(0.05)
    for proc in procs:
        if proc not in alive:
            with contextlib.suppress(ChildProcessError):  # reaps only our own children
                os.waitpid(proc.pid, os.WNOHANG)
    return alive


def _signal_all(procs: list[psutil.Process], stop: str) -> None:
    for proc in procs:
        with contextlib.suppress(psutil.NoSuchProcess):
            getattr(proc, stop)()


def _capacity() -> int:
    """How many nodes this "cloud" has room for ($SORTIE_LOCAL_CAPACITY, a rehearsal)."""
    given = os.environ.get(CAPACITY_ENV, str(LOCAL_MAX_NODES))
    if not (given.isascii() and given.isdigit()) or int(given) > LOCAL_MAX_NODES:
        raise UsageError(f"{CAPACITY_ENV}: {given!r} is not a number of nodes, 0 to "
                         f"{LOCAL_MAX_NODES}")
    return int(given)


class LocalBackend:
    """Starts, repairs, lists and tears down local clusters under ``home/clusters``."""

    name = "local"
    preemption_notice_s = 0.0

    def __init__(self, home: Path | None = None) -> None:
        self.home = home or sortie_home()
        self.clusters_dir = self.home / naming.CLUSTERS
        # A heartbeat must never write into a cluster that teardown is removing.
        self._writing, self._closing = threading.Lock(), set[str]()
        self._reserved = set[str]()  # names this process took (`reserve`) and has not used
        self.capacity = _capacity()

    def state_dir(self, cluster_id: str) -> Path:
        return naming.state_dir(self.clusters_dir, cluster_id)

    def cluster_ids(self) -> list[str]:
        return naming.names_in(self.clusters_dir)

    def inventory(self, cluster_id: str) -> Inventory:
        path = self.state_dir(cluster_id) / INVENTORY_FILE
        if not path.is_file():
            raise SortieError(f"no local cluster named {cluster_id!r} (see `sortie status`)")
        return Inventory.load(path)

    # -- up -------------------------------------------------------------------------------------

    def placements(self) -> list[Placement]:
        return [Placement()]  # one machine: no zones, no spot market

    def reserve(self, cluster_id: str, held: bool = False) -> None:
        """The name is this process's once its state directory is in place (`naming.take`).
        Unless ``held``, it appears with this process as its controller: killed from then on,
        the cluster is an orphan `sortie reap` ends (without a controller it would read as
        held)."""
        controller = {} if held else {
            CONTROLLER_FILE: json.dumps(Controller.me().model_dump(), indent=2) + "\n"}
        naming.take(self.clusters_dir, cluster_id, controller)
        with self._writing:
            self._closing.discard(cluster_id)
            self._reserved.add(cluster_id)

    def up(self, cluster_id: str, nodes: int, placement: Placement | None = None,
           held: bool = False) -> Inventory:
        """Start ``nodes`` sshd daemons, all or none: on failure, tear down what was started.
        The name is reserved first unless this process already did (NameTakenError, with
        nothing touched, when another sortie has it).

        Unless ``held`` (`sortie up`), the cluster belongs to this process: once it is gone,
        `sortie reap` tears the cluster down (the local stand-in for a cloud node's TTL)."""
        state = self.state_dir(cluster_id)
        sshd = find_sshd()  # (a launch that reserved the name first tears its state down)
        if cluster_id not in self._reserved:
            self.reserve(cluster_id, held)
        self._reserved.discard(cluster_id)
        try:
            return self._start(cluster_id, state, nodes, sshd)
        except SortieError as exc:
            self.down(cluster_id)
            raise LaunchError(str(exc)) from None
        except BaseException:
            self.down(cluster_id)
            raise

    def _start(self, cluster_id: str, state: Path, count: int, sshd: str) -> Inventory:
        user = getpass.getuser()
        client_key = state / "client_key"
        (state / "authorized_keys").write_text(keygen(client_key, f"sortie-{cluster_id}") + "\n")
        (state / "bucket").mkdir()
        if os.geteuid() == 0:
            # sshd started by root insists on its privilege-separation directory.
            Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)
        capacity = self.capacity
        members: list[Node] = []
        for index, address in enumerate(node_addresses(count)):
            if index >= capacity:
                raise SortieError(f"node-{index}: no capacity left ({CAPACITY_ENV}={capacity})")
            members.append(self._start_node(cluster_id, state, index, address, sshd, user))
        inventory = Inventory(
            cluster_id=cluster_id, backend=self.name, nodes=members,
            rdzv_port=rendezvous_port(),
            # All nodes share the loopback interface; GPUs stay hidden so that several local
            # "nodes" never contend for one device (the local backend trains on CPU with gloo).
            train_env={"GLOO_SOCKET_IFNAME": "lo", "CUDA_VISIBLE_DEVICES": "",
                       "SORTIE_CHECKPOINT_URL": str(state / "bucket" / "checkpoints")},
        )
        inventory.save_state(state)
        return inventory

    def _start_node(self, cluster_id: str, state: Path, index: int, address: str, sshd: str,
                    user: str) -> Node:
        """A new machine: fresh disk, fresh host key, its own sshd."""
        node_dir = state / "nodes" / f"node-{index}"
        (node_dir / "disk").mkdir(parents=True)
        host_key = keygen(node_dir / "ssh_host_ed25519_key", f"{cluster_id}-node-{index}")
        port = self._start_sshd(sshd, node_dir, address, state, user)
        return Node(name=f"node-{index}", address=address, port=port, user=user,
                    key_path=state / "client_key", host_key=host_key, gpus=0,
                    private_address=address, workdir=str(node_dir / "disk"),
                    python=sys.executable)

    def _start_sshd(self, sshd: str, node_dir: Path, address: str, state: Path, user: str) -> int:
        """Start one node's sshd in the foreground of its own session; return its port."""
        for _attempt in range(3):  # the free port we picked may be taken before sshd binds it
            port = free_port(address)
            config = node_dir / "sshd_config"
            config.write_text(
                f"ListenAddress {address}:{port}\n"
                # Quoted: $SORTIE_HOME may have a space in it.
                f'HostKey "{node_dir / "ssh_host_ed25519_key"}"\n'
                f'PidFile "{node_dir / "sshd.pid"}"\n'
                f'AuthorizedKeysFile "{state / "authorized_keys"}"\n'
                f"AllowUsers {user}\n"
                "PasswordAuthentication no\n"
                "KbdInteractiveAuthentication no\n"
                "PubkeyAuthentication yes\n"
                "PermitRootLogin prohibit-password\n"
                "UsePAM no\n"
                # The keys sit in a 0700 state dir; StrictModes would also reject parents such as
                # a sticky /tmp that tests and CI use.
                "StrictModes no\n"
                "X11Forwarding no\n"
                # Local nodes share the controller's user and home, so its ~/.bashrc (pyenv init,
                # say: ~100 processes) would run before every remote command. Bash sources it for
                # ssh sessions only when SHLVL is unset; a lean cloud image has no such cost.
                "SetEnv SHLVL=1\n"
                "MaxStartups 64:30:128\n"
                "Subsystem sftp internal-sftp\n"
            )
            log = node_dir / "sshd.log"
            proc = subprocess.Popen(
                [sshd, "-D", "-f", str(config), "-E", str(log)],
                start_new_session=True, stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            )
            (node_dir / "sshd.pid").write_text(f"{proc.pid}\n")
            deadline = time.monotonic() + STARTUP_TIMEOUT_S
            while time.monotonic() < deadline:
                if _is_listening(address, port):
                    return port
                if proc.poll() is not None:
                    break
                time.sleep(0.02)
            else:
                proc.kill()
                raise SortieError(f"sshd on {address}:{port} did not start within "
                                  f"{STARTUP_TIMEOUT_S:.0f}s (see {log})")
            reason = log.read_text().strip().splitlines()[-1:] if log.exists() else []
            if not any("Address already in use" in line for line in reason):
                raise SortieError(f"sshd on {address}:{port} exited: "
                                  f"{reason[0] if reason else 'no log'} (see {log})")
        raise SortieError(f"could not find a free port for sshd on {address}")

    def claim(self, cluster_id: str) -> None:
        """Record this process as the cluster's controller, with a fresh heartbeat (called at
        launch, then every HEARTBEAT_S, and by `sortie watch` taking over)."""
        state = self.state_dir(cluster_id)
        with self._writing:
            if cluster_id not in self._closing and state.is_dir():
                statefile.write_json(state / CONTROLLER_FILE, Controller.me().model_dump())

    def controller(self, cluster_id: str) -> Controller | None:
        """The controller the cluster belongs to; None for a held cluster (`sortie up`)."""
        path = self.state_dir(cluster_id) / CONTROLLER_FILE
        return statefile.read_model(Controller, path) if path.is_file() else None

    def save_job(self, cluster_id: str, job: Job) -> None:
        statefile.write_json(self.state_dir(cluster_id) / JOB_FILE, job.model_dump())

    def load_job(self, cluster_id: str) -> Job | None:
        path = self.state_dir(cluster_id) / JOB_FILE
        return statefile.read_model(Job, path) if path.is_file() else None

    # -- lost nodes -----------------------------------------------------------------------------

    def lost_nodes(self, inventory: Inventory) -> list[str]:
        """Nodes whose sshd is gone: the local equivalent of a machine that no longer exists."""
        return [n.name for n in inventory.nodes if not _is_listening(n.address, n.port)]

    def reclaim(self, cluster_id: str, node: str) -> list[int]:
        """Take a node away at once, as a cloud reclaims a spot machine: SIGKILL its sshd and
        everything running on it. Returns the pids killed."""
        procs = self.processes(cluster_id, node)
        _signal_all(procs, "kill")
        _wait_gone(procs, STOP_GRACE_S)
        return [p.pid for p in procs]

    def replace(self, inventory: Inventory, lost: list[str]) -> Inventory:
        """New machines for the lost nodes: same name and address, new host key, empty disk."""
        state = self.state_dir(inventory.cluster_id)
        sshd, user = find_sshd(), getpass.getuser()
        nodes = list(inventory.nodes)
        for position, node in enumerate(nodes):
            if node.name not in lost:
                continue
            self.reclaim(inventory.cluster_id, node.name)  # whatever is left of the old one
            shutil.rmtree(state / "nodes" / node.name)
            index = int(node.name.removeprefix("node-"))
            nodes[position] = self._start_node(inventory.cluster_id, state, index, node.address,
                                               sshd, user)
        repaired = inventory.model_copy(update={"nodes": nodes})
        if repaired.head.name in lost:  # the rendezvous store moves with the new head
            repaired = repaired.model_copy(
                update={"rdzv_port": rendezvous_port()})
        repaired.save_state(state)
        return repaired

    # -- down -----------------------------------------------------------------------------------

    def processes(self, cluster_id: str, node: str | None = None) -> list[psutil.Process]:
        """Every live process of the cluster (or of one node): its sshd daemons and everything
        they spawned, plus anything running from or naming its directory (detached trainers)."""
        state = self.state_dir(cluster_id)
        scope = state / "nodes" / node if node else state
        marker = f"{scope}/"  # the slash keeps cluster "c1" from matching "c10"
        found: dict[int, psutil.Process] = {}
        for pid_file in scope.glob("**/sshd.pid"):
            try:
                daemon = psutil.Process(int(pid_file.read_text()))
                if marker in " ".join(daemon.cmdline()):  # never a recycled pid
                    for proc in (daemon, *daemon.children(recursive=True)):
                        found[proc.pid] = proc
            except (ValueError, psutil.Error):
                continue
        for proc in psutil.process_iter(["cmdline", "cwd"]):
            cmdline = " ".join(proc.info["cmdline"] or [])
            cwd = f"{proc.info['cwd'] or ''}/"
            if proc.pid != os.getpid() and (marker in cmdline or cwd.startswith(marker)):
                found[proc.pid] = proc
        return [p for p in found.values() if _alive(p)]

    def listeners(self, cluster_id: str) -> list[str]:
        """Node addresses of this cluster that still accept connections."""
        try:
            inventory = self.inventory(cluster_id)
        except SortieError:
            return []
        return [f"{n.address}:{n.port}" for n in inventory.nodes
                if _is_listening(n.address, n.port)]

    def down(self, cluster_id: str, keep_bucket: bool = False) -> Teardown:
        """Stop every process of the cluster, prove none is left, remove its state. Idempotent.

        With ``keep_bucket`` the cluster's bucket moves to ``home/kept/<cluster>`` first."""
        report = Teardown(cluster_id, unit="processes")
        state = self.state_dir(cluster_id)
        with self._writing:
            self._closing.add(cluster_id)
        if not state.exists():
            report.state_removed = True
            return report
        stopped: set[int] = set()
        for _round in range(3):  # a dying trainer may still spawn; sweep until nothing is found
            procs = self.processes(cluster_id)
            if not procs:
                break
            _signal_all(procs, "terminate")
            alive = _wait_gone(procs, STOP_GRACE_S)
            _signal_all(alive, "kill")
            _wait_gone(alive, STOP_GRACE_S)
            stopped.update(p.pid for p in procs)
        report.removed = len(stopped)
        report.leftovers = [Leftover("process", str(p.pid), f"kill -9 {p.pid}")
                            for p in self.processes(cluster_id)]
        report.leftovers += [Leftover("listener", address, f"stop what listens on {address}")
                             for address in self.listeners(cluster_id)]
        if keep_bucket and (state / "bucket").is_dir():
            kept = self.home / naming.KEPT / cluster_id
            kept.parent.mkdir(parents=True, exist_ok=True)
            shutil.move(str(state / "bucket"), str(kept))
            report.kept.append(str(kept))
        if not report.leftovers:
            shutil.rmtree(state)  # keep the state (keys, pids) while anything is left to stop
            report.state_removed = True
        return report
