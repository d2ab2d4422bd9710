"""One name, one sortie (issue 28, item 2): a launch that loses the name to another sortie exits
2 and touches nothing of the winner's: no claim, no `down`, no stack selected or record written.
Before: the loser's teardown stopped the held cluster, and on clouds its `up` selected and
overwrote the first sortie's stack."""

from __future__ import annotations

from pathlib import Path

import pytest

from sortie.engine.launch import run_sortie
from sortie.engine.request import RunRequest
from sortie.stacks.backend import NameTakenError
from sortie.stacks.local.local_backend import LocalBackend
from sortie.stacks.records import CONTROLLER_FILE
from tests.helpers import Recorder, needs_sshd, start_sortie
from tests.stack_double import DoubleCloud

pytestmark = pytest.mark.e2e


@needs_sshd
def test_a_second_launch_of_a_held_name_leaves_the_held_cluster_alone(backend: LocalBackend,
                                                                     tmp_path: Path):
    held = backend.up("race", 1, held=True)
    with pytest.raises(NameTakenError, match="'race': a sortie of that name already exists"):
        run_sortie(RunRequest(nodes=1, procs_per_node=1, steps=5, run_id="race",
                              runs_dir=tmp_path / "runs"), Recorder(), LocalBackend(backend.home))
    assert backend.lost_nodes(held).nodes == [], "the held cluster's node is still up"
    assert not (backend.state_dir("race") / CONTROLLER_FILE).exists(), "never claimed"
    assert not (tmp_path / "runs" / "race").exists()
    assert backend.down("race").clean


@needs_sshd
def test_three_runs_of_one_name_at_once_one_runs_the_others_exit_2(sortie_home: Path,
                                                                   tmp_path: Path):
    procs = [start_sortie(tmp_path, "run", "--nodes", "1", "-p", "1", "--steps", "8",
                          "--name", "race") for _ in range(3)]
    outputs = [proc.communicate(timeout=240)[0] for proc in procs]
    codes = sorted(proc.returncode for proc in procs)
    assert codes == [0, 2, 2], "\n---\n".join(outputs)
    losers = [out for proc, out in zip(procs, outputs, strict=True) if proc.returncode == 2]
    assert all("'race'" in out and "exists" in out for out in losers), losers
    winner = next(out for proc, out in zip(procs, outputs, strict=True) if proc.returncode == 0)
    assert "0 resources remain" in winner and "final loss" in winner
    assert not (sortie_home / "clusters" / "race").exists()


@needs_sshd
def test_a_cloud_name_another_controller_holds_is_never_selected(tmp_path: Path):
    cloud = DoubleCloud(tmp_path)
    first = cloud.backend(tmp_path / "controller-a")
    first.up("exp", 1)
    record = cloud.records.load("exp")
    second = cloud.backend(tmp_path / "controller-b")  # shares only the state backend
    with pytest.raises(NameTakenError, match="in the state backend"):
        second.reserve("exp")
    with pytest.raises(NameTakenError):
        second.up("exp", 1)
    assert cloud.records.load("exp") == record, "the first sortie's record is untouched"
    assert not (tmp_path / "controller-b" / "stacks" / "exp").exists()
    sortie_id = record.config["sortie:sortieId"]
    assert sortie_id.startswith("exp-") and len(sortie_id) == len("exp-") + 8
    assert first.down("exp").clean
