"""Idle stop: a held local cluster tears itself down, with no controller, once nothing has run
on it for the idle limit; a job that runs longer than the limit is not cut short."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from stacks.local import LocalBackend
from tests.helpers import assert_nothing_left, needs_sshd, processes_mentioning, sortie

pytestmark = [pytest.mark.e2e, needs_sshd]


def test_a_held_cluster_idle_past_its_limit_tears_itself_down(sortie_home: Path,
                                                              tmp_path: Path):
    up = sortie("up", "--nodes", "2", "--name", "idle", "--idle-stop", "4s", cwd=tmp_path)
    assert up.returncode == 0, up.stderr
    state = LocalBackend(sortie_home).state_dir("idle")
    # A job of several times the limit runs to its end: running is not idle.
    ran = sortie("run", "--on", "idle", "--steps", "150", "--health", "off", cwd=tmp_path)
    assert ran.returncode == 0, ran.stderr[-2000:]
    ended = time.monotonic()
    assert state.is_dir(), "torn down while a job ran"
    while state.is_dir():
        assert time.monotonic() - ended < 60, "still up a minute after its job ended"
        time.sleep(0.5)
    assert time.monotonic() - ended >= 4 - 1, "torn down before the limit"
    while processes_mentioning(sortie_home):  # the watchdog, saying what it did, then gone
        assert time.monotonic() - ended < 70, processes_mentioning(sortie_home)
        time.sleep(0.2)
    assert_nothing_left(sortie_home)
