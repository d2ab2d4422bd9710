"""A node's output, line by line: the job's log as `train.watch` streams it, and a file a step
writes on the node (a setup's log, a pull's), read as it grows while the step runs
(`following`). Lines a progress bar redraws with ``\r`` are taken as a terminal shows them, and
shown every ``REDRAW_EVERY_S`` while they are redrawn (a tqdm bar's epoch is not minutes of
nothing)."""

from __future__ import annotations

import contextlib
import shlex
import threading
import time
from collections.abc import Callable, Iterator

from sortie.bootstrap.transport import NodeTransport
from sortie.core.inventory import Node

LineSink = Callable[[str, str], None]  # (node name, line)
FOLLOW_EVERY_S = 1.0  # how often a followed file's new output is read from its node
FOLLOW_CHUNK = 1 << 20  # bytes of it read at a time

MAX_LINE = 16 << 10  # characters of one streamed line; the rest is cut
REDRAW_EVERY_S = 10.0  # how often a line a progress bar keeps redrawing is shown as it stands
EXIT_MARK = "\x1esortie-exit "  # what `watch` prints after the log: the exit code and its time


def _last_state(line: str) -> str:
    """What a terminal would show of a line a progress bar redrew with ``\r``: after the last
    one (a ``\r\n`` line end is not a redraw)."""
    return line.rstrip("\r").rsplit("\r", 1)[-1]


def shown_lines(text: str) -> list[str]:
    """A log's lines as a terminal shows them: a progress bar's redraws of one line are its
    last state, not a line each (`sortie logs` of a tqdm epoch: one line, not thousands)."""
    return [_last_state(line) for line in text.removesuffix("\n").split("\n")] if text else []


class LineWriter:
    """A file-like sink for Fabric's output streams that hands whole lines to a callback. What
    waits for its newline is bounded (``MAX_LINE``), so a progress bar that redraws one line
    with ``\r`` for hours costs neither memory nor a rescan of all of it on every write."""

    def __init__(self, node: str, sink: LineSink, redraw_every_s: float = REDRAW_EVERY_S,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.node, self.sink, self.pending = node, sink, ""
        self.exit_line: str | None = None  # what `watch` printed after the log: not the job's
        self.redraw_every_s, self.clock = redraw_every_s, clock
        self.shown_at = clock()  # when the last line was handed on
        self.redraw_shown: str | None = None  # the pending line's state handed on, if any

    def _show(self, line: str) -> None:
        self.sink(self.node, line)
        self.shown_at = self.clock()

    def _line_ended(self, line: str) -> None:
        state, shown = _last_state(line), self.redraw_shown
        self.redraw_shown = None
        if state != shown:  # a `\r\n` split between reads was shown once already
            self._show(state)

    def write(self, data: str) -> None:
        self.pending += data
        *lines, self.pending = self.pending.split("\n")
        for line in lines:
            if EXIT_MARK in line:  # after a last log line without its newline, if any
                line, self.exit_line = line.split(EXIT_MARK, 1)
                if not line:
                    continue
            self._line_ended(line)
        # A bar still redrawing: its last whole state (the one before the latest `\r`; what
        # follows that may be half a write), shown when nothing was for a while.
        if self.clock() - self.shown_at >= self.redraw_every_s and "\r" in self.pending:
            state = next((s for s in reversed(self.pending.split("\r")[:-1]) if s), None)
            if state is not None and state != self.redraw_shown:
                self.redraw_shown = state
                self._show(state)
        if len(self.pending) > MAX_LINE:
            # Keep a trailing \r: what comes next redraws the line.
            redrawn = "\r" if self.pending.endswith("\r") else ""
            self.pending = _last_state(self.pending) + redrawn
            if len(self.pending) > MAX_LINE:
                self._show(self.pending[:MAX_LINE] + " [line cut]")
                self.pending, self.redraw_shown = "", None

    def flush(self) -> None:
        pass

    def close(self) -> None:
        if self.pending:
            self._line_ended(self.pending)
            self.pending = ""


def follow_log(conn: NodeTransport, node: Node, path: str, sink: LineSink,
               done: threading.Event, every_s: float = FOLLOW_EVERY_S) -> None:
    """Hand the lines ``path`` on ``node`` gains to ``sink`` as they come (read every
    ``every_s``, at most FOLLOW_CHUNK bytes a read), until ``done`` is set and all of it is
    read: a setup's `pip install` shows its progress, not minutes of a spinner. A read that
    fails is tried at the next tick (the setup's own call says what became of the node)."""
    writer, offset, last, behind = LineWriter(node.name, sink), 0, False, False
    quoted = shlex.quote(path)
    while True:
        if not behind:
            last = done.wait(every_s) or last
        try:  # where the read ends first: the next starts there, whatever the bytes decode to
            got = conn.files_runner.run(
                f"size=$(stat -c %s {quoted} 2>/dev/null) || exit 0\n"
                f"n=$(( size - {offset} )); [ $n -le {FOLLOW_CHUNK} ] || n={FOLLOW_CHUNK}\n"
                f"echo $(( {offset} + n )) $size\n"
                f"tail -c +{offset + 1} {quoted} | head -c $n", hide=True, warn=True, timeout=10)
            head, _, text = got.stdout.partition("\n")
        except Exception:  # noqa: BLE001 - said by the setup's own call, not by its follower
            head, text = "", ""
        ends = [int(end) for end in head.split() if end.isdigit()]
        behind = len(ends) == 2 and ends[0] < ends[1]
        if len(ends) == 2 and ends[0] >= offset:
            offset = ends[0]
            writer.write(text)
        if last and not behind:
            break
    writer.close()


@contextlib.contextmanager
def following(conn: NodeTransport, node: Node, path: str, sink: LineSink | None
              ) -> Iterator[None]:
    """While the body runs (a step that writes ``path`` on ``node``), hand its lines to
    ``sink`` as they come; after it, the rest. No ``sink``: nothing is read."""
    if sink is None:
        yield
        return
    done = threading.Event()
    follower = threading.Thread(target=follow_log, args=(conn, node, path, sink, done),
                                daemon=True)
    follower.start()
    try:
        yield
    finally:
        done.set()
        follower.join(timeout=15)
