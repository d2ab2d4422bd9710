"""A Slurm node reached through `srun` inside its allocation, never over SSH (many sites forbid
SSH to compute nodes): what the rest of bootstrap asks of a Fabric connection, on a Slurm node.

Every command is one job step, `srun --jobid=J --overlap --nodelist=HOST -N1 -n1 bash -c CMD`,
run on the login node (the controller's machine, or one it reaches over SSH with a pinned host
key); its output streams back, its stdin goes to the node.
A detached job (`spawn`) is a step that lives as long as the job: a step's processes end with it
(`proctrack/cgroup`), so nothing may be left behind by a step that returned. The run's files are
on the file system the login node shares with its compute nodes: they are read where they are.
"""

from __future__ import annotations

import os
import re
import select
import shlex
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any, cast

import paramiko
from invoke import Config, Context
from invoke.runners import Local, Result

from sortie.bootstrap.transport import CommandChannel, NodeFiles, end_leftovers
from sortie.core.inventory import Node, SrunRoute

# `--export=ALL`: a step gets the controller's environment, as where Slurm's default holds. A site
# that sets SLURM_EXPORT_ENV=NONE (beside SBATCH_EXPORT=NONE) starts steps without even a PATH
# ("execve(): bash: No such file or directory", exit 2); its own guides say the same to users.
STEP_OPTIONS = ("--overlap", "--nodes=1", "--ntasks=1", "--quiet", "--kill-on-bad-exit=1",
                "--export=ALL")


LAUNCH_MARK = "sortie-launch"  # a line in `srun.log` before each launch's step
# What srun and slurmstepd print when Slurm ends a step, most telling first (Slurm 22.05's own
# words: jobacct_gather's OverMemoryKill, task/cgroup's OOM killer, a cancelled step's banner).
SLURM_ENDINGS = (
    (re.compile(r"exceeded memory limit \((\d+) > (\d+)\)"),
     "Slurm killed its step: it used {0} of memory, over the {1} the allocation holds (--mem)"),
    (re.compile(r"Detected \d+ oom-kill event"),
     "Slurm killed its step: out of the allocation's memory (--mem)"),
    (re.compile(r"CANCELLED AT \S+ DUE TO TIME LIMIT"),
     "Slurm cancelled its step: the allocation's time limit (--time)"),
    (re.compile(r"CANCELLED AT \S+ DUE TO PREEMPTION"), "Slurm cancelled its step: preempted"),
    (re.compile(r"CANCELLED AT \S+ DUE TO NODE FAILURE"),
     "Slurm cancelled its step: its node failed"),
    (re.compile(r"\*\*\* STEP \S+ ON \S+ CANCELLED AT"), "Slurm cancelled its step"),
)


def slurm_ending(srun_log: str) -> str | None:
    """Why Slurm ended the latest launch's step, from what srun printed (`srun.log` after its
    last LAUNCH_MARK); None when Slurm said nothing of it."""
    said = srun_log.rpartition(LAUNCH_MARK)[2]
    for pattern, why in SLURM_ENDINGS:
        if found := pattern.search(said):
            return why.format(*(f"{int(n) / 2**20:.0f} MiB" for n in found.groups()))
    return None


def step_command(route: SrunRoute, command: str) -> list[str]:
    """`srun` running ``command`` (bash) as one task on the route's node, beside whatever else
    runs in the allocation (`--overlap`), on all of the allocation's CPUs there. (A site that
    binds tasks to cores, `TaskPlugin=task/affinity`, gave a step without `--cpus-per-task`
    one CPU: srun no longer takes the job's since 22.05. `--cpu-bind=none` instead makes srun
    print an error into every step's output at a site that binds nothing, `task/none`.)"""
    cpus = [f"--cpus-per-task={route.cpus}"] if route.cpus else []
    return ["srun", f"--jobid={route.job_id}", f"--nodelist={route.host}", *STEP_OPTIONS,
            *cpus, "bash", "-c", command]


