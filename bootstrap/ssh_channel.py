"""One command on a node's channel (paramiko's, or a Slurm step's through `srun`: one reader for
both), bounded: a deadline whatever the node does, and its output kept capped (the tail, the rest
counted)."""

from __future__ import annotations

import codecs
import math
import select
import time
from collections.abc import Callable

from invoke.exceptions import CommandTimedOut
from invoke.runners import Result

from sortie.bootstrap.transport import CommandChannel, NodeTransport

# What the controller keeps of one node call's output, per stream: the tail (what is parsed and
# quoted), the rest counted. A node printing without end (a job replaced the node's Python
# launcher with `yes`: 3 GB in 32 s) cannot exhaust the controller.
MAX_KEPT_BYTES = 4 << 20
# A node call given no timeout still ends: the controller's own deadline, whatever the node does.
NODE_CALL_DEADLINE_S = 900.0


class _Tail:
    """The last ``MAX_KEPT_BYTES`` of a stream, and how many bytes came before them."""

    def __init__(self) -> None:
        self.kept, self.dropped = bytearray(), 0

    def __iadd__(self, data: bytes) -> _Tail:
        self.kept += data
        if len(self.kept) > 2 * MAX_KEPT_BYTES:  # trimmed in steps: linear, not per chunk
            cut = len(self.kept) - MAX_KEPT_BYTES
            self.dropped += cut
            del self.kept[:cut]
        return self

    def text(self) -> str:
        cut = max(0, len(self.kept) - MAX_KEPT_BYTES)
        head = f"[{self.dropped + cut} bytes of output not kept]\n" if self.dropped + cut else ""
        return head + self.kept[cut:].decode("utf-8", "replace")


def run_with_input(conn: NodeTransport, command: str, data: bytes,
                   timeout: float | None = None) -> Result:
    """Run ``command`` on the node with ``data`` on its stdin, then end of file; its stdout
    and stderr come back together, as ``stdout``. Fabric feeds stdin through Invoke a byte at a
    time, a hundred a second: a few KB took minutes and could break the channel. This sends it
    at once over its own channel of the open connection; output is read once it is sent, so the
    command must read its stdin before it writes much (ours read it first). ``timeout`` bounds
    the whole call (CommandTimedOut past it), not each read."""
    timeout = timeout or NODE_CALL_DEADLINE_S
    channel = conn.open_channel(timeout)
    try:
        channel.settimeout(timeout)
        channel.set_combine_stderr(True)
        channel.exec_command(command)
        channel.sendall(data)
        channel.shutdown_write()
        out, _, code = _read_channel(channel, command, time.monotonic() + timeout, timeout)
    finally:
        channel.close()
    return Result(stdout=out.text(), command=command, exited=code)


def first_line(channel: CommandChannel, limit: int = 512) -> str:
    """A running command's first line of output (what it said before it waits: "locked",
    "listening"); what came by the channel's timeout, or at its end, when there is no line."""
    answer = b""
    try:
        while not answer.endswith(b"\n") and len(answer) < limit:
            chunk = channel.recv(limit)
            if not chunk:
                break
            answer += chunk
    except OSError:  # a timeout (socket.timeout, a step's TimeoutError): the caller says it
        pass
    return answer.decode(errors="replace").strip()


LATE_STDERR_S = 0.2  # how long after EOF and the exit status a command's stderr may still come


def on_channel(conn: NodeTransport, command: str, timeout: float | None,
               stream: Callable[[str], object] | None = None) -> Result:
    """``command`` on a channel of its own of the open connection, read as it comes: no thread
    and no polling (Invoke's runner starts three threads a command and wakes every 10 ms while
    it runs: at 254 nodes, most of the controller's CPU). Past ``timeout`` (the controller's
    deadline when None) the channel is closed and CommandTimedOut raised, as Fabric does.
    ``stream``: where its output goes as it comes, stdout's and stderr's each as read (a job's
    log followed for its whole life: no deadline unless a timeout is given; the Result holds
    none of it)."""
    deadline_s = timeout or (math.inf if stream else NODE_CALL_DEADLINE_S)
    channel = conn.open_channel(min(deadline_s, NODE_CALL_DEADLINE_S))
    try:
        channel.exec_command(command)
        out, err, code = _read_channel(channel, command, time.monotonic() + deadline_s,
                                       deadline_s, stream)
    finally:
        channel.close()
    return Result(stdout=out.text(), stderr=err.text(), command=command, exited=code)


def _read_channel(channel: CommandChannel, command: str, deadline: float, timeout: float,
                  stream: Callable[[str], object] | None = None) -> tuple[_Tail, _Tail, int]:
    """A running command's stdout and stderr (their tails; with ``stream``, handed to it as
    text instead) and its exit status."""
    out, err = _Tail(), _Tail()
    # A character split between reads is decoded whole: a decoder per stream (sshd sends each
    # as it reads it, so stderr may come between a character's bytes on stdout).
    decoders = [codecs.getincrementaldecoder("utf-8")("replace") for _ in range(2)]

    def take(tail: _Tail, data: bytes, decoder: codecs.IncrementalDecoder) -> None:
        if stream is None:
            tail += data
        elif text := decoder.decode(data):
            stream(text)

    eof_at = None
    while True:  # the channel's fileno is readable when either stream has data, or at EOF
        if channel.recv_ready():
            take(out, channel.recv(1 << 16), decoders[0])
        elif channel.recv_stderr_ready():
            take(err, channel.recv_stderr(1 << 16), decoders[1])
        elif channel.closed:  # the server's close: after its last byte and the exit status
            break
        else:
            left = deadline - time.monotonic()
            if left <= 0:
                raise CommandTimedOut(Result(stdout=out.text(), command=command, exited=-1),
                                      math.ceil(timeout))
            if not channel.eof_received:
                select.select([channel], [], [], left if math.isfinite(left) else None)
                continue
            # After EOF OpenSSH may still send stderr, then closes; a child left holding
            # stderr keeps the channel open: then, as with Fabric, the exit status ends it.
            eof_at = eof_at or time.monotonic()
            if channel.exit_status_ready() and time.monotonic() - eof_at > LATE_STDERR_S:
                break
            time.sleep(0.001)
    for decoder in decoders:
        if stream is not None and (rest := decoder.decode(b"", final=True)):
            stream(rest)
    return out, err, channel.exit_status  # (there: both ends of the loop come after it)
