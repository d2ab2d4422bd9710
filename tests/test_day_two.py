"""Day two for a researcher (issue 47): what the terminal says, read as a user reads it."""

from __future__ import annotations

import io
from pathlib import Path

import pytest
from rich.console import Console

from sortie.cli import app as cli
from sortie.cli.reporter import RichReporter
from sortie.engine.task import load_task

pytestmark = pytest.mark.unit


def test_routine_lines_carry_no_warning_mark():
    """Before: "! health … healthy", "! workdir unchanged", "! setup cached"."""
    text = io.StringIO()
    reporter = RichReporter(Console(file=text, width=120, emoji=False))
    reporter.info("health (quick): 2 nodes healthy")
    reporter.note("health: bus bandwidth under half the figure expected")
    first, second = text.getvalue().splitlines()
    assert first == "· health (quick): 2 nodes healthy"
    assert second.startswith("! health: bus bandwidth")


@pytest.mark.parametrize("terminal", [False, True])
def test_node_lines_come_in_order_before_what_follows_and_alone_soon(terminal: bool):
    """Node lines are printed in batches (before: a rich print each, ~50 µs: a job printing 2
    × 1,000,000 lines held its run up 192 s after it ended). Still in order, before any
    later line of sortie's, as text (never markup or escapes), and a last one soon."""
    import time

    text = io.StringIO()
    reporter = RichReporter(Console(file=text, width=400, emoji=False, force_terminal=terminal,
                                    color_system=None))
    for i in range(1000):
        reporter.node_line(f"node-{i % 2}", f"line {i}")
    reporter.note("after them")
    reporter.node_line("node-1", "[/] gloo [/a.cc:1] \x1b[2Jalone")
    deadline = time.monotonic() + 30  # the printer's next batch, not the test's clock
    while "alone" not in text.getvalue() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert text.getvalue().splitlines() == [f"node-{i % 2} | line {i}" for i in range(1000)] + [
        "! after them", "node-1 | [/] gloo [/a.cc:1] alone"]


def test_a_long_phase_shows_how_long_it_has_run():
    """Before: a 10-minute image pull was a spinner and a title, nothing that moved."""
    from sortie.cli.reporter import _Running

    running = _Running("Pulling img on 2 nodes")
    assert str(running.__rich__()) == "Pulling img on 2 nodes ..."  # a short one: no clock
    running.started -= 135
    assert str(running.__rich__()) == "Pulling img on 2 nodes ... 2m15s"


def test_numbers_and_booleans_in_args_are_their_yaml_text(tmp_path: Path):
    """Before: `args: [--epochs, 2]` was refused ("args.1: Input should be a valid string")."""
    (tmp_path / "train.py").write_text("print(1)\n")
    task_file = tmp_path / "t.yaml"
    task_file.write_text("workdir: .\nscript: train.py\nargs: [--epochs, 2, --lr, 0.5, "
                         "--fast, true]\n")
    assert load_task(task_file).args == ("--epochs", "2", "--lr", "0.5", "--fast", "true")


def test_data_is_printed_as_it_is_never_as_emoji(capsys: pytest.CaptureFixture[str]):
    """Before: `sortie plan --stack aws-p4d` drew an ARN's `:secret:` as an emoji."""
    assert cli.main(["plan", "--stack", "aws-p4d"]) == 0
    out = capsys.readouterr().out
    assert ":secret:" in out and "\u3299" not in out  # the emoji rich drew for it


def test_counts_are_said_in_grammar():
    """Before: "total: $0.72 (1 sorties)" and "root $72.00/h (1 sorties, 2 nodes)"."""
    from sortie.cli.render import counted

    assert (counted(1, "sortie"), counted(2, "sortie"), counted(1_000, "node")) == (
        "1 sortie", "2 sorties", "1,000 nodes")


def test_package_lists_are_read_as_checked_lines_and_compared_by_name():
    from sortie.bootstrap.job_packages import changes, parse_packages

    node_said = ("numpy==1.26.4\nTorch==2.13.0+cpu\n$(rm -rf /)==1\nrich==13.7.1\n"
                 "no version\n" + "x" * 300 + "==1\n")
    assert parse_packages(node_said) == ["numpy==1.26.4", "rich==13.7.1", "Torch==2.13.0+cpu"]
    assert changes(["numpy==1.26.4", "rich==13.7.1", "typing_extensions==4.1"],
                   ["numpy==2.1.0", "tqdm==4.66.1", "typing-extensions==4.1"]) == [
        "numpy 1.26.4 -> 2.1.0", "-rich 13.7.1", "+tqdm 4.66.1"]