class _StepChannel:
    """A step as a paramiko channel (`bootstrap/transport.CommandChannel`): the command's stdin,
    and its output (stderr with stdout) read from the `srun` process's pipe, unbuffered (what
    `select` says is there is all there is)."""

    def __init__(self, route: SrunRoute) -> None:
        self.route = route
        self.process: subprocess.Popen[bytes] | None = None
        self.timeout: float | None = None
        self.pending, self.eof_received = b"", False

    def settimeout(self, timeout: float | None) -> None:
        self.timeout = timeout

    def set_combine_stderr(self, combine: bool) -> bool:
        if not combine:
            raise ValueError("a Slurm step's channel has its stderr with its stdout")
        return True

    def exec_command(self, command: str) -> None:
        self.process = subprocess.Popen(step_command(self.route, command), stdin=subprocess.PIPE,
                                        stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                        bufsize=0, start_new_session=True)

    def _started(self) -> subprocess.Popen[bytes]:
        if self.process is None:
            raise OSError("the step's command has not been started")
        return self.process

    def fileno(self) -> int:
        out = self._started().stdout
        assert out is not None
        return out.fileno()

    def sendall(self, data: bytes) -> None:
        stdin = self._started().stdin
        assert stdin is not None
        while data:  # (unbuffered: a write may take part of it)
            data = data[stdin.write(data):]

    def shutdown_write(self) -> None:
        stdin = self._started().stdin
        assert stdin is not None
        stdin.close()

    def recv_ready(self) -> bool:
        if not self.pending and not self.eof_received and select.select([self], [], [], 0)[0]:
            self.pending = os.read(self.fileno(), 1 << 16)
            self.eof_received = not self.pending
        return bool(self.pending)

    def recv(self, size: int) -> bytes:
        """The next output (b"" at its end), waiting up to the channel's timeout."""
        if not self.pending and not self.eof_received and not select.select(
                [self], [], [], self.timeout)[0]:
            raise TimeoutError(f"no answer from {self.route.host} within {self.timeout}s")
        self.recv_ready()
        data, self.pending = self.pending[:size], self.pending[size:]
        return data

    def recv_stderr_ready(self) -> bool:
        return False  # (with stdout)

    def recv_stderr(self, size: int) -> bytes:
        return b""

    def exit_status_ready(self) -> bool:
        return self._started().poll() is not None

    @property
    def exit_status(self) -> int:
        code = self._started().poll()
        return -1 if code is None else code

    @property
    def closed(self) -> bool:
        return self.eof_received and not self.pending and self.exit_status_ready()

    def close(self) -> None:
        if self.process and self.process.poll() is None:
            self.process.terminate()  # srun ends the step on the node
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
        for pipe in (self.process.stdin, self.process.stdout) if self.process else ():
            if pipe is not None:
                pipe.close()


class _SharedFiles:
    """What collection uses of an SFTP session, on the shared file system the login node sees."""

    def listdir_attr(self, path: str) -> list[paramiko.SFTPAttributes]:
        return [paramiko.SFTPAttributes.from_stat(os.lstat(entry.path), entry.name)
                for entry in os.scandir(path)]

    def stat(self, path: str) -> paramiko.SFTPAttributes:
        return paramiko.SFTPAttributes.from_stat(os.stat(path))

    def open(self, path: str, mode: str = "rb") -> _LocalHandle:
        return _LocalHandle(Path(path).open(mode))  # noqa: SIM115 - closed by its `with`

    def get_channel(self) -> _SharedFiles:
        return self

    def settimeout(self, timeout: float | None) -> None:
        pass

    def close(self) -> None:
        pass


class _LocalHandle:
    def __init__(self, handle: IO[bytes]) -> None:
        self.handle = handle

    def prefetch(self) -> None:
        pass

    def read(self, size: int = -1) -> bytes:
        return self.handle.read(size)

    def __enter__(self) -> _LocalHandle:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.handle.close()


class _LoginStep:
    """A step run from a login node reached over SSH: a channel of the connection to it whose
    command is the step; its stdin and output are the step's."""

    def __init__(self, channel: paramiko.Channel, route: SrunRoute) -> None:
        self.channel, self.route = channel, route

    def exec_command(self, command: str) -> None:
        self.channel.exec_command(shlex.join(step_command(self.route, command)))

    def __getattr__(self, name: str) -> Any:
        return getattr(self.channel, name)


# What the runner keeps of a streamed command's output (its sink has all of it), in reads.
STREAMED_KEPT_READS = 256


class StreamingLocal(Local):
    """Invoke's runner of a command on a Slurm login node that is this machine, less two costs
    of one streamed for hours (a job's log, `watch`; over SSH it is read off its own channel,
    `ssh_channel.on_channel`): on every read Invoke joined everything read so far for its
    watchers, which sortie never gives (quadratic: 800k lines of a chatty job took the
    controller 63 s to show, the job 3), and it kept all of it. Without watchers nothing is
    joined, and a command whose output goes to a stream of the caller's keeps its last reads."""

    read_chunk_size = 1 << 16  # bytes a read (Invoke's 1000: a Python loop per KB)

    def respond(self, buffer_: list[str]) -> None:
        if self.watchers:
            super().respond(buffer_)
        elif len(buffer_) > 2 * STREAMED_KEPT_READS and (
                self.opts.get("out_stream") is not None or self.opts.get("err_stream") is not None):
            del buffer_[:-STREAMED_KEPT_READS]  # in steps: linear


