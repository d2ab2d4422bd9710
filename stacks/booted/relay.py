"""The controller's way into a booted node: a TCP relay from a loopback address of this machine
to the node's sshd, whose address exists only inside the cluster's network namespaces.

A cloud node has an address the controller dials; a booted local node has none outside its
namespace (`machine/node_network.py`: no route off it, nothing added to the machine's own
network). So
each booted node gets one small relay process: its listening socket is made here, on the node's
loopback address, then the process enters the node's namespace, where every connection it opens
to the node's sshd is made. The inventory names the loopback end: everything after "provision"
(Fabric, rsync, OpenSSH) dials an address and a port, as on a cloud.

The relay ends by itself once the node's container has (a powered-off node answers no one, and
`lost_nodes` sees it gone), and is one of the node's processes (its tag, its namespace) for
`reclaim` and `down`.

    python -m sortie.stacks.booted.relay --fd N --netns PATH --to ADDRESS:PORT --while PID
        [--from EPOCH]
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil

from sortie.stacks.machine.held_limits import tagged_env

CLONE_NEWNET = 0x40000000  # <sched.h>: setns's namespace type (os.setns is Python 3.12+)
CONNECT_TIMEOUT_S = 10.0
POLL_S = 0.5  # how often the relay looks whether its node still runs
CHUNK = 1 << 16


def enter_network_namespace(path: Path) -> None:
    """Move this process (its only thread) into the network namespace at ``path``: sockets it
    makes from now on live there; those it made before stay where they were."""
    libc = ctypes.CDLL(None, use_errno=True)
    fd = os.open(path, os.O_RDONLY)
    try:
        if libc.setns(fd, CLONE_NEWNET) != 0:
            error = ctypes.get_errno()
            raise OSError(error, f"setns {path}: {os.strerror(error)}")
    finally:
        os.close(fd)


def _copy(source: socket.socket, sink: socket.socket) -> None:
    """One direction of a connection, until its end; then the other side hears the end too."""
    with contextlib.suppress(OSError):
        while data := source.recv(CHUNK):
            sink.sendall(data)
    with contextlib.suppress(OSError):
        sink.shutdown(socket.SHUT_WR)


def _relay(client: socket.socket, target: tuple[str, int]) -> None:
    """One connection: the node's sshd not answering yet (it is booting) closes the client's,
    which the controller retries as it does a booting cloud node."""
    with client:
        try:
            upstream = socket.create_connection(target, CONNECT_TIMEOUT_S)
        except OSError:
            return
        with upstream:
            upstream.settimeout(None)
            back = threading.Thread(target=_copy, args=(upstream, client), daemon=True)
            back.start()
            _copy(client, upstream)
            back.join()


def serve(listener: socket.socket, target: tuple[str, int], node_pid: int,
          attached_at: float = 0.0) -> None:
    """Relay every connection to ``target`` while process ``node_pid`` (the node's container)
    runs; before ``attached_at`` (epoch seconds: the node's address attaches late, rehearsed)
    none is answered."""
    try:
        node = psutil.Process(node_pid)
    except psutil.Error:
        return
    listener.settimeout(POLL_S)
    while node.is_running() and node.status() != psutil.STATUS_ZOMBIE:
        try:
            client, _ = listener.accept()
        except TimeoutError:
            continue
        client.settimeout(None)
        if time.time() < attached_at:
            client.close()
            continue
        threading.Thread(target=_relay, args=(client, target), daemon=True).start()


def start_relay(address: str, netns: Path, target: tuple[str, int], node_pid: int,
                tag: str, attached_at: float = 0.0) -> int:
    """Start a node's relay, detached: it listens on ``address`` (a free port, chosen here, so
    it is known before the relay runs) and relays into ``netns`` while ``node_pid`` runs.
    Returns the port."""
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        listener.bind((address, 0))
        listener.listen(64)
        port = listener.getsockname()[1]
        fd = listener.fileno()
        subprocess.Popen(
            [sys.executable, "-m", "sortie.stacks.booted.relay", "--fd", str(fd),
             "--netns", str(netns), "--to", f"{target[0]}:{target[1]}",
             "--while", str(node_pid), "--from", str(attached_at)],
            pass_fds=(fd,), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL, start_new_session=True, cwd="/",
            env=tagged_env(tag))
    finally:
        listener.close()  # the relay holds it now
    return port


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="netns_relay", description=__doc__.split("\n")[0])
    parser.add_argument("--fd", type=int, required=True, help="the listening socket, inherited")
    parser.add_argument("--netns", type=Path, required=True)
    parser.add_argument("--to", required=True, help="ADDRESS:PORT inside the namespace")
    parser.add_argument("--while", dest="node_pid", type=int, required=True)
    parser.add_argument("--from", dest="attached_at", type=float, default=0.0,
                        help="epoch seconds before which no connection is answered")
    args = parser.parse_args(argv)
    host, _, port = args.to.rpartition(":")
    listener = socket.socket(fileno=args.fd)
    enter_network_namespace(args.netns)
    serve(listener, (host, int(port)), args.node_pid, args.attached_at)
    return 0


if __name__ == "__main__":
    sys.exit(main())
