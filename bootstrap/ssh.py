"""SSH connections that trust only pinned host keys (one step on every node at once and the error
naming its node are `node_calls.py`'s, offered here too)."""

from __future__ import annotations

import base64
import contextlib
import shlex
import socket
import threading
from collections.abc import Callable
from typing import Any, cast

import paramiko
from fabric import Config, Connection
from invoke.exceptions import UnexpectedExit
from invoke.runners import Result
from paramiko.ssh_exception import NoValidConnectionsError
from tenacity import Retrying, retry_if_exception_type, stop_after_delay, wait_exponential

from sortie.bootstrap.node_calls import NodeError as NodeError
from sortie.bootstrap.node_calls import on_all as on_all
from sortie.bootstrap.srun import SrunConnection
from sortie.bootstrap.ssh_channel import on_channel
from sortie.bootstrap.transport import CommandChannel, NodeFiles, NodeTransport, end_leftovers
from sortie.core.errors import SortieError, first_line
from sortie.core.inventory import Inventory, LoginHost, Node

# What may happen while a node is still booting: retried with backoff until the deadline.
TRANSIENT_SSH_ERRORS = (NoValidConnectionsError, ConnectionError, socket.timeout, EOFError,
                        paramiko.SSHException)


class HostKeyError(SortieError):
    """The node presented a host key other than the pinned one: never accepted; retried only
    while a new node boots (`wait_for_ssh`), never past its deadline."""

    def __init__(self, message: str, fingerprint: str = "") -> None:
        super().__init__(message)
        self.fingerprint = fingerprint  # the key it presented


def ssh_path(path: object) -> str:
    """A path as an OpenSSH option value: quoted (a space would split it into two files)."""
    text = str(path)
    if '"' in text or any(ord(c) < 32 for c in text):
        raise SortieError(f"{text!r}: OpenSSH cannot take this path (a quote or a control "
                          "character in it); set SORTIE_HOME to a plainer directory")
    return f'"{text}"'


def files_host(node: Node) -> Node | LoginHost | None:
    """Where OpenSSH reaches ``node``'s files (rsync, a delete): the node; a Slurm node's, on the
    file system its login node shares, that login node (None: it is this machine)."""
    return node.srun.login if node.srun is not None else node


def openssh_args(node: Node | LoginHost, known_hosts: object) -> list[str]:
    """The `ssh` options (before the host) that make OpenSSH trust only the node's pinned key:
    our known_hosts alone (not /etc/ssh/ssh_known_hosts, whose `@cert-authority` lines would
    vouch for any key, nor a KnownHostsCommand), no shared connection (a ControlMaster opened
    elsewhere skips the key check), the user as `-l` (a user name can never read as an
    option). The caller ends options with `--` before the host."""
    return ["-i", str(node.key_path), "-p", str(node.port), "-l", node.user,
            "-o", "StrictHostKeyChecking=yes", "-o", f"UserKnownHostsFile={ssh_path(known_hosts)}",
            "-o", "GlobalKnownHostsFile=/dev/null", "-o", "KnownHostsCommand=none",
            "-o", "ControlMaster=no", "-o", "ControlPath=none", "-o", "UpdateHostKeys=no",
            "-o", "IdentitiesOnly=yes"]


def ssh_host(address: str) -> str:
    """A node's address where rsync wants ``host:path``: an IPv6 address in brackets."""
    return f"[{address}]" if ":" in address else address


def shell_env(env: dict[str, str]) -> str:
    """``A=1 B=2`` to prefix a remote command with (no extra `env` process on the node)."""
    return " ".join(f"{name}={shlex.quote(value)}" for name, value in env.items())




def _pinned_key(host_key: str) -> paramiko.PKey:
    key_type, key_data = host_key.split()[:2]
    return paramiko.PKey.from_type_string(key_type, base64.b64decode(key_data))


class _QuickAckSocket:
    """A TCP socket that acknowledges what it receives at once. sshd leaves Nagle's algorithm
    on for sessions without a terminal: a small reply waits until the client acknowledges what
    the server sent before, and Linux delays that acknowledgement up to 40 ms where it has
    nothing to send. The handshake and a connection's first command each paid that (measured
    on loopback: connect 65 -> 20 ms, first command 55 -> 13 ms). Elsewhere: a plain socket."""

    def __init__(self, sock: socket.socket) -> None:
        self._sock = sock

    def recv(self, size: int) -> bytes:
        data = self._sock.recv(size)
        # Quick-ack mode is not sticky: the kernel leaves it on its own, so it is asked again.
        self._sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_QUICKACK, 1)
        return data

    def __getattr__(self, name: str) -> object:  # everything else paramiko uses: the socket's
        return getattr(self._sock, name)


