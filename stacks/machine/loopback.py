"""Machines on loopback for the local backend: addresses, ports, host keys, and the sshd daemons
that stand for nodes, with the processes they leave behind."""

from __future__ import annotations

import contextlib
import ipaddress
import os
import random
import shutil
import socket
import subprocess
import time
from pathlib import Path

import psutil

from sortie.core import statefile
from sortie.core.errors import SortieError, UsageError
from sortie.infra.keys import ed25519_key_pair
from sortie.stacks.machine.node_cgroup import joining

SSHD_CANDIDATES = ("/usr/sbin/sshd", "/usr/bin/sshd")
STARTUP_TIMEOUT_S = 10.0
LOCAL_MAX_NODES = 254  # 127.0.1.1 to 127.0.1.254
RDZV_PORT_FLOOR = 20000  # rendezvous ports are drawn from here up to the ephemeral range


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
    """A port for torchrun's rendezvous store. The store listens on every address, not only the
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


def port_for_launch(head: str, port: int) -> int:
    """A cluster's rendezvous ``port`` on ``head``, or another where a program on this machine
    listens there now, where the head's store would bind (seen in CI: taken during an image's
    pull; the job's torchrun failed to start). Nodes on a network of their own (`netns`,
    booted) share ports with no one."""
    try:
        loopback = ipaddress.ip_address(head).is_loopback
    except ValueError:
        return port
    return rendezvous_port() if loopback and is_listening(head, port) else port


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


def is_listening(address: str, port: int) -> bool:
    with socket.socket() as sock:
        sock.settimeout(0.5)
        return sock.connect_ex((address, port)) == 0


def alive_now(proc: psutil.Process) -> bool:
    try:
        return proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def wait_gone(procs: list[psutil.Process], timeout: float) -> list[psutil.Process]:
    """Wait until the processes are gone (zombies count as gone); return those still alive.

    psutil.wait_procs would wait out the full timeout on a zombie whose parent never reaps it
    (PID 1 in many containers), so poll liveness instead and reap our own children."""
    deadline = time.monotonic() + timeout
    alive = list(procs)
    while alive and time.monotonic() < deadline:
        alive = [p for p in alive if alive_now(p)]
        if alive:
            time.sleep(0.05)
    for proc in procs:
        if proc not in alive:
            with contextlib.suppress(ChildProcessError):  # reaps only our own children
                os.waitpid(proc.pid, os.WNOHANG)
    return alive


def signal_all(procs: list[psutil.Process], stop: str) -> None:
    for proc in procs:
        with contextlib.suppress(psutil.NoSuchProcess):
            getattr(proc, stop)()


def start_sshd(sshd: str, node_dir: Path, address: str, state: Path, user: str, tag: str = "",
               enter: str | None = None, sftp: str = "internal-sftp",
               cgroup: Path | None = None) -> int:
    """Start one node's sshd in the foreground of its own session; return its port. Every
    session gets ``tag`` as $SORTIE_LOCAL_NODE (what the node's processes are known by). With
    ``enter`` (a script's text) every session runs through it: the node's own network. ``cgroup``:
    the `cgroup.procs` sshd joins before it starts (the node's, `machine/node_cgroup.py`)."""
    force = ""
    if enter is not None:
        (node_dir / "enter").write_text(enter)
        (node_dir / "enter").chmod(0o755)
        force = f'ForceCommand "{node_dir / "enter"}"\n'

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
            f"SetEnv SHLVL=1{f' SORTIE_LOCAL_NODE={tag}' if tag else ''}\n"
            "MaxStartups 64:30:128\n"
            f"Subsystem sftp {sftp}\n"
            + force
        )
        log = node_dir / "sshd.log"
        proc = subprocess.Popen(
            joining([cgroup] if cgroup else [], [sshd, "-D", "-f", str(config), "-E", str(log)]),
            start_new_session=True, stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )
        (node_dir / "sshd.pid").write_text(f"{proc.pid}\n")
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        while time.monotonic() < deadline:
            if is_listening(address, port):
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

