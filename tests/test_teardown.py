"""Teardown that always reaches its proof, never destroys what it promised to keep, and never
lets one bad sortie stop the others: against the in-repo double of a Pulumi stack (real local
machines) and, for the Pulumi CLI itself, a stand-in `pulumi` executable."""

from __future__ import annotations

import json
import os
import shutil
import signal
import sys
import threading
import time
from pathlib import Path

import pytest

from sortie.bootstrap.node_layout import run_dir
from sortie.core import statefile
from sortie.engine.reap import reap
from sortie.fleet import registry
from sortie.fleet.status import status as fleet_status
from sortie.stacks.cloud.access import CloudAccess
from sortie.stacks.records import Controller, SortieRecord
from tests.helpers import assert_nothing_left, dead_pid, needs_sshd, processes_mentioning
from tests.stack_double import DoubleCloud

pytestmark = pytest.mark.e2e

def rewrite_record(home: Path, cloud: DoubleCloud, name: str, **changes) -> None:
    """Change a sortie's record where every controller reads it: this one's copy and the
    state backend's."""
    local = home / "stacks" / name / "sortie.json"
    record = SortieRecord.model_validate_json(local.read_text()).model_copy(update=changes)
    statefile.write_text(local, record.model_dump_json())
    cloud.update_record(name, **changes)


def access(cloud: DoubleCloud) -> CloudAccess:
    return CloudAccess(stacks=cloud, sweep=cloud.sweep)


@needs_sshd
def test_a_stale_lock_and_a_pending_create_never_stop_teardown(tmp_path: Path):
    """A controller killed during `up`: its Pulumi CLI's lock is left, and the state knows a
    machine only as a pending create. Before: `down` began with an unguarded refresh that failed
    on the lock, never reached the sweep, and `reap` repeated that for ever."""
    cloud = DoubleCloud(tmp_path)
    backend = cloud.backend(tmp_path)
    backend.up("killed", 1)
    stack = cloud.stacks["killed"]
    stack.die_during_up(lock_pid=dead_pid())
    report = backend.down("killed")
    assert stack.calls.count("cancel") == 1, "the stale lock was cleared, once"
    assert stack.pending_creates == [], "the pending create was dropped from the state"
    [leftover] = report.leftovers  # the machine the state never knew: found by the sweep
    assert leftover.kind == "ec2:instance" and leftover.resource.endswith("killed-node-9")
    assert not report.clean and "killed" in cloud.stacks, "the stack stays while it is proven"
    assert [kind for kind in cloud.resources.values()] == ["aws:ec2/instance:Instance"]


@needs_sshd
def test_a_lock_held_from_another_machine_is_left_alone_and_the_sweep_still_runs(
        tmp_path: Path):
    cloud = DoubleCloud(tmp_path)
    backend = cloud.backend(tmp_path)
    backend.up("busy", 1)
    stack = cloud.stacks["busy"]
    stack.locked_by = ("ci-runner-7", 31337)  # alive, as far as anyone here can tell
    report = backend.down("busy")
    assert "cancel" not in stack.calls
    stack_problems = [left for left in report.leftovers if left.kind == "stack"]
    assert stack_problems and "locked" in stack_problems[0].remove
    assert "ec2:instance" in {left.kind for left in report.leftovers}, "the sweep still ran"
    assert "teardown of busy incomplete" in report.summary()
    stack.locked_by = None  # its holder finished
    assert backend.down("busy").clean
    assert_nothing_left(tmp_path, cloud=cloud, name="busy")


@needs_sshd
def test_teardown_purges_what_the_cloud_keeps_after_the_destroy_and_before_its_sweep(
        tmp_path: Path):
    """Azure keeps a deleted Key Vault, the host keys in it, for days: the cloud's purge runs
    once the destroy is done and before the sweep. A purge that fails is a named leftover, the
    teardown goes on to its sweep, and the sortie stays for a retry."""
    from dataclasses import replace

    cloud = DoubleCloud(tmp_path)
    backend = cloud.backend(tmp_path)
    steps: list = []
    sweep = backend.sweep
    backend.sweep = lambda spec: (steps.append("sweep"), sweep(spec))[1]

    def refused(spec) -> None:
        steps.append(("purge", spec.cluster, list(cloud.resources.values())))
        raise RuntimeError("purge refused by the cloud\nsecond line")

    backend.cloud = replace(backend.cloud, purge_deleted=refused)
    backend.up("kept", 1)
    report = backend.down("kept")
    assert steps == [("purge", "kept", []), "sweep"], "after the destroy, before the sweep"
    [left] = report.leftovers
    assert (left.kind, left.remove) == (
        "stack", "purging what the cloud keeps of deleted resources: purge refused by the cloud")
    assert not report.clean and "kept" in cloud.stacks
    backend.cloud = replace(backend.cloud, purge_deleted=lambda spec: steps.append("purged"))
    assert backend.down("kept").clean and steps[-2:] == ["purged", "sweep"]
    assert_nothing_left(tmp_path, cloud=cloud, name="kept")


