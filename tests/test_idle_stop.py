"""Idle stop: a held local cluster tears itself down, with no controller, once nothing has run
on it for the idle limit; a job that runs longer than the limit is not cut short."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from sortie.bootstrap.prepare import prepare
from sortie.stacks.local.local_backend import LocalBackend
from tests.helpers import (
    assert_nothing_left,
    exit_code,
    follow_until,
    needs_sshd,
    processes_mentioning,
    reached_step,
    sortie,
    start_sortie,
    wait_until,
)

pytestmark = [pytest.mark.e2e, needs_sshd]


def wait_torn_down(state: Path, sortie_home: Path, since: float, what: str) -> None:
    """Until the cluster tore itself down (its state gone) and its watchdog, having said what
    it did, is gone too; within a minute of ``since`` (a deadline, never a fixed sleep)."""
    while state.is_dir():
        assert time.monotonic() - since < 60, f"still up a minute {what}"
        time.sleep(0.2)
    while processes_mentioning(sortie_home):
        assert time.monotonic() - since < 70, processes_mentioning(sortie_home)
        time.sleep(0.2)
    assert_nothing_left(sortie_home)


def test_a_held_cluster_idle_past_its_limit_tears_itself_down(sortie_home: Path,
                                                              tmp_path: Path):
    up = sortie("up", "--nodes", "2", "--name", "idle", "--idle-stop", "5s", cwd=tmp_path)
    assert up.returncode == 0, up.stderr
    backend = LocalBackend(sortie_home)
    state = backend.state_dir("idle")
    # An open SSH session is activity: one from here holds the cluster until its job trains
    # (on a loaded machine, a new CLI process took longer than the limit to get there, and
    # found the cluster gone). Then the job alone, several times the limit, keeps it.
    with prepare(backend.inventory("idle")) as conns:
        assert len(conns) == 2
        job = start_sortie(tmp_path, "run", "--on", "idle", "-p", "1", "--steps", "200",
                           "--health", "off")
        seen: list[str] = []
        reader = follow_until(job, seen, reached_step(1), timeout=120)
    assert exit_code(job, seen, 300) == 0, "".join(seen)[-2000:]
    reader.join(10)
    ended = time.monotonic()
    assert state.is_dir(), "torn down while a job ran"
    wait_torn_down(state, sortie_home, ended, "after its job ended")


def test_a_held_cluster_with_a_budget_ends_itself_when_it_is_spent(sortie_home: Path,
                                                                   tmp_path: Path):
    # Two nodes at $1 a second: $14 is spent 7 s after the start; the cluster stops 3 s
    # early (its teardown's own time) and leaves a cost line.
    priced = {"SORTIE_LOCAL_USD_PER_HOUR": "3600"}
    up = sortie("up", "--nodes", "2", "--name", "capped", "--max-cost", "14", cwd=tmp_path,
                env=priced)
    assert up.returncode == 0, up.stderr
    started, state = time.monotonic(), LocalBackend(sortie_home).state_dir("capped")
    wait_torn_down(state, sortie_home, started, "later")
    line = json.loads(sortie("costs", "--json", cwd=tmp_path).stdout)["entries"]
    assert [(e["name"], e["kind"]) for e in line] == [("capped", "held")]
    # Torn down 4 s after its watchdog started ($14 at $2 a second, less 3 s of teardown; more
    # of it on a busy machine, but never less than a second).
    assert 1 - 0.5 <= line[0]["ended"] - line[0]["started"] < 30
    assert line[0]["cost"] <= 14 + 2 * 3


def test_a_dead_watchdog_is_said_by_status_and_restarted_by_reap(sortie_home: Path,
                                                                 tmp_path: Path):
    """Third review: after `kill -9` of a held cluster's watchdog, `status` showed it `up`,
    and neither its idle stop nor its budget was enforced."""
    import psutil

    from sortie.stacks.machine.held_limits import WATCHDOG_FILE
    from sortie.stacks.records import Controller

    up = sortie("up", "--nodes", "1", "--name", "dog", "--idle-stop", "6s", cwd=tmp_path)
    assert up.returncode == 0, up.stderr
    # Issue 47: the idle stop is said by `up` and shown by `status` (before: by neither).
    assert "with nothing running for 0m06s it ends itself (idle stop)" in up.stdout, up.stdout
    [row] = json.loads(sortie("status", "--json", cwd=tmp_path).stdout)["sorties"]
    assert row["idle_stop_s"] == 6 and row["detail"] == "held: ends itself with idle stop (6s)"
    backend = LocalBackend(sortie_home)
    state = backend.state_dir("dog")
    wait_until((state / WATCHDOG_FILE).exists, 30, "the watchdog never recorded itself",
               pause=0.1)
    watchdog = Controller.model_validate_json((state / WATCHDOG_FILE).read_text())
    psutil.Process(watchdog.pid).kill()
    [row] = json.loads(sortie("status", "--json", cwd=tmp_path).stdout)["sorties"]
    assert row["unwatched"] is True and "its watchdog is gone" in row["detail"], row
    assert "idle stop (6s)" in row["detail"] and "sortie reap" in row["detail"]
    assert state.is_dir(), "nothing enforces the idle stop now"
    reaped = sortie("reap", cwd=tmp_path)
    assert reaped.returncode == 0, reaped.stdout + reaped.stderr
    assert "dog: its watchdog was gone: restarted" in reaped.stdout, reaped.stdout
    # the new watchdog holds the idle stop
    wait_torn_down(state, sortie_home, time.monotonic(), "after the restart")
