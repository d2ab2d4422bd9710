"""A dead controller never loses its run, through the real CLI on real local nodes: `reap` leaves
a sortie that still trains alone and adopts it once it is done or hung (collected, verified, torn
down); `watch` takes a running sortie over; kept buckets and damaged state are left alone."""

from __future__ import annotations

import json
import signal
import socket
import time
from pathlib import Path

import psutil
import pytest

from sortie.bootstrap.node_layout import run_dir
from sortie.stacks.local.local_backend import LocalBackend
from sortie.stacks.records import Controller
from tests.helpers import (
    assert_nothing_left,
    dead_pid,
    exit_code,
    follow_until,
    loopback_listeners,
    needs_sshd,
    processes_mentioning,
    reached_step,
    sortie,
    start_run,
    start_sortie,
    wait_until,
)

pytestmark = [pytest.mark.e2e, needs_sshd]


def orphan(tmp_path: Path, name: str, steps: int, at_step: int, *trainer_flags: str) -> list[str]:
    """`sortie run` SIGKILLed mid-training: the job goes on, detached, with no controller."""
    proc = start_run(tmp_path, "--nodes", "2", "-p", "1", "--steps", str(steps), "--name", name,
                     "--ckpt-every", "10", "--", "--log-every", "5", *trainer_flags)
    seen: list[str] = []
    follow_until(proc, seen, reached_step(at_step))
    proc.kill()
    proc.wait(10)
    return seen


def wait_for_exit_codes(backend: LocalBackend, name: str, timeout: float = 180) -> None:
    """Until every node's torchrun has recorded its exit code (the job ended on its own)."""
    inventory = backend.inventory(name)
    wait_until(lambda: all((Path(run_dir(n, name)) / "exit_code").is_file()
                           for n in inventory.nodes), timeout, "the orphaned job never finished")


def cmdline(process: psutil.Process) -> str:
    """A process's command line; "" for one that ended since it was listed (the watchers of a
    controller that is gone end on their own)."""
    try:
        return " ".join(process.cmdline())
    except psutil.Error:
        return ""