@needs_sshd
def test_reap_never_destroys_a_kept_bucket(tmp_path: Path):
    """Before: once the TTL passed, reap ran a full `down` and force-destroyed the bucket that
    unverified artifacts had kept."""
    cloud = DoubleCloud(tmp_path)
    backend = cloud.backend(tmp_path)
    backend.up("kept", 2)
    assert backend.down("kept", keep_bucket=True).kept
    rewrite_record(tmp_path, cloud, "kept", expires_at=time.time() - 3600)
    [row] = fleet_status(tmp_path, access(cloud)).sorties
    assert (row.name, row.state) == ("kept", "kept") and "bucket" in row.detail
    assert reap(tmp_path, access(cloud)) == []
    assert sorted(cloud.resources.values()) == ["aws:s3/bucket:Bucket",
                                                "aws:s3/bucketPolicy:BucketPolicy"]
    named = registry.teardown(tmp_path, registry.find(tmp_path, "kept"), access(cloud))
    assert named.clean and named.removed == 2, "naming it removes it"
    assert_nothing_left(tmp_path, cloud=cloud, name="kept")


@needs_sshd
def test_one_bad_sortie_in_the_backend_never_stops_reaping(tmp_path: Path):
    """Before: an error reading one stack escaped the listing and reap reached nothing else."""
    cloud = DoubleCloud(tmp_path)
    elsewhere = tmp_path / "controller-a"
    for name in ("damaged", "expired"):
        cloud.backend(elsewhere).up(name, 1)
    gone = Controller(host="laptop-a", pid=1, started=0.0, heartbeat=time.time() - 3600)
    cloud.update_record("expired", expires_at=time.time() - 60, controller=gone)
    Path(cloud.records._path("damaged")).write_text('{"cluster": "damaged", "no')
    done = {item.name: item for item in reap(tmp_path / "controller-b", access(cloud))}
    assert done["damaged"].action == "failed"
    assert done["damaged"].line.startswith("damaged: not reaped: ") and "damaged" in \
        done["damaged"].line
    assert done["expired"].action == "torn down" and done["expired"].teardown.clean
    assert "expired" not in cloud.stacks and "damaged" in cloud.stacks
    cloud.backend(elsewhere).down("damaged")


def test_state_files_are_replaced_whole_or_not_at_all(tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch):
    path = tmp_path / "sortie.json"
    statefile.write_json(path, {"version": 1})
    assert path.stat().st_mode & 0o777 == 0o600

    def crash(*_args):  # the controller dies between writing and renaming
        raise KeyboardInterrupt

    monkeypatch.setattr(os, "replace", crash)
    with pytest.raises(KeyboardInterrupt):
        statefile.write_json(path, {"version": 2})
    assert json.loads(path.read_text()) == {"version": 1}
    assert [p.name for p in tmp_path.iterdir()] == ["sortie.json"], "no temp file left"
    path.write_text('{"version": ')
    with pytest.raises(statefile.CorruptStateError, match=r"sortie\.json: damaged, not JSON"):
        statefile.read_json(path)


# -- the Pulumi CLI child on Ctrl-C ---------------------------------------------------------------

FAKE_PULUMI = r'''#!{python}
"""A stand-in for the Pulumi CLI: answers `version`; any other command runs until SIGINT, which
it answers as Pulumi does (finish what is in flight, release the lock, exit)."""
import os, signal, sys, time

if sys.argv[1:] == ["version"]:
    print("v3.272.0")
    sys.exit(0)
marks = os.environ["FAKE_PULUMI_MARKS"]
open(os.path.join(marks, "started"), "w").write(str(os.getpid()))
def cancel(signum, frame):
    time.sleep(0.3)  # operations in flight
    open(os.path.join(marks, "cancelled"), "w").write("SIGINT")
    sys.exit(255)
if os.environ.get("FAKE_PULUMI_IGNORES_SIGINT"):
    signal.signal(signal.SIGINT, signal.SIG_IGN)
else:
    signal.signal(signal.SIGINT, cancel)
while True:
    time.sleep(0.05)
'''


