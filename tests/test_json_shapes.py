"""What `--json` prints and `manifest.json` holds is read by scripts: the shapes stay put.

Each document is the pydantic serialisation of the object itself (`sortie.render.jsonable`);
these tests pin the keys, the rounding and what is left out."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from sortie.bootstrap.health_report import HealthReport, NodeHealth
from sortie.bootstrap.link_health import Link
from sortie.bootstrap.verified_copy import Artifact, write_manifest
from sortie.cli.render import jsonable
from sortie.engine.reap import Reaped
from sortie.fleet.status import fleet
from sortie.infra.cloud_home import Leftover
from sortie.rundir.result import PhaseSpan, Recovery, RunResult
from sortie.stacks.backend import Teardown
from sortie.stacks.listing import SortieRow

pytestmark = pytest.mark.unit


def a_teardown() -> Teardown:
    return Teardown("c1", removed=3, unit="processes",
                    leftovers=[Leftover("process", "4242", "kill 4242")], kept=["bucket"])


TEARDOWN = {"cluster": "c1", "clean": False, "removed": 3, "unit": "processes",
            "leftovers": [{"kind": "process", "resource": "4242", "remove": "kill 4242"}],
            "kept": ["bucket"], "state_removed": False, "detached": False,
            "accounted_s": None, "accounted_by": "Slurm's accounting (sacct)", "said": None}


def a_result() -> RunResult:
    recovery = Recovery(["node-1"], "machine gone", failed_at_step=20, step_s=0.1234,
                        failed_at=100.0)
    recovery.resumed(10, at=112.34567)
    return RunResult(
        run_id="r1", nodes=2, ranks=4, artifacts=Path("/runs/r1"),
        exit_codes={"node-0": 0, "node-1": 0}, phase_s={"up": 1.23456, "train": 9.87654},
        wall_s=12.34567, summary={"steps": 40}, teardown=a_teardown(),
        collected=[Artifact("artifacts/summary.json", 10, "ab" * 32, "node-0")],
        launch_failures=["attempt 1: no capacity"], recoveries=[recovery],
        timeline=[PhaseSpan("up", 0.0, 1.23456), PhaseSpan("train", 1.3, 11.1, ok=False)],
        report=Path("/runs/r1/report.html"), loss_sparkline="▇▅▂▁")


def test_run_result():
    assert jsonable(a_result()) == {
        "run_id": "r1", "ok": True, "nodes": 2, "ranks": 4, "artifacts": "/runs/r1",
        "cluster": None,
        "exit_codes": {"node-0": 0, "node-1": 0}, "ended_by": {}, "wall_s": 12.346,
        "phase_s": {"up": 1.235, "train": 9.877}, "summary": {"steps": 40}, "last_step": None,
        "teardown_clean": False, "artifacts_verified": True, "collect_error": None,
        "left_on_nodes": [], "launch_failures": ["attempt 1: no capacity"],
        "recoveries": [{"lost": ["node-1"], "reason": "machine gone", "failed_at_step": 20,
                        "resumed_from_step": 10, "downtime_s": 12.346, "redone_s": 1.234,
                        "detail": "", "cost_s": 13.58}],
        "recovery_error": None, "health": None, "image": None, "teardown": TEARDOWN,
        "first_failed": None,
        "stopped": [], "hung": None, "budget_reached": None, "spent_usd": None,
        "cluster_went": None,
        "interrupted": None, "phase_failed": None,
        "node_states": {"node-0": "ok", "node-1": "ok"},
        "timeline": [{"phase": "up", "start_s": 0.0, "end_s": 1.235, "ok": True},
                     {"phase": "train", "start_s": 1.3, "end_s": 11.1, "ok": False}],
        "report": "/runs/r1/report.html", "report_error": None, "warnings": []}


def test_a_health_check_serialises_with_every_node_and_link():
    report = HealthReport(level="quick", backend="gloo", busbw_gbs=0.5, message_bytes=4 << 20,
                          nodes=[NodeHealth(node="node-0", send_gbs=1.0, recv_gbs=0.5),
                                 NodeHealth(node="node-1", problems=["GPU 0: XID 79"])],
                          links=[Link(a="node-0", b="node-1", gbs=1.0)],
                          bad={"node-1": "GPU 0: XID 79"}, seconds=1.5)
    document = jsonable(dataclasses.replace(a_result(), health=report))["health"]
    assert document == {
        "level": "quick", "backend": "gloo", "busbw_gbs": 0.5, "collective_cpu_wait": None,
        "message_bytes": 4 << 20,
        "nodes": [{"node": "node-0", "problems": [], "checks": {}, "send_gbs": 1.0,
                   "recv_gbs": 0.5},
                  {"node": "node-1", "problems": ["GPU 0: XID 79"], "checks": {},
                   "send_gbs": None, "recv_gbs": None}],
        "links": [{"a": "node-0", "b": "node-1", "gbs": 1.0, "retransmitted": 0, "segments": 0,
                   "send_wait": 0.0, "recv_wait": 0.0, "loss": None}],
        "expected_busbw_gbs": None,
        "expected_source": None, "bad": {"node-1": "GPU 0: XID 79"}, "warnings": [],
        "seconds": 1.5}
    assert "node-1: GPU 0: XID 79" in report.summary() and not report.ok


def test_an_empty_run_result_serialises():
    empty = jsonable(RunResult(run_id="r2", nodes=1, ranks=1, artifacts=Path("/runs/r2")))
    assert empty["ok"] is False and empty["teardown"] is None
    assert empty["teardown_clean"] is None and empty["artifacts_verified"] is False


def test_how_each_node_ended():
    result = RunResult(run_id="r3", nodes=3, ranks=3, artifacts=Path("/runs/r3"),
                       exit_codes={"node-0": 1, "node-1": -15, "node-2": None},
                       first_failed="node-0", stopped=["node-1"],
                       failure_tail=["Traceback", "ValueError: boom"])
    document = jsonable(result)
    assert document["node_states"] == {"node-0": "failed", "node-1": "stopped by sortie",
                                       "node-2": "lost"}
    assert document["first_failed"] == "node-0" and "failure_tail" not in document
    # One story with the table (before: node-1 was "stopped by sortie" there, "exit -15" here).
    assert result.failure().startswith("training failed on node-0 first (exit 1), node-2 (exit "
                                       "unknown): on node-0, a process raised ValueError: boom; "
                                       "stopped by sortie: node-1; logs in ")
    alone = dataclasses.replace(result, exit_codes={"node-0": 1, "node-1": None})
    assert alone.failure().startswith("training failed on node-0 (exit 1): a process raised "
                                      "ValueError: boom; stopped by sortie: node-1; logs in "), \
        "no `first` when one node failed"


def test_teardown_and_reaped():
    assert jsonable(a_teardown()) == TEARDOWN
    assert jsonable(Reaped("c1", "torn down", "c1: adopted", a_teardown(), a_result())) == {
        "name": "c1", "action": "torn down", "line": "c1: adopted", "teardown": TEARDOWN,
        "artifacts": "/runs/r1", "collected": 1, "collect_error": None}
    assert jsonable([Reaped("c2", "failed", "c2: broken")]) == [{
        "name": "c2", "action": "failed", "line": "c2: broken", "teardown": None,
        "artifacts": None, "collected": 0, "collect_error": None}]


def test_manifest(tmp_path: Path):
    write_manifest(tmp_path, "r1", [Artifact("out/a.bin", 5, "cd" * 32, "node-1")])
    assert json.loads((tmp_path / "manifest.json").read_text()) == {
        "run_id": "r1", "algorithm": "sha256",
        "files": [{"path": "out/a.bin", "bytes": 5, "sha256": "cd" * 32, "node": "node-1"}]}


def test_the_fleet_totals_what_runs_by_owner():
    """`sortie status` for ops: the $/h of everything running, in all and by owner, the most
    expensive owner first; a kept bucket costs no machine hours."""
    rows = [SortieRow(name="a", backend="aws", nodes=2, usd_per_hour=65.5452, owner="ana"),
            SortieRow(name="b", backend="gcp", nodes=1, usd_per_hour=3.673, owner="bo"),
            SortieRow(name="c", backend="aws", nodes=2, usd_per_hour=10.0, owner="ana"),
            SortieRow(name="d", backend="aws", state="kept", owner="bo"),
            SortieRow(name="e", backend="local", nodes=2, owner="bo")]
    document = jsonable(fleet(rows))
    assert document["usd_per_hour"] == 79.2182
    assert document["owners"] == [
        {"owner": "ana", "sorties": 2, "nodes": 4, "usd_per_hour": 75.5452},
        {"owner": "bo", "sorties": 3, "nodes": 3, "usd_per_hour": 3.673}]
    assert [row["name"] for row in document["sorties"]] == ["a", "b", "c", "d", "e"]
    assert {"owner", "usd_per_hour", "source"} <= set(document["sorties"][0])
