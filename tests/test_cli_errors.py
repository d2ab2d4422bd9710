"""Bad input ends in one line on stderr and exit code 2, with nothing started."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO, sortie

pytestmark = pytest.mark.e2e

@pytest.mark.parametrize(
    ("args", "field"),
    [
        (["run", "--nodes", "0"], "--nodes"),
        (["run", "--nodes", "abc"], "--nodes"),
        (["run", "--cloud", "mars"], "--cloud"),
        (["run", "--procs-per-node", "-1"], "--procs-per-node"),
        (["run", "--steps", "0"], "--steps"),
        (["run", "--name", "Bad_Name!"], "--name"),
        (["run", "--cloud", "aws"], "--cloud"),
        (["up", "--nodes", "0"], "--nodes"),
        (["up", "--name", "Bad_Name!"], "--name"),
        (["up", "--set", "zone=a"], "--set"),
        (["up", "--stack", "aws-p3-dev", "--cloud", "gcp"], "--cloud"),
        (["up", "--stack", "no-such-profile"], "no-such-profile"),
        (["down"], "NAME"),
        (["run", "--set", "zone=a"], "--set"),
        (["ssh", "scratch"], "NODE"),
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
    assert json.loads(result.stdout) == {"sorties": [], "owners": [], "usd_per_hour": 0.0}


@pytest.mark.parametrize("args", [["--steps", "0"], ["--lr", "abc"], ["--bogus"],
                                  ["--data-dir", "/nonexistent"], ["--model", "cnn"],
                                  ["--d-model", "64", "--n-heads", "5"]])
def test_trainer_bad_flags_one_line(args):
    result = subprocess.run([sys.executable, "-m", "trainer", *args], cwd=REPO,
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 2
    errors = [line for line in result.stderr.splitlines() if line.startswith("trainer: error:")]
    assert len(errors) == 1 and "Traceback" not in result.stderr