@pytest.mark.parametrize("ignores_sigint", [False, True])
def test_an_interrupted_pulumi_cli_is_stopped_not_orphaned(ignores_sigint: bool,
                                                           tmp_path: Path,
                                                           monkeypatch: pytest.MonkeyPatch):
    """Before: the Automation API waited 0.25 s after a Ctrl-C and left the CLI running, still
    holding the stack's lock."""
    import psutil

    from sortie.stacks.cloud.automation import InterruptiblePulumi

    executable = tmp_path / "bin" / "pulumi"
    executable.parent.mkdir()
    executable.write_text(FAKE_PULUMI.replace("{python}", sys.executable))
    executable.chmod(0o755)
    marks = tmp_path / "marks"
    marks.mkdir()
    monkeypatch.setenv("FAKE_PULUMI_MARKS", str(marks))
    if ignores_sigint:
        monkeypatch.setenv("FAKE_PULUMI_IGNORES_SIGINT", "1")
    command = InterruptiblePulumi(str(executable), grace_s=1.0)

    def interrupt_once_started() -> None:
        while not (marks / "started").exists():
            time.sleep(0.02)
        time.sleep(0.2)
        os.kill(os.getpid(), signal.SIGINT)  # Ctrl-C, delivered to the controller

    threading.Thread(target=interrupt_once_started, daemon=True).start()
    with pytest.raises(KeyboardInterrupt):
        command.run(["refresh", "--stack", "exp-1"], str(tmp_path), {})
    child = int((marks / "started").read_text())
    assert not psutil.pid_exists(child) or psutil.Process(child).status() == \
        psutil.STATUS_ZOMBIE, "the Pulumi CLI outlived the controller's interrupt"
    assert (marks / "cancelled").exists() != ignores_sigint, \
        "it was given a SIGINT to finish cleanly (and killed only when it ignored it)"


@needs_sshd
def test_another_controller_adopts_a_finished_cloud_sortie_from_the_backend_alone(
        tmp_path: Path):
    """Controller A launches a job and vanishes with its files; controller B, sharing only the
    state backend, finds it orphaned, builds the nodes from the stack's outputs, collects and
    verifies the run into its own runs/, and tears down with proof."""
    from sortie.bootstrap import train
    from sortie.bootstrap.prepare import prepare
    from sortie.core.job import Job

    cloud = DoubleCloud(tmp_path)
    controller_a = tmp_path / "controller-a"
    backend = cloud.backend(controller_a)
    inventory = backend.up("remote", 2)
    job = Job(run_id="remote", procs_per_node=1, trainer_args=("--steps", "20"),
              runs_dir=str(tmp_path / "runs"))
    backend.save_job("remote", job)
    conns = prepare(inventory)
    train.launch_all(conns, inventory, job)  # the job as recorded is the job as launched
    conns.close()
    shutil.rmtree(controller_a)
    cloud.update_record("remote", controller=Controller(
        host="laptop-a", pid=4242, started=0.0, heartbeat=time.time() - 3600))
    deadline = time.monotonic() + 120
    while not all((Path(run_dir(n, "remote")) / "exit_code").is_file()
                  for n in inventory.nodes):
        assert time.monotonic() < deadline, "the job never finished"
        time.sleep(0.5)

    [done] = reap(tmp_path / "controller-b", access(cloud))
    assert done.action == "torn down" and done.teardown.clean, done.line
    assert done.line.startswith("remote: adopted (its job ended); collected ")
    # Into B's own runs/: a path in another controller's record is not B's to trust.
    run = tmp_path / "controller-b" / "runs" / "remote"
    assert json.loads((run / "artifacts" / "summary.json").read_text())["steps"] == 20
    assert (run / "checkpoints" / "step-00000020").is_dir()
    assert not (tmp_path / "runs").exists()
    assert_nothing_left(tmp_path / "controller-b", cloud=cloud, name="remote")
    assert processes_mentioning(tmp_path / "double-machines") == []