def test_reap_leaves_a_training_orphan_running_then_collects_it(sortie_home: Path,
                                                                tmp_path: Path):
    """Before: reap tore the cluster down while it trained; nothing collected, `runs/` empty."""
    before = loopback_listeners()
    # Paced (at least 10 s in all), so that it is still training when paused below; 600
    # unpaced steps did as much, for 20 CPU-seconds of training more.
    orphan(tmp_path, "adopt", 200, 10, "--min-step-s", "0.05")
    backend = LocalBackend(sortie_home)
    assert backend.processes("adopt"), "the nodes outlive their controller"
    # Paused, not ended, until reap has looked: on a loaded machine the CLI calls below may take
    # longer than its steps. Still "training" to reap: its output is minutes, not 30, old.
    trainers = [p for p in backend.processes("adopt") if "trainer" in cmdline(p)]
    assert trainers
    for process in trainers:
        process.send_signal(signal.SIGSTOP)
    logs = sortie("logs", "adopt", "node-0", cwd=tmp_path)
    assert logs.returncode == 0 and "node-0 | " in logs.stdout and "step" in logs.stdout
    [row] = json.loads(sortie("status", "--json", cwd=tmp_path).stdout)["sorties"]
    assert (row["name"], row["state"]) == ("adopt", "orphaned")
    dry = sortie("reap", "--dry-run", cwd=tmp_path)
    assert dry.stdout.strip() == ("adopt: orphaned, would be adopted: collected if its job "
                                  "ended or hung, then torn down")

    running = sortie("reap", cwd=tmp_path)
    assert running.returncode == 0, running.stderr
    assert running.stdout.startswith("adopt: its controller is gone but it still trains"), \
        running.stdout
    assert "left running" in running.stdout and backend.processes("adopt"), "it still trains"
    # Fourth review (issue 61): no node answering SSH within 10 s (here: each sshd stopped,
    # its port still open) was taken for "its nodes are gone", and a training job destroyed.
    daemons = [psutil.Process(int(p.read_text()))
               for p in backend.state_dir("adopt").glob("nodes/*/sshd.pid")]
    for daemon in daemons:
        daemon.send_signal(signal.SIGSTOP)
    try:
        unanswered = sortie("reap", cwd=tmp_path)
    finally:
        for daemon in daemons:
            daemon.send_signal(signal.SIGCONT)
    assert unanswered.returncode == 0, unanswered.stderr
    assert " ".join(unanswered.stdout.split()).startswith(
        "adopt: its controller is gone and no node answers SSH from here within 10s, but "
        "node-0, node-1 still there, says its backend: left as it is"), unanswered.stdout
    assert all(p.is_running() for p in trainers), "it still trains"

    for process in trainers:
        process.send_signal(signal.SIGCONT)
    wait_for_exit_codes(backend, "adopt")
    done = sortie("reap", "--json", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    [item] = json.loads(done.stdout)
    assert item["action"] == "torn down" and item["teardown"]["clean"], item
    assert item["line"].startswith("adopt: adopted (its job ended); collected ")
    run = tmp_path / "runs" / "adopt"
    assert item["artifacts"] == str(run.resolve()) and item["collect_error"] is None
    assert json.loads((run / "artifacts" / "summary.json").read_text())["steps"] == 200
    manifest = json.loads((run / "manifest.json").read_text())
    assert {"artifacts/summary.json", "artifacts/metrics.jsonl", "logs/node-0.log",
            "logs/node-1.log"} <= \
        {entry["path"] for entry in manifest["files"]}
    assert_nothing_left(sortie_home, before)


def test_reap_stops_a_hung_orphan_collects_it_and_tears_it_down(sortie_home: Path,
                                                                tmp_path: Path):
    before = loopback_listeners()
    orphan(tmp_path, "hung", steps=100000, at_step=10)
    backend = LocalBackend(sortie_home)
    trainers = [p for p in backend.processes("hung") if "trainer" in cmdline(p)]
    assert trainers
    for process in trainers:  # hung: alive, and silent
        process.send_signal(signal.SIGSTOP)
    time.sleep(3)
    reaped = sortie("reap", "--hang-timeout", "2s", cwd=tmp_path)
    assert reaped.returncode == 0, reaped.stdout + reaped.stderr
    assert reaped.stdout.startswith("hung: adopted (no output for "), reaped.stdout
    assert "0 resources remain" in reaped.stdout
    run = tmp_path / "runs" / "hung"
    checkpoints = sorted((run / "checkpoints").iterdir())
    assert checkpoints and (checkpoints[-1] / "state.pt").is_file(), "the newest checkpoint"
    assert (run / "logs" / "node-0.log").is_file()
    assert_nothing_left(sortie_home, before)


def test_watch_takes_over_a_running_sortie(sortie_home: Path, tmp_path: Path):
    """The laptop went to sleep: a new controller streams, waits, collects and tears down."""
    before = loopback_listeners()
    orphan(tmp_path, "sleepy", steps=80, at_step=10)
    watched = start_sortie(tmp_path, "watch", "sleepy")
    seen: list[str] = []
    follow_until(watched, seen, lambda line: "Taking over" in line)
    assert exit_code(watched, seen, 180) == 0, "".join(seen)[-3000:]
    output = "".join(seen)
    assert "node-0 | " in output and "0 resources remain" in output
    summary = json.loads((tmp_path / "runs" / "sleepy" / "artifacts" / "summary.json").read_text())
    assert summary["steps"] == 80
    assert_nothing_left(sortie_home, before)


def test_watch_refuses_a_sortie_whose_controller_lives(sortie_home: Path, tmp_path: Path):
    up = sortie("up", "--nodes", "1", "--name", "held", cwd=tmp_path)
    assert up.returncode == 0, up.stderr
    refused = sortie("watch", "held", cwd=tmp_path)
    assert refused.returncode == 2
    assert refused.stderr.strip() == ("sortie: error: NAME: sortie 'held' is up: only a sortie "
                                      "whose controller is gone can be taken over")
    assert sortie("down", "held", cwd=tmp_path).returncode == 0


def test_kept_buckets_and_damaged_state_are_shown_and_left_alone(sortie_home: Path,
                                                                  tmp_path: Path):
    """Before: a damaged state file made `status` crash with a traceback."""
    failed = sortie("run", "--nodes", "1", "-p", "1", "--steps", "5", "--name", "kept",
                    "--max-artifacts", "1K", cwd=tmp_path)
    assert failed.returncode == 1 and (sortie_home / "kept" / "kept").is_dir()
    damaged = sortie_home / "clusters" / "damaged"
    damaged.mkdir(parents=True)
    (damaged / "inventory.json").write_text('{"cluster_id": "damaged", ')
    cloud = sortie_home / "stacks" / "torn"
    cloud.mkdir(parents=True)
    (cloud / "sortie.json").write_bytes(b"\xff\xfe not json")
    LocalBackend(sortie_home).up("dead", 1)  # a cluster whose controller then died:
    (sortie_home / "clusters" / "dead" / "controller.json").write_text(Controller(
        host=socket.gethostname(), pid=dead_pid(), started=0.0,
        heartbeat=time.time()).model_dump_json())

    status = sortie("status", cwd=tmp_path)
    assert status.returncode == 0 and "Traceback" not in status.stderr, status.stderr
    rows = {row["name"]: row for row in json.loads(sortie("status", "--json",
                                                          cwd=tmp_path).stdout)["sorties"]}
    assert rows["kept"]["state"] == "kept" and str(sortie_home / "kept" / "kept") in \
        rows["kept"]["detail"]
    assert rows["damaged"]["state"] == rows["torn"]["state"] == "broken"
    assert "damaged, not JSON" in rows["damaged"]["detail"]
    assert "torn" in rows["torn"]["detail"] and rows["dead"]["state"] == "orphaned"

    reaped = sortie("reap", cwd=tmp_path)
    assert reaped.returncode == 1 and "Traceback" not in reaped.stderr
    lines = reaped.stdout.strip().splitlines()
    assert any(line.startswith("dead: nothing was trained on it; dead: removed") for line in
               lines), lines
    assert sum("not reaped" in line for line in lines) == 2, lines
    assert reaped.stderr.strip() == ("sortie: error: reap could not end damaged, torn "
                                     "(see above)")
    assert (sortie_home / "kept" / "kept").is_dir(), "reap never touches a kept bucket"
    unasked = sortie("down", "--all", cwd=tmp_path)  # no terminal to ask on: refused
    assert unasked.returncode == 2 and unasked.stderr.strip() == (
        "sortie: error: --all ends 2 sorties: damaged, torn: add --yes to confirm (no terminal "
        "to ask on)") and damaged.exists()
    everything = sortie("down", "--all", "--yes", cwd=tmp_path)
    assert (sortie_home / "kept" / "kept").is_dir(), "--all leaves kept buckets"
    assert not damaged.exists() and everything.returncode == 1  # `torn` has no stack to read
    named = sortie("down", "kept", cwd=tmp_path)
    assert named.returncode == 0 and not (sortie_home / "kept" / "kept").exists()
    assert processes_mentioning(sortie_home) == []


@pytest.fixture(autouse=True)
def _no_stopped_processes(tmp_path: Path):
    """A SIGSTOPped trainer of this test never outlives it (teardown SIGKILLs, but be sure).
    Only this test's: another test run's stopped process is not ours to resume."""
    yield
    marker = f"{tmp_path}/"
    for process in psutil.process_iter(["cmdline", "cwd", "status"]):
        cmdline = " ".join(process.info["cmdline"] or [])
        mine = marker in cmdline or f"{process.info['cwd'] or ''}/".startswith(marker)
        try:
            if mine and process.info["status"] == psutil.STATUS_STOPPED:
                process.send_signal(signal.SIGCONT)
        except psutil.Error:
            continue
