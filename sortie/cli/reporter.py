"""The lifecycle's progress on a terminal (a `Reporter`): a spinner while a phase runs, then ✓ or
✗ with its time; the nodes' output, a line each with its node, printed in batches."""

from __future__ import annotations

import atexit
import contextlib
import threading
import time

from rich.console import Console
from rich.status import Status
from rich.text import Text

from sortie.cli.render import escape, terminal_safe

LINES_EVERY_S = 0.05  # how long a node's line may wait for others to be printed with it
LINES_A_PRINT = 200  # on a terminal: ~12 µs a line in prints of 100-1,000, 21 µs at 10,000


class _Running:
    """A phase's spinner text, with its time once long enough to wonder (a large pull)."""

    def __init__(self, title: str) -> None:
        self.title, self.started = title, time.monotonic()

    def __rich__(self) -> Text:
        ran = int(time.monotonic() - self.started)
        return Text(f"{self.title} ... {ran // 60}m{ran % 60:02d}s" if ran >= 10 else
                    f"{self.title} ...")


class RichReporter:
    """The lifecycle's reporter on a terminal: a spinner while a phase runs, then ✓ or ✗ with
    the time the lifecycle measured. Node lines are gathered for ``LINES_EVERY_S`` and printed
    together: a print of rich's costs ~50 µs whatever it holds, so a job printing thousands of
    lines a second held its run up for minutes after it ended (2 × 1,000,000 lines: 192 s,
    152 CPU-seconds of the controller's). Everything else printed first prints them."""

    def __init__(self, console: Console) -> None:
        self.console = console
        self._spinner: Status | None = None
        self._lines: list[tuple[str, str]] = []
        self._waiting = threading.Condition()
        self._printer: threading.Thread | None = None
        atexit.register(self._flush_at_exit)

    def phase_started(self, title: str) -> None:
        self.flush_lines()
        self._spinner = self.console.status(_Running(title))
        self._spinner.start()

    def phase_ended(self, title: str, seconds: float, ok: bool) -> None:
        self.flush_lines()
        if self._spinner is not None:
            self._spinner.stop()
            self._spinner = None
        self.console.print(f"{'[green]✓' if ok else '[red]✗'}[/] {title} ({seconds:.1f}s)")

    def node_line(self, node: str, line: str) -> None:
        with self._waiting:
            self._lines.append((node, line))
            if self._printer is None:
                self._printer = threading.Thread(target=self._print_lines, daemon=True,
                                                 name="sortie-node-lines")
                self._printer.start()
            self._waiting.notify()

    def _print_lines(self) -> None:
        while True:
            with self._waiting:
                self._waiting.wait_for(lambda: bool(self._lines))
            time.sleep(LINES_EVERY_S)  # the lines that come meanwhile go with them
            self.flush_lines()

    def flush_lines(self) -> None:
        """Print the node lines waiting, in the order they came."""
        with self._waiting:
            lines, self._lines = self._lines, []
            if not lines:
                return
            # Node output is text, not markup: gloo's errors contain "[/path/pair.cc:537]".
            if not self.console.is_terminal:  # a pipe, a file: plain, at ~4 µs a line
                self.console.out("\n".join(f"{node} | {terminal_safe(line)}"
                                            for node, line in lines), highlight=False)
                return
            for first in range(0, len(lines), LINES_A_PRINT):  # (rich: slower a line beyond)
                text = Text()
                for at, (node, line) in enumerate(lines[first:first + LINES_A_PRINT]):
                    text.append(f"{chr(10) if at else ''}{node}", style="cyan")
                    text.append(f" | {terminal_safe(line)}")
                self.console.print(text, highlight=False, soft_wrap=True)

    def _flush_at_exit(self) -> None:
        """A command that ended with lines still gathered prints them (where it still can)."""
        with contextlib.suppress(OSError, ValueError):  # a closed pipe, a closed file
            self.flush_lines()

    def note(self, text: str) -> None:
        self.flush_lines()
        self.console.print(f"[yellow]![/] {escape(text)}")

    def info(self, text: str) -> None:
        """A routine line: no warning mark (`!` is kept for warnings)."""
        self.flush_lines()
        self.console.print(f"[dim]·[/] {escape(text)}")