class SrunConnection:
    """A Slurm node (`bootstrap/transport.NodeTransport`): `run` and `open_channel` (one step
    each), `open_files` (the shared file system, as the login node sees it), `start_job` (a
    step that outlives the call). Its steps are started on the login node: here, or through
    ``login``, a connection to it."""

    def __init__(self, node: Node, login: Any = None) -> None:
        assert node.srun is not None
        self.node, self.route, self.login = node, node.srun, login
        self.host = node.srun.host
        self._context = Context(Config(overrides={"run": {"hide": True, "warn": True,
                                                          "in_stream": False},
                                                  "runners": {"local": StreamingLocal}}))

    @property
    def files_runner(self) -> Any:
        """A runner on the login node (where every step starts): the shared file system is
        there too."""
        return self._login_runner

    @property
    def _login_runner(self) -> Any:
        return self.login if self.login is not None else self._context

    def open_channel(self, timeout: float) -> CommandChannel:
        if self.login is not None:
            self.login.open()
            channel = self.login.client.get_transport().open_session(timeout=timeout)
            return _LoginStep(channel, self.route)
        return _StepChannel(self.route)

    def open_files(self) -> NodeFiles:
        if self.login is not None:
            self.login.open()
            return cast(NodeFiles, self.login.client.open_sftp())
        return _SharedFiles()

    def open(self) -> None:
        return None

    def close(self) -> None:
        return None  # a login node's connection is the process's, for every node

    def run(self, command: str, **kwargs: Any) -> Result:
        """``command`` on the node; Fabric's `run` options (timeout, hide, out_stream...)."""
        return self._login_runner.run(shlex.join(step_command(self.route, command)), **kwargs)

    @property
    def image_runtimes(self) -> tuple[str, ...]:
        # A step runs as the site's user inside Slurm's cgroups: a site runs images through
        # its own plugin or runtime, never a rootful podman beside Slurm.
        return ("pyxis", "apptainer")

    def ended_by(self, run: str) -> str | None:
        log = shlex.quote(f"{run}/srun.log")
        try:
            said = self.files_runner.run(f"tail -c 65536 {log} 2>/dev/null", timeout=30).stdout
        except Exception:  # noqa: BLE001 - a login node that cannot be asked says nothing
            return None
        return slurm_ending(said)

    def spawn(self, command: str, log: str) -> None:
        """Start ``command`` as a step of its own and return: the step (and the `srun` on the
        login node that holds it, in a session of its own) lives until the command ends;
        srun's own messages are appended to ``log`` (a path on the shared file system)."""
        step = step_command(self.route, command)
        if self.login is not None:
            self.login.run(f"setsid nohup {shlex.join(step)} >> {shlex.quote(log)} 2>&1 "
                           "< /dev/null &", timeout=30)
            return
        with Path(log).open("ab") as out:
            subprocess.Popen(step, stdin=subprocess.DEVNULL, stdout=out,
                             stderr=subprocess.STDOUT, start_new_session=True)

    def start_job(self, prelude: str, run: str, workdir: str, command: str,
                  send: Callable[[str], Result], timeout: float) -> Result:
        """The prelude in a step, then ``command`` in a step of its own that lives as long as
        it does, holding the lock on `running` and writing `pid` before this returns (`watch`
        may follow it then), its exit code once it ends. The job's own session is what `stop`
        signals. Slurm signals a step's processes (its time limit's --signal, a preemption):
        the step's shell outlives the signal (a handler, which its children do not inherit) to
        end what the job left in its session (`end_leftovers`: a site's proctrack/linuxproc
        lets an orphan outlive the step) and record the code."""
        rd = shlex.quote(run)
        # Slurm's messages about this launch's step come after the mark (`ended_by`).
        started = send(f"{prelude}rm -f {rd}/pid; echo {LAUNCH_MARK} >> {rd}/srun.log")
        if not started.ok:
            return started
        self.spawn(f"cd {shlex.quote(workdir)} || exit 1\n"
                   f"exec 9> {rd}/running && flock 9 || exit 1\ntrap true TERM INT HUP USR1\n"
                   f"setsid bash -c {shlex.quote(command)} 9>&- >> {rd}/torchrun.log 2>&1 "
                   f"< /dev/null &\njob=$!; echo $job > {rd}/pid\n"
                   "while :; do wait $job; code=$?; kill -0 $job 2>/dev/null || break; done\n"
                   f"(exit $code); {end_leftovers(run, '$job', f'{run}/torchrun.log')}\n"
                   f"echo $code > {rd}/exit_code", f"{run}/srun.log")
        return self.run(f"for i in $(seq {int(timeout * 20)}); do test -s {rd}/pid && exit 0; "
                        "sleep 0.05; done; echo 'the job step did not start' >&2; exit 1",
                        timeout=timeout + 10)
