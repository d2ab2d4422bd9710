"""Bad input ends in one line on stderr and exit code 2, with nothing started."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import REPO, sortie, wait_until

pytestmark = pytest.mark.e2e

@pytest.mark.parametrize(
    ("args", "field"),
    [
        (["run", "--nodes", "0"], "--nodes"),
        (["run", "--nodes", "abc"], "--nodes"),
        (["run", "--procs-per-node", "-1"], "--procs-per-node"),
        (["run", "--steps", "0"], "--steps"),
        (["run", "--name", "Bad_Name!"], "--name"),
        (["run", "--cloud", "aws"], "--cloud"),  # gone: a stack profile names its cloud
        (["up", "--nodes", "0"], "--nodes"),
        (["up", "--name", "Bad_Name!"], "--name"),
        (["up", "--set", "zone=a"], "--set"),
        (["up", "--stack", "no-such-profile"], "no-such-profile"),
        (["down"], "NAME"),
        (["run", "--set", "zone=a"], "--set"),
        (["ssh", "scratch"], "NAME"),  # (no NODE: the head node)
        (["ssh", "scratch", "-A"], "-A"),
        (["run", "--no-such-flag"], "--no-such-flag"),
    ],
)
def test_bad_flags_one_line_exit_2_nothing_started(args, field, sortie_home: Path, tmp_path):
    result = sortie(*args, cwd=tmp_path)
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("sortie: error:") and field in lines[0]
    assert "Traceback" not in result.stderr
    assert not sortie_home.exists(), "a cluster was started despite bad input"
    assert not (tmp_path / "runs").exists()


def test_unknown_cluster_is_one_line_error(sortie_home: Path, tmp_path: Path):
    result = sortie("ssh", "nope", "node-0", cwd=tmp_path)
    assert result.returncode == 2
    assert result.stderr.strip() == (
        "sortie: error: NAME: no sortie named 'nope' (see `sortie status`)")
    logs = sortie("logs", "nope", cwd=tmp_path)
    assert logs.returncode == 2 and logs.stderr.startswith("sortie: error: NAME: no running")


def test_help_explains_commands(tmp_path: Path):
    result = sortie("--help", cwd=tmp_path)
    assert result.returncode == 0
    for command in ("run", "up", "status", "down", "ssh", "logs", "reap", "plan"):
        assert command in result.stdout
    run_help = sortie("run", "--help", cwd=tmp_path).stdout
    assert "--procs-per-node" in run_help and "Teardown always runs" in " ".join(run_help.split())


def test_status_with_no_clusters(sortie_home: Path, tmp_path: Path):
    result = sortie("status", "--json", cwd=tmp_path)
    assert result.returncode == 0
    assert json.loads(result.stdout) == {"sorties": [], "owners": [], "usd_per_hour": 0.0,
                                         "budgets": []}


@pytest.mark.parametrize("args", [["--steps", "0"], ["--lr", "abc"], ["--bogus"],
                                  ["--data-dir", "/nonexistent"], ["--model", "cnn"],
                                  ["--d-model", "64", "--n-heads", "5"]])
def test_trainer_bad_flags_one_line(args):
    result = subprocess.run([sys.executable, "-m", "trainer", *args], cwd=REPO,
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 2
    errors = [line for line in result.stderr.splitlines() if line.startswith("trainer: error:")]
    assert len(errors) == 1 and "Traceback" not in result.stderr


def test_report_renders_an_earlier_run_and_opens_it_where_there_is_a_browser(tmp_path: Path):
    """`sortie report RUN`: by id from --runs-dir or by path; --open hands the page to the
    desktop's browser ($BROWSER here), and says so where there is none."""
    from tests.test_report import a_run

    run_dir = a_run(tmp_path)  # tmp_path/runs/r1, as a sortie left it (no report.html yet)
    opened = tmp_path / "opened"
    browser = tmp_path / "browser"
    browser.write_text(f'#!/bin/sh\necho "$1" > {opened}\n')
    browser.chmod(0o755)
    result = sortie("report", "r1", "--open", cwd=tmp_path, env={"BROWSER": f"{browser} %s"})
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "runs/r1/report.html"
    assert (run_dir / "report.html").stat().st_size > 10_000
    wait_until(opened.exists, 10, "the browser never opened it", pause=0.1)  # (on its own)
    assert opened.read_text().strip() == (run_dir / "report.html").resolve().as_uri()

    none = sortie("report", str(run_dir), "--open", "--json", cwd=tmp_path,
                  env={"BROWSER": "/nonexistent/browser %s"})
    assert none.returncode == 0, none.stderr
    assert json.loads(none.stdout) == {"report": str(run_dir / "report.html"), "opened": False}

    missing = sortie("report", "r2", cwd=tmp_path)
    assert missing.returncode == 2
    assert missing.stderr.strip() == ("sortie: error: RUN: no run directory runs/r2, none in "
                                      "the run history and no directory r2 (`sortie runs` "
                                      "lists every run)")


def test_a_reader_that_goes_away_ends_the_command_quietly(sortie_home: Path, tmp_path: Path):
    """Before: `sortie logs RUN | head -1` printed a BrokenPipeError traceback, exit 1."""
    logs = tmp_path / "runs" / "r1" / "logs"
    logs.mkdir(parents=True)
    (logs / "node-0.log").write_text("".join(f"line {i}\n" for i in range(200_000)))
    piped = subprocess.run(
        ["bash", "-c", f"{sys.executable} -m sortie logs r1 | head -1; "
                       "echo \"exit ${PIPESTATUS[0]}\" >&2"],
        cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert piped.stdout == "node-0 | line 0\n"
    assert piped.stderr == "exit 141\n", piped.stderr[-2000:]
