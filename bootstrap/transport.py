"""What bootstrap asks of a node, whatever reaches it: a command (`run`), a channel of one
command (`open_channel`), its files (`open_files`), a job that outlives the call (`start_job`).

Two transports have it: SSH (`bootstrap/ssh.py`, a Fabric connection whose host key is pinned)
and a Slurm job step (`bootstrap/srun.py`, `srun` on the login node). Bootstrap never asks which
it has; both channels are read by one reader (`bootstrap/ssh_channel.py`).
"""

from __future__ import annotations

import shlex
from collections.abc import Callable
from typing import Any, Protocol

from invoke.runners import Result


class CommandChannel(Protocol):
    """One command's channel, as paramiko's: its stdin, its output, its exit status. A Slurm
    step's always combines stderr with stdout (`set_combine_stderr(True)` is asked first)."""

    @property
    def closed(self) -> bool: ...
    @property
    def eof_received(self) -> bool: ...

    def settimeout(self, timeout: float | None) -> None: ...
    def set_combine_stderr(self, combine: bool) -> object: ...
    def exec_command(self, command: str) -> None: ...
    def sendall(self, data: bytes) -> None: ...
    def shutdown_write(self) -> None: ...
    def recv(self, size: int) -> bytes: ...
    def recv_ready(self) -> bool: ...
    def recv_stderr(self, size: int) -> bytes: ...
    def recv_stderr_ready(self) -> bool: ...
    def exit_status_ready(self) -> bool: ...
    def fileno(self) -> int: ...
    def close(self) -> None: ...

    @property
    def exit_status(self) -> int: ...


class NodeFiles(Protocol):
    """Reading a node's files, as paramiko's SFTP client (what collection uses of it)."""

    def listdir_attr(self, path: str) -> list[Any]: ...
    def stat(self, path: str) -> Any: ...
    def open(self, path: str, mode: str = "rb") -> Any: ...
    def get_channel(self) -> Any: ...
    def close(self) -> None: ...


class CommandRunner(Protocol):
    def run(self, command: str, **kwargs: Any) -> Result: ...


class NodeTransport(CommandRunner, Protocol):
    """A node, reached: by SSH or through a Slurm step."""

    def open(self) -> object: ...
    def close(self) -> None: ...

    def open_channel(self, timeout: float) -> CommandChannel:
        """A channel of its own for one command (the caller closes it)."""
        ...

    def open_files(self) -> NodeFiles:
        """An SFTP-like session on the node's files, the caller's own (closed by it)."""
        ...

    @property
    def files_runner(self) -> CommandRunner:
        """Where a command that only reads and writes the node's run directory runs: the node;
        a Slurm node's, its login node, which shares its file system (and outlives the
        allocation)."""
        ...

    def start_job(self, prelude: str, run: str, workdir: str, command: str,
                  send: Callable[[str], Result], timeout: float) -> Result:
        """Run ``prelude`` (by ``send``, which carries the job's secrets on stdin) and start
        ``command`` in ``workdir`` detached: it outlives the call and the connection, holds the
        lock on ``run``/running while it runs (fd 9, which the prelude opens), wrote ``run``/pid
        before this returns and writes ``run``/exit_code when it ends; its output is appended
        to ``run``/torchrun.log. ``timeout`` bounds the start."""
        ...

    @property
    def image_runtimes(self) -> tuple[str, ...]:
        """What a job on this node runs a container image with, by preference: an SSH node's
        own runtimes (podman, docker); a Slurm step's, the site's (pyxis, apptainer)."""
        ...

    def ended_by(self, run: str) -> str | None:
        """Why the job started in ``run`` ended without writing its exit code, as what ran it
        says (Slurm killed its step: out of memory, its time limit); None where nothing
        says (SSH: the job was killed, or its node lost), or it cannot be asked. Never raises."""
        ...


def end_leftovers(run: str, group: str = "$$", log: str | None = None,
                  grace_s: float = 5.0) -> str:
    """Shell run once the job's command exited (``$?`` kept as ``$code``): what the job left
    running in its process group ``group`` (a `cmd &` of its `run:` line) ended, SIGTERM then
    SIGKILL ``grace_s`` later, and said in its log (``log``; else on standard output), so that
    the next job on a held cluster finds the node as this one found it (its GPU memory, its
    ports), as Slurm's cgroups end a step's processes with it. ``$$``: the job's own shell,
    which leads the group and stays. (torchrun's workers have sessions of their own, and end
    with torchrun.)"""
    listed, pids = shlex.quote(f"{run}/left"), '"$(echo $left | tr " " ,)"'
    said = f" >> {shlex.quote(log)}" if log else ""
    # The group's members but the shell itself, listed into a file: a pipe's own processes
    # would be members too. Listed again before the SIGKILL: only members are killed, never a
    # process that took a pid one of them left.
    members = (f"pgrep -g {group} > {listed} 2>/dev/null; left=$(grep -vx $$ {listed}); "
               f"rm -f {listed}\n")
    return ("code=$?; trap '' TERM\n" + members +
            'if [ -n "$left" ]; then\n'
            f"  names=$(ps -o comm= -p {pids} | sort -u | tr '\\n' ' ')\n"
            '  n=$(echo $left | wc -w); [ "$n" = 1 ] && what=process || what=processes\n'
            f'  echo "[sortie] the job left $n $what running (${{names% }}): ended"{said}\n'
            f"  kill -TERM -- -{group} 2>/dev/null\n"
            f"  for i in $(seq {max(1, int(grace_s * 10))}); do "
            f"ps -o stat= -p {pids} | grep -qv '^Z' || break; sleep 0.1; done\n"
            f"  {members}"
            '  [ -z "$left" ] || kill -KILL $left 2>/dev/null\n'
            "fi")