class _NodeConnection(Connection):
    """A Fabric connection over a socket of our own (`_QuickAckSocket`), made anew whenever the
    connection (re)opens."""

    def open(self) -> object:
        if not self.is_connected:
            try:
                sock = socket.create_connection((self.host, self.port), self.connect_timeout)
            except OSError as exc:  # as paramiko says it when it makes the socket: retried
                raise NoValidConnectionsError({(self.host, self.port): exc}) from None
            # Our small requests go at once, not after the peer's delayed acknowledgement (~40
            # ms per remote command: 48 -> 13 ms for `true` on loopback).
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            self.connect_kwargs["sock"] = (_QuickAckSocket(sock)
                                           if hasattr(socket, "TCP_QUICKACK") else sock)
        return super().open()

    def open_channel(self, timeout: float) -> CommandChannel:
        self.open()
        return cast(CommandChannel, self.client.get_transport().open_session(timeout=timeout))

    def open_files(self) -> NodeFiles:
        self.open()
        return cast(NodeFiles, self.client.open_sftp())

    @property
    def files_runner(self) -> _NodeConnection:
        return self  # the run directory is on the node

    def start_job(self, prelude: str, run: str, workdir: str, command: str,
                  send: Callable[[str], Result], timeout: float) -> Result:
        """The prelude and the job's start in one call: the job in a session of its own
        (`setsid nohup`), so losing the connection never stops it; it inherits the prelude's
        lock on `running` (its command does not) until what the job left running in that
        session is ended (`end_leftovers`) and its exit code written."""
        rd = shlex.quote(run)
        job = f"{{ {command}; }} 9>&-\n{end_leftovers(run)}\necho $code > {rd}/exit_code"
        return send(f"{prelude}setsid nohup bash -c {shlex.quote(job)} "
                    f">> {rd}/torchrun.log 2>&1 < /dev/null &\necho $! > {rd}/pid")

    @property
    def image_runtimes(self) -> tuple[str, ...]:
        return ("podman", "docker")

    def ended_by(self, run: str) -> str | None:
        return None  # nothing on an SSH node records why its job was killed

    def run(self, command: str, **kwargs: Any) -> Result:
        """Fabric's `run`; a quiet one (what sortie's steps are: output hidden, no streams),
        or one whose output all goes to one stream of the caller's (a job's log, `watch`), on
        a channel read directly (`on_channel`), without Invoke's threads."""
        asked, stream = set(kwargs), kwargs.get("out_stream")
        if kwargs.get("err_stream") is stream and stream is not None \
                and kwargs.get("hide") is False:  # one stream of the caller's
            sink, asked = stream.write, asked - {"out_stream", "err_stream"}
        elif kwargs.get("hide", True):  # quiet
            sink = None
        else:
            return super().run(command, **kwargs)
        if asked - {"timeout", "warn", "hide"} or self.command_cwds or self.command_prefixes:
            return super().run(command, **kwargs)
        self.open()
        result = on_channel(self, command, kwargs.get("timeout"), sink)
        if not result.ok and not kwargs.get("warn", self.config.run.warn):
            raise UnexpectedExit(result)
        return result


def connect(node: Node, timeout: float = 10.0) -> NodeTransport:
    """An open Fabric connection to ``node`` that accepts only its pinned host key; a Slurm
    node's steps through `srun` (`bootstrap/srun.py`), run on its login node."""
    if node.srun is not None:
        login = login_connection(node.srun.login, timeout) if node.srun.login else None
        return SrunConnection(node, login)
    return _open_pinned(node, node.name, timeout)


