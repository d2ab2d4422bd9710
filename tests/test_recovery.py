"""Preemption recovery, all-or-nothing launch and Ctrl-C, for real on the local backend: nodes
are real sshd daemons, a "lost" node is SIGKILLed with everything running on it, the way a cloud
reclaims a spot machine."""

from __future__ import annotations

import json
import re
import signal
import threading
import time
from pathlib import Path

import pytest

from sortie.bootstrap.node_layout import artifact_dir
from sortie.stacks.local.local_backend import LocalBackend
from sortie.trainer.metrics import STEP_PATTERN
from tests.browser import open_report_or_skip
from tests.helpers import (
    Recorder,
    assert_nothing_left,
    controller_output,
    exit_code,
    follow_until,
    loopback_listeners,
    needs_sshd,
    processes_mentioning,
    reached_step,
    sortie,
    start_run,
)

pytestmark = [pytest.mark.e2e, needs_sshd]

def test_lost_node_is_replaced_and_training_resumes(sortie_home: Path, tmp_path: Path):
    before = loopback_listeners()
    # Paced (at least 6 s in all), so that node-1 is lost mid-run: 300 unpaced steps did as
    # much, for ~8 CPU-seconds of training more.
    proc = start_run(tmp_path, "--nodes", "2", "-p", "1", "--steps", "120", "--ckpt-every",
                     "10", "--name", "rec", "--", "--log-every", "10", "--min-step-s", "0.05")
    seen: list[str] = []
    reader = follow_until(proc, seen, reached_step(30))
    old_host_key = LocalBackend(sortie_home).inventory("rec").node("node-1").host_key
    killed = LocalBackend(sortie_home).reclaim("rec", "node-1")
    assert killed, "node-1 had processes to kill"
    deadline = time.monotonic() + 180
    while not any("recovery 1:" in line for line in seen) and time.monotonic() < deadline:
        time.sleep(0.1)
    # The replacement is a new machine with a new host key, pinned before anything connects.
    new_host_key = LocalBackend(sortie_home).inventory("rec").node("node-1").host_key
    assert new_host_key != old_host_key
    assert exit_code(proc, seen, 240) == 0, "".join(seen)[-4000:]
    reader.join(10)
    output = " ".join("".join(seen).split())  # rich wraps long lines
    assert "Recovering from machine gone: replacing node-1" in output
    recovery = re.search(r"recovery 1: replaced node-1 \(machine gone\); lost at step (\d+), "
                         r"resumed from step (\d+); cost ([\d.]+)s of training", output)
    assert recovery, output[-3000:]
    lost_at, resumed_from = int(recovery.group(1)), int(recovery.group(2))
    assert lost_at >= 30 and 10 <= resumed_from <= lost_at + 10
    assert resumed_from % 10 == 0, "resumed from a checkpoint step"

    run = tmp_path / "runs" / "rec"
    assert re.search(r"│ loss\s+│ [▁▂▃▄▅▆▇█]{10,}", output), "the loss sparkline"
    assert re.search(r"│ report\s+│ \S*rec", output) and (run / "report.html").is_file()
    summary = json.loads((run / "artifacts" / "summary.json").read_text())
    assert summary["steps"] == 120 and summary["resumed_from"] == resumed_from
    metrics = [json.loads(line) for line in
               (run / "artifacts" / "metrics.jsonl").read_text().splitlines()]
    assert metrics[-1]["step"] == 120
    manifest = json.loads((run / "manifest.json").read_text())
    bucket_files = [f["path"] for f in manifest["files"] if f["node"] == "bucket"]
    assert "checkpoints/step-00000120/state.pt" in bucket_files
    assert not LocalBackend(sortie_home).state_dir("rec").exists()
    assert_nothing_left(sortie_home, before)
    # The report: the recovery on the timeline, one point per logged step.
    page = open_report_or_skip(run / "report.html", tmp_path / "recovery-report.png")
    assert not page.console_errors and not page.page_errors and not page.requests
    assert "recovery 1: replaced node-1 (machine gone)" in page.text
    assert f"resumed from step {resumed_from}" in page.text
    logged = {json.loads(line)["step"] for line in
              (run / "artifacts" / "metrics.jsonl").read_text().splitlines()
              if "loss" in json.loads(line)}
    assert page.series_points["loss"] == len(logged) == 12


def test_recoveries_are_bounded_then_a_clear_failure(sortie_home: Path, tmp_path: Path):
    before = loopback_listeners()
    proc = start_run(tmp_path, "--nodes", "2", "-p", "1", "--steps", "100000", "--ckpt-every",
                     "10", "--max-recoveries", "1", "--name", "bounded", "--",
                     "--log-every", "10")
    seen: list[str] = []
    backend = LocalBackend(sortie_home)
    follow_until(proc, seen, reached_step(20))
    backend.reclaim("bounded", "node-1")
    resumed = threading.Event()

    def watch() -> None:  # a step report after the recovery note: training runs again
        while not resumed.is_set():
            text = "".join(seen)
            after = text.split("recovery 1:", 1)
            if len(after) == 2 and STEP_PATTERN.search(after[1]):
                resumed.set()
            threading.Event().wait(0.2)

    threading.Thread(target=watch, daemon=True).start()
    assert resumed.wait(180), "".join(seen)[-3000:]
    backend.reclaim("bounded", "node-0")
    assert exit_code(proc, seen, 120) == 1, "".join(seen)[-3000:]
    output = "".join(seen)
    last = output.strip().splitlines()[-1]
    assert last.startswith("sortie: error: node-0 lost again (machine gone) after 1 "
                           "recoveries; giving up"), last
    assert "Tearing down" in output
    assert_nothing_left(sortie_home, before)


