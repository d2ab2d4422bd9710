"""How the lifecycle shows its progress (a `Reporter`: the CLI's draws with rich, reap's and the
tests' keep quiet) and how it times its phases, and `shielded`, which keeps a step that must
finish (launching torchrun, teardown) from being cut short by Ctrl-C or SIGTERM."""

from __future__ import annotations

import contextlib
import signal
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Protocol


class Reporter(Protocol):
    """How the lifecycle shows progress; the CLI renders it with rich. The lifecycle times each
    phase (`RunResult.phase_s`) and hands the reporter that time."""

    def phase_started(self, title: str) -> None: ...
    def phase_ended(self, title: str, seconds: float, ok: bool) -> None: ...
    def node_line(self, node: str, line: str) -> None: ...
    def note(self, text: str) -> None: ...  # a warning: something the user should look at
    def info(self, text: str) -> None: ...  # a routine line: what was done, nothing wrong


class QuietReporter:
    """Shows nothing and keeps the notes: for `reap` (run from cron) and for tests."""

    def __init__(self) -> None:
        self.notes: list[str] = []

    def phase_started(self, title: str) -> None:
        pass

    def phase_ended(self, title: str, seconds: float, ok: bool) -> None:
        pass

    def node_line(self, node: str, line: str) -> None:
        pass

    def note(self, text: str) -> None:
        self.notes.append(text)

    def info(self, text: str) -> None:
        self.notes.append(text)


@dataclass
class PhaseEnd:
    """How a phase ended: ``ok`` unless it raised, or its body said otherwise (a job that ran
    to its end and failed)."""

    ok: bool = True


@contextlib.contextmanager
def phase(reporter: Reporter, title: str, times: dict[str, float] | None = None,
          key: str = "") -> Iterator[PhaseEnd]:
    """Show a phase while it runs and time it, adding up into ``times[key]`` (a phase that
    repeats, train or recover, adds up)."""
    started, end, raised = time.perf_counter(), PhaseEnd(), True
    reporter.phase_started(title)
    try:
        yield end
        raised = False
    finally:
        seconds = time.perf_counter() - started
        reporter.phase_ended(title, seconds, end.ok and not raised)
        if times is not None:
            times[key] = times.get(key, 0.0) + seconds


@contextlib.contextmanager
def shielded(reporter: Reporter, why: str) -> Iterator[None]:
    """Hold off SIGINT/SIGTERM for a step that must not be cut short; deliver the first one held
    once it is done. Holding the signal, rather than catching the interruption wherever it lands,
    also keeps it out of the thread pool's locks (a KeyboardInterrupt raised there can leave a
    lock held, and the pool's threads waiting on it for ever)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    received: list[int] = []

    def hold(signum: int, _frame: object) -> None:
        received.append(signum)
        reporter.note(why)

    previous = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    for signum, handler in previous.items():
        if handler is not signal.SIG_IGN:  # started in the background: Ctrl-C is not for us
            signal.signal(signum, hold)
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
    if received:
        handler = previous[signal.Signals(received[0])]
        if callable(handler):  # Ctrl-C: KeyboardInterrupt; SIGTERM: the CLI's own handler
            handler(received[0], None)
        raise KeyboardInterrupt


def some_of(names: Sequence[str], shown: int = 3) -> str:
    """A few of many names in one line: the first ``shown``, then "and N more"."""
    more = len(names) - shown
    return ", ".join(names[:shown]) + (f" and {more:,} more" if more > 0 else "")
