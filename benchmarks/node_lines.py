"""A job that prints much: what the controller's printing of the nodes' lines costs.

Side by side, in one run, interleaved round by round (machines are noisy: the ratio holds):

- in this process, 20,000 node lines through the `RichReporter` (batched), against the same
  lines printed one rich print each (how it printed them before), to a pipe and to a terminal;
- end to end, `sortie run --run 'seq 1 N'` on 2 local nodes (2 × N lines) against
  `sortie run --run true`: how long the run took beyond a job that prints nothing;
- a command streaming 100,000 lines of 60 bytes (a chatty job's log, as `watch` follows it)
  through Invoke's own runner, which joins all it read so far on every read, against sortie's
  (`bootstrap/transport.StreamingLocal`, as the SSH one: nothing joined, its capture bounded).

Prints RESULT node_line_us_pipe=, node_line_us_terminal=, node_line_us_one_print_each= (µs a
line), node_lines_speedup= (one print each over batched, terminal) and
node_lines_run_overhead_s= (the 2 × 200,000-line run's seconds beyond the silent one's;
before the batches, 2 × 1,000,000 lines took 192 s, 23 s after), streamed_runner_s= and
invoke_runner_s= (the 100,000 lines' seconds through each) and streamed_runner_speedup=.

    .venv/bin/python benchmarks/node_lines.py [--lines 200000] [--rounds 3]
"""

from __future__ import annotations

import argparse
import io
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from invoke import Config, Context  # noqa: E402
from invoke.runners import Local  # noqa: E402
from rich.console import Console  # noqa: E402

from sortie.bootstrap.follow import LineWriter  # noqa: E402
from sortie.bootstrap.srun import StreamingLocal  # noqa: E402
from sortie.cli.render import escape, terminal_safe  # noqa: E402
from sortie.cli.reporter import RichReporter  # noqa: E402

IN_PROCESS_LINES = 20_000
REPO = Path(__file__).resolve().parents[1]


def console(terminal: bool) -> Console:
    return Console(file=io.StringIO(), width=400, emoji=False, highlight=False,
                   force_terminal=terminal, color_system="truecolor" if terminal else None)


def batched_us(terminal: bool) -> float:
    reporter = RichReporter(console(terminal))
    started = time.perf_counter()
    for i in range(IN_PROCESS_LINES):
        reporter.node_line(f"node-{i % 2}", f"step {i}/20000 loss 0.{i:05d}")
    reporter.flush_lines()
    return (time.perf_counter() - started) / IN_PROCESS_LINES * 1e6


def one_print_each_us() -> float:
    """The reporter's way before the batches: a rich print with markup per line."""
    out = console(True)
    started = time.perf_counter()
    for i in range(IN_PROCESS_LINES):
        out.print(f"[cyan]node-{i % 2}[/] | {escape(terminal_safe(f'step {i}/20000 loss'))}",
                  markup=True, highlight=False, soft_wrap=True)
    return (time.perf_counter() - started) / IN_PROCESS_LINES * 1e6


STREAMED_LINES = 100_000


def streamed_s(runner: type[Local]) -> float:
    """Seconds to stream STREAMED_LINES lines of a command through ``runner`` into a
    `LineWriter` (what `watch` hands the reporter), every line counted."""
    counted = [0]
    writer = LineWriter("node-0", lambda node, line: counted.__setitem__(0, counted[0] + 1))
    context = Context(Config(overrides={"runners": {"local": runner},
                                        "run": {"in_stream": False}}))
    started = time.perf_counter()
    context.run(f"seq -f 'step %.0f/{STREAMED_LINES} loss 0.123456 lr 0.000300 tokens/s 1234' "
                f"1 {STREAMED_LINES}", hide=False, out_stream=writer, err_stream=writer)
    writer.close()
    if counted[0] != STREAMED_LINES:
        sys.exit(f"{runner.__name__} streamed {counted[0]} lines of {STREAMED_LINES}")
    return time.perf_counter() - started


def run_s(command: str, home: Path, cwd: Path, name: str) -> float:
    started = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "sortie", "run", "--run", command, "--nodes",
                           "2", "--name", name], cwd=cwd, env={**os.environ,
                                                               "SORTIE_HOME": str(home)},
                          stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    if done.returncode != 0:
        sys.exit(f"sortie run --run {command!r} failed: {done.stderr[-2000:]}")
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--lines", type=int, default=200_000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    pipe, terminal, each, overhead, streamed, invoked = [], [], [], [], [], []
    with tempfile.TemporaryDirectory(prefix="sortie-node-lines-") as tmp:
        home, cwd = Path(tmp, "home"), Path(tmp, "work")
        cwd.mkdir()
        for round_ in range(args.rounds):
            pipe.append(batched_us(False))
            terminal.append(batched_us(True))
            each.append(one_print_each_us())
            silent = run_s("true", home, cwd, f"silent-{round_}")
            loud = run_s(f"seq 1 {args.lines}", home, cwd, f"loud-{round_}")
            overhead.append(loud - silent)
            streamed.append(streamed_s(StreamingLocal))
            invoked.append(streamed_s(Local))
            print(f"round {round_ + 1}: pipe {pipe[-1]:.1f} µs, terminal {terminal[-1]:.1f} µs, "
                  f"one print each {each[-1]:.1f} µs; run {loud:.1f} s against {silent:.1f} s; "
                  f"streamed {streamed[-1]:.2f} s against Invoke's {invoked[-1]:.2f} s",
                  flush=True)
    median = statistics.median
    print(f"RESULT node_line_us_pipe={median(pipe):.1f}")
    print(f"RESULT node_line_us_terminal={median(terminal):.1f}")
    print(f"RESULT node_line_us_one_print_each={median(each):.1f}")
    print(f"RESULT node_lines_speedup={median(each) / median(terminal):.1f}")
    print(f"RESULT node_lines_run_overhead_s={median(overhead):.1f}")
    print(f"RESULT streamed_runner_s={median(streamed):.2f}")
    print(f"RESULT invoke_runner_s={median(invoked):.2f}")
    print(f"RESULT streamed_runner_speedup={median(invoked) / median(streamed):.1f}")


if __name__ == "__main__":
    main()