def test_launch_failing_half_way_leaves_nothing(sortie_home: Path, tmp_path: Path):
    before = loopback_listeners()
    result = sortie("run", "--nodes", "3", "--name", "half", cwd=tmp_path,
                    env={"SORTIE_LOCAL_CAPACITY": "2"})
    assert result.returncode == 1
    last = result.stderr.strip().splitlines()[-1]
    assert last == ("sortie: error: no launch attempt brought up all 3 nodes: attempt 1 "
                    "(default placement): node-2: no capacity left (SORTIE_LOCAL_CAPACITY=2)")
    assert "launch failed" in result.stdout + result.stderr
    assert not (tmp_path / "runs" / "half").exists(), "nothing trained, nothing collected"
    assert_nothing_left(sortie_home, before)


def test_ctrl_c_while_nodes_are_starting_leaves_nothing(sortie_home: Path, tmp_path: Path):
    """SIGINT as soon as the first node's sshd exists: it lands in `up` itself."""
    before = loopback_listeners()
    proc = start_run(tmp_path, "--nodes", "6", "-p", "1", "--steps", "100000", "--name", "cs")
    deadline = time.monotonic() + 120
    while not any("sshd" in p for p in processes_mentioning(sortie_home)):
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()[0]
        time.sleep(0.02)
    proc.send_signal(signal.SIGINT)
    output = proc.communicate(timeout=120)[0]
    assert proc.returncode == 130, output[-3000:]
    last = output.strip().splitlines()[-1]
    assert last.startswith("sortie: error: interrupted; cs: removed") and \
        last.endswith("0 resources remain"), output[-3000:]
    assert "Traceback" not in output
    assert_nothing_left(sortie_home, before)


@pytest.mark.parametrize("after", ["Starting 2 local nodes", "Bootstrapping nodes",
                                   "Recovering from"])
def test_ctrl_c_at_each_phase_leaves_nothing(after: str, sortie_home: Path, tmp_path: Path):
    """SIGINT just as a phase completes lands in the next: bootstrap, training, and (after a
    lost node) the relaunch of training."""
    before = loopback_listeners()
    proc = start_run(tmp_path, "--nodes", "2", "-p", "1", "--steps", "100000", "--name", "cc",
                     "--ckpt-every", "10", "--", "--log-every", "10")
    seen: list[str] = []
    reclaimed: list[list[int]] = []

    def phase_done(line: str) -> bool:  # called by the one reader thread, line by line
        if after == "Recovering from" and not reclaimed and reached_step(10)(line):
            reclaimed.append(LocalBackend(sortie_home).reclaim("cc", "node-1"))
        return after in line and "✓" in line

    follow_until(proc, seen, phase_done, timeout=180)
    proc.send_signal(signal.SIGINT)
    assert exit_code(proc, seen, 120) == 130, "".join(seen)[-3000:]
    controller = controller_output(seen)
    last = controller.strip().splitlines()[-1]
    assert re.match(r"sortie: error: interrupted; cc: removed \d+ processes; 0 resources "
                    r"remain", last), last
    assert "Traceback" not in controller, controller
    assert_nothing_left(sortie_home, before)


def test_unverified_artifacts_keep_the_bucket(sortie_home: Path, tmp_path: Path):
    """A file on the node that collection refuses (a symlink in the trainer's outputs) makes it
    fail for real: the bucket with the checkpoints is kept, and the user told where."""
    from sortie.engine.launch import run_sortie
    from sortie.engine.request import RunRequest

    backend = LocalBackend(sortie_home)
    broken: list[Path] = []

    def break_outputs(node: str, line: str) -> None:
        if not broken and STEP_PATTERN.search(line):
            out = Path(artifact_dir(backend.inventory("keep").node(node), "keep"))
            (out / "dangling").symlink_to(out / "nowhere")
            broken.append(out)

    reporter = Recorder(break_outputs)
    result = run_sortie(RunRequest(nodes=1, procs_per_node=1, steps=20, ckpt_every=5,
                                   run_id="keep", runs_dir=tmp_path / "runs"), reporter, backend)
    assert broken and result.trained
    assert result.collect_error == "refused 1 files: node-0: 'dangling' (a symlink)"
    kept = sortie_home / "kept" / "keep"
    assert result.teardown.kept == [str(kept)] and result.teardown.clean
    assert (kept / "checkpoints" / "step-00000020" / "state.pt").is_file()
    assert f"artifacts not verified: the cluster's bucket is kept at {kept}" in reporter.notes
    assert not backend.state_dir("keep").exists()