def _open_pinned(host: Node | LoginHost, name: str, timeout: float) -> _NodeConnection:
    """An open connection to ``host`` with its key, accepting only its pinned host key."""
    key_path, host_key = host.key_path, host.host_key
    assert key_path is not None and host_key is not None  # (a Slurm node has neither)
    config = Config(overrides={"load_ssh_configs": False,
                               "run": {"hide": True, "warn": True, "in_stream": False}})
    conn = _NodeConnection(
        host.address, user=host.user, port=host.port, config=config, connect_timeout=timeout,
        connect_kwargs={"key_filename": str(key_path), "look_for_keys": False,
                        "allow_agent": False, "banner_timeout": timeout, "auth_timeout": timeout},
    )
    # Fabric trusts unknown hosts by default (AutoAddPolicy); we pin instead.
    conn.client.set_missing_host_key_policy(paramiko.RejectPolicy())
    key = _pinned_key(host_key)
    conn.client.get_host_keys().add(host.known_hosts_name, key.get_name(), key)
    try:
        conn.open()
    except paramiko.BadHostKeyException as exc:
        conn.close()
        raise HostKeyError(
            f"{name} ({host.address}:{host.port}) presented host key "
            f"{exc.key.fingerprint}, pinned is {key.fingerprint}: refusing to connect",
            exc.key.fingerprint) from None
    except paramiko.AuthenticationException as exc:
        conn.close()
        raise NodeError(f"{name} ({host.address}:{host.port}) rejected the key {key_path}: "
                        f"{exc}") from None
    except BaseException:
        conn.close()
        raise
    return conn


_logins: dict[LoginHost, _NodeConnection] = {}
_logins_lock = threading.Lock()


def login_connection(login: LoginHost, timeout: float = 10.0) -> _NodeConnection:
    """This process's one connection to a Slurm login node (opened again once dropped): every
    node's steps and every Slurm command are channels of it, so a 64-node allocation is one
    SSH login, not 64 (sshd refuses a burst of them: MaxStartups)."""
    with _logins_lock:
        conn = _logins.get(login)
        transport = conn.client.get_transport() if conn is not None else None
        if transport is None or not transport.is_active():
            if conn is not None:
                conn.close()
            try:
                conn = _open_pinned(login, "the login node", timeout)
            except (OSError, paramiko.SSHException, EOFError) as exc:
                raise NodeError(f"the login node {login.address}:{login.port} is not reachable"
                                f" over SSH: {first_line(exc)}") from None
            _logins[login] = conn
        assert conn is not None
        return conn


def wait_for_ssh(node: Node, timeout: float = 120.0, booting: bool = False,
                 seen: list[str] | None = None) -> NodeTransport:
    """Connect to a node that may still be booting: bounded retries with exponential backoff.
    ``booting`` (a node just made, whose first boot installs its pinned host key): a sshd that
    answers before that with the image's own key (an early connection starting a socket-
    activated sshd, as on Ubuntu 24.04) is "not ready yet" until the deadline, each key it
    presented added to ``seen``; past the deadline it is refused as always."""
    retryable = TRANSIENT_SSH_ERRORS + ((HostKeyError,) if booting else ())

    def attempt() -> NodeTransport:
        try:
            return connect(node, min(timeout, 10.0))
        except HostKeyError as exc:
            if seen is not None and exc.fingerprint not in seen:
                seen.append(exc.fingerprint)
            raise

    retrying = Retrying(stop=stop_after_delay(timeout),
                        wait=wait_exponential(multiplier=0.05, max=5),
                        retry=retry_if_exception_type(retryable), reraise=True)
    try:
        return retrying(attempt)
    except HostKeyError as exc:
        if not booting:
            raise
        raise HostKeyError(f"{exc} (still, {timeout:.0f}s after it was made)",
                           exc.fingerprint) from None
    except TRANSIENT_SSH_ERRORS as exc:
        raise NodeError(f"{node.name} ({node.address}:{node.port}) not reachable over SSH "
                        f"after {timeout:.0f}s: {exc}") from None


class Connections(dict[str, NodeTransport]):
    """Open connections by node name, owned by whoever holds them: `close` (or the end of a
    `with` block) closes every one, `drop` closes one; a connection that fails to close (its
    node is gone) never stops the others from closing."""

    def drop(self, name: str) -> None:
        conn = self.pop(name, None)
        if conn is not None:
            with contextlib.suppress(Exception):
                conn.close()

    def close(self) -> None:
        for name in list(self):
            self.drop(name)

    def __enter__(self) -> Connections:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()


def connect_reachable(inventory: Inventory, timeout_s: float) -> Connections:
    """Open connections to the nodes that answer within ``timeout_s`` (pinned host keys)."""
    def attempt(node: Node) -> NodeTransport | None:
        try:
            return wait_for_ssh(node, timeout_s)
        except SortieError:
            return None

    conns = on_all(inventory.nodes, attempt)
    return Connections((node.name, conn)
                       for node, conn in zip(inventory.nodes, conns, strict=True) if conn)
