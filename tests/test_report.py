"""The run report rendered from a run directory (`sortie/rundir/`): what the page says, its
plots (one point per logged step), what it does with untrusted metrics, and its size. The
report of real sorties, in a real browser, is in test_report_browser.py."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from sortie.bootstrap.verified_copy import Artifact, write_manifest
from sortie.rundir.metrics import read_metrics, sparkline
from sortie.rundir.report import ReportError, render_report, write_report
from sortie.rundir.result import PhaseSpan, Recovery, RunResult
from sortie.rundir.run_file import RUN_FILE, RunSetup, started_at, write_run_file
from sortie.stacks.backend import Teardown

pytestmark = pytest.mark.unit


def series_points(html: str, name: str) -> int:
    """How many points the plotted line of ``name`` has (its SVG path: M, then L per further
    point)."""
    group = re.search(rf'<g id="series-{re.escape(name)}">(.*?)</g>', html, re.S)
    assert group, f"no plot of {name}"
    path = re.search(r'<path d="([^"]*)"', group.group(1))
    return len(re.findall(r"[ML]", path.group(1)))


def checkpoint_marks(html: str, name: str) -> int:
    group = re.search(rf'<g id="{re.escape(name)}-checkpoints">(.*?)</g>', html, re.S)
    return len(re.findall(r"<path ", group.group(1))) if group else 0


def a_run(tmp_path: Path, steps: int = 60, every: int = 10, recovered: bool = False,
          ok: bool = True, checkpoint_every: int | None = None,
          cluster: str | None = None) -> Path:
    """A run directory as a sortie leaves it: ``run.json``, metrics logged every ``every``
    steps with a save every ``checkpoint_every`` (default: every other log), a manifest and a
    failing node's log (also the benchmark's input)."""
    run_dir = tmp_path / "runs" / "r1"
    (run_dir / "logs").mkdir(parents=True)
    lines = []
    for step in range(every, steps + 1, every):
        if step % (checkpoint_every or every * 2) == 0:
            lines.append({"step": step, "checkpoint": True})
        lines.append({"step": step, "loss": 5.0 / step, "lr": 0.003, "samples_per_s": 500.0,
                      "tokens_per_s": 32000.0})
    if recovered:  # resumed from step 20: steps 30.. logged again, the last values count
        lines += [{"step": s, "loss": 1.0 / s, "lr": 0.002} for s in range(30, steps + 1, every)]
    (run_dir / "artifacts").mkdir()
    (run_dir / "artifacts" / "metrics.jsonl").write_text(
        "".join(json.dumps(x) + "\n" for x in lines))
    (run_dir / "logs" / "node-1.log").write_text("".join(f"line {i}\n" for i in range(50)) +
                                                 "Traceback: <script>alert(1)</script>\n")
    write_manifest(run_dir, "r1", [Artifact("artifacts/metrics.jsonl", 123, "ab" * 32,
                                            "node-0")])
    recovery = Recovery(lost=["node-1"], reason="machine gone", failed_at_step=40, step_s=0.1,
                        failed_at=0.0)
    recovery.resumed(20, 3.5)
    result = RunResult(
        run_id="r1", nodes=2, ranks=4, artifacts=run_dir, cluster=cluster,
        exit_codes={"node-0": 0, "node-1": 0 if ok else 1}, phase_s={"up": 1.0, "train": 5.0},
        wall_s=9.0, summary={"steps": steps, "final_loss": 0.08, "samples_per_s": 512.0},
        teardown=Teardown("r1", removed=3, state_removed=True),
        launch_failures=["attempt 1 (zone us-east-1a): no capacity"],
        recoveries=[recovery] if recovered else [],
        timeline=[PhaseSpan("launch retry", 0.0, 0.4, ok=False), PhaseSpan("up", 0.0, 1.0),
                  PhaseSpan("bootstrap", 1.0, 2.0), PhaseSpan("train", 2.0, 5.0, ok=ok),
                  *([PhaseSpan("recover", 5.0, 6.0), PhaseSpan("train", 6.0, 8.0)]
                    if recovered else []),
                  PhaseSpan("collect", 8.0, 8.5), PhaseSpan("down", 8.5, 9.0)])
    setup = RunSetup(backend="aws", profile="aws-p3-dev", procs_per_node=2, gpus_per_node=1,
                     job="bundled trainer", started_at=started_at(1_790_000_000),
                     usd_per_hour=6.12, pricing="on-demand",
                     node_facts={"node-0": {"python": "/usr/bin/python3", "torch": "2.13.0",
                                            "gpus": 1}})
    write_run_file(setup, result)
    return run_dir


def test_the_report_is_drawn_from_the_run_as_written_not_read_back(tmp_path: Path):
    """At the end of a run the report comes from the run file in memory; `sortie report`
    reads the same file back and draws the same page."""
    from sortie.rundir.report import read_run_file

    run_dir = a_run(tmp_path)
    written = read_run_file(run_dir)
    from_disk = render_report(run_dir)
    (run_dir / RUN_FILE).unlink()
    assert render_report(run_dir, run=written) == from_disk
    with pytest.raises(ReportError, match="no readable run.json"):
        render_report(run_dir)


def test_the_report_says_what_ran_how_it_went_and_what_it_cost(tmp_path: Path):
    html = render_report(a_run(tmp_path))
    assert html.startswith("<!DOCTYPE html>") and "<script" not in html.split("</head>")[0]
    assert 'id="outcome">ok<' in html and "aws · aws-p3-dev" in html
    assert "2 × 2 (4 ranks)" in html and "bundled trainer" in html and "9.0s" in html
    assert "$0.02" in html and "$6.12/h, on-demand" in html  # 9 s at $6.12/h
    assert "0 resources remain" in html or "destroyed" in html
    assert "launch retry: attempt 1 (zone us-east-1a): no capacity" in html
    assert 'id="phase-launch-retry"' in html and 'id="phase-train"' in html
    for name in ("loss", "lr", "samples_per_s", "tokens_per_s"):
        assert series_points(html, name) == 6, "one point per logged step"
    assert html.index('data-metric="loss"') < html.index('data-metric="lr"') < \
        html.index('data-metric="samples_per_s"')
    assert checkpoint_marks(html, "loss") == 3  # steps 20, 40, 60
    # Seen at a glance (before: green at 35% opacity, 0.8 pt wide).
    marks = re.search(r'<g id="loss-checkpoints">(.*?)</g>', html, re.S).group(1)
    assert "stroke-opacity: 0.8" in marks and "stroke-width: 1.2" in marks, marks[:400]
    # Every phase row says how it went (before: a fourth column with no name, empty when ok).
    assert "<th>outcome</th>" in html
    assert re.search(r'<td>launch retry</td>.*?<td class="bad">failed</td>', html, re.S)
    assert re.search(r'<td>bootstrap</td>(?:(?!</tr>).)*<td class="ok">ok</td>', html, re.S)
    assert 'id="cluster"' not in html, "a run's own cluster is the run"
    assert "ab" * 32 in html and "/usr/bin/python3" in html and "2.13.0" in html
    # Stands alone: nothing fetched, nothing run (XML namespaces are names, not fetches).
    assert not re.search(r'(src|href)\s*=\s*"(https?:)?//', html)
    assert "<script" not in html and "<link" not in html and "@import" not in html


def test_an_exec_report_names_its_cluster(tmp_path: Path):
    html = render_report(a_run(tmp_path, cluster="lab"))
    assert '<div id="cluster"><b>cluster</b>lab (held: an exec, left running)</div>' in html


def test_a_failed_run_shows_the_failure_and_the_failing_nodes_log_escaped(tmp_path: Path):
    html = render_report(a_run(tmp_path, ok=False))
    assert 'id="outcome">failed<' in html
    assert 'id="failure">training failed on node-1 (exit 1)' in html
    tail = re.search(r'<pre class="log-tail" data-node="node-1">(.*?)</pre>', html, re.S)
    assert tail and tail.group(1).count("\n") == 19, "the last 20 lines"
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in tail.group(1)
    assert "<script>alert" not in html


def test_a_recovery_is_on_the_timeline_and_a_resumed_step_counts_once(tmp_path: Path):
    html = render_report(a_run(tmp_path, recovered=True))
    assert 'id="recovery-1"' in html and "resumed from step 20" in html
    assert "cost " in html and 'id="phase-recover"' in html
    assert series_points(html, "loss") == 6, "steps logged again count once"
    assert 'id="loss-resume-1"' in html
    loss = read_metrics(tmp_path / "runs" / "r1" / "artifacts" / "metrics.jsonl").series["loss"]
    assert loss[60] == pytest.approx(1.0 / 60), "the last value of a step is the one kept"


def test_metrics_from_a_node_are_untrusted(tmp_path: Path):
    path = tmp_path / "metrics.jsonl"
    path.write_text("\n".join([
        json.dumps({"step": 1, "loss": 1.0, "bad name!": 3.0, "ok_name": float("nan")}),
        "not json", json.dumps([1, 2]), json.dumps({"step": "3", "loss": 2.0}),
        json.dumps({"step": True, "loss": 2.0}), json.dumps({"step": 2, "flag": True}),
        json.dumps({"step": 3, **{f"f{i}": 1.0 for i in range(40)}}),
    ]) + "\n")
    metrics = read_metrics(path)
    assert metrics.skipped == 4
    assert list(metrics.series)[:1] == ["loss"] and "bad name!" not in metrics.series
    assert "ok_name" not in metrics.series and "flag" not in metrics.series
    assert len(metrics.series) == 24, "at most 24 plots"


def test_a_report_of_a_1000_step_run_is_under_a_megabyte(tmp_path: Path):
    path = write_report(a_run(tmp_path, steps=1000, every=1))
    html = path.read_text()
    assert series_points(html, "loss") == 1000
    assert path.stat().st_size < 1_000_000, path.stat().st_size


def test_a_directory_without_a_run_record_is_one_clear_error(tmp_path: Path):
    with pytest.raises(ReportError, match=f"no readable {RUN_FILE}"):
        render_report(tmp_path)
    (tmp_path / RUN_FILE).write_text(json.dumps({"run_id": "x"}))
    with pytest.raises(ReportError, match="not a run record"):
        render_report(tmp_path)


def test_a_run_record_is_read_as_untrusted(tmp_path: Path):
    """run.json may be anyone's: a wrong shape is one clear error, and the trainer's summary
    (from a node) shows only numbers."""
    run_dir = a_run(tmp_path)
    record = json.loads((run_dir / RUN_FILE).read_text())
    record["result"]["summary"] = {"final_loss": "<b>x</b>", "steps": 60}
    (run_dir / RUN_FILE).write_text(json.dumps(record))
    html = render_report(run_dir)
    assert "<b>x</b>" not in html and "final loss" not in html and ">60<" in html
    (tmp_path / "outside.log").write_text("not the run's\n")
    record["result"]["exit_codes"] = {"../../../outside": 1, "node-1": 1}
    (run_dir / RUN_FILE).write_text(json.dumps(record))
    html = render_report(run_dir)
    assert "not the run&#39;s" not in html and "not the run's" not in html, "a path escaped"
    assert "line 49" in html  # node-1's own log is still shown
    record["result"]["timeline"] = [{"phase": "up", "start_s": "soon"}]
    (run_dir / RUN_FILE).write_text(json.dumps(record))
    with pytest.raises(ReportError, match="not a run record"):
        render_report(run_dir)


def test_sparkline():
    assert sparkline([]) == ""
    assert sparkline([3.0, 2.0, 1.0, 1.0]) == "█▅▁▁"
    line = sparkline([float(100 - i) for i in range(100)])
    assert len(line) == 40 and line[0] == "█" and line[-1] == "▁"
    assert sparkline([2.0, 2.0]) == "▁▁"


def test_a_symlinked_log_in_a_shared_run_directory_is_not_read(tmp_path: Path):
    """Before: `logs/node-1.log -> /proc/self/environ` put the reader's environment in the
    report."""
    run_dir = a_run(tmp_path, ok=False)
    secret = tmp_path / "environ"
    secret.write_text("AWS_SECRET_ACCESS_KEY=hunter2\n")
    (run_dir / "logs" / "node-1.log").unlink()
    (run_dir / "logs" / "node-1.log").symlink_to(secret)
    assert "hunter2" not in render_report(run_dir)


def test_a_huge_metrics_file_is_read_at_both_ends_and_says_so(tmp_path: Path,
                                                              monkeypatch: pytest.MonkeyPatch):
    """Before: only the first 32 MiB were read, silently: the end of a long run was missing."""
    import sortie.rundir.metrics

    monkeypatch.setattr(sortie.rundir.metrics, "MAX_METRICS_BYTES", 4096)
    path = tmp_path / "metrics.jsonl"
    path.write_text("".join(json.dumps({"step": s, "loss": 1.0 / s}) + "\n"
                            for s in range(1, 2001)))
    metrics = read_metrics(path)
    steps = sorted(metrics.series["loss"])
    assert steps[0] == 1 and steps[-1] == 2000, "the first and the last steps"
    assert metrics.skipped_bytes > 0 and metrics.skipped == 0, "no line read in half"


def test_a_run_from_before_artifacts_had_their_folder_still_plots(tmp_path: Path):
    run_dir = a_run(tmp_path)
    (run_dir / "artifacts" / "metrics.jsonl").rename(run_dir / "metrics.jsonl")
    (run_dir / "artifacts").rmdir()
    assert series_points(render_report(run_dir), "loss") == 6


def test_the_timeline_is_in_phase_order_and_an_empty_metrics_file_is_said_as_such(
        tmp_path: Path):
    """Issue 47: "health" was drawn last on the timeline, and a failed run said "the job
    wrote no metrics.jsonl" while its artifacts listed a 0 B one."""
    run_dir = a_run(tmp_path, ok=False)
    (run_dir / "artifacts" / "metrics.jsonl").write_text("")
    html = render_report(run_dir)
    assert "the job&#39;s <code>metrics.jsonl</code> (0 B) holds no line" in html or \
        "the job's <code>metrics.jsonl</code> (0 B) holds no line" in html, \
        re.search(r'id="no-metrics">(.*?)</p>', html, re.S).group(1)
    (run_dir / "artifacts" / "metrics.jsonl").unlink()
    assert "the job wrote no <code>metrics.jsonl</code>" in render_report(run_dir)
    from sortie.rundir.plots import timeline_plot
    from sortie.rundir.run_file import RecordedSpan

    svg = timeline_plot([RecordedSpan(phase=p, start_s=i, end_s=i + 1.0, ok=True)
                         for i, p in enumerate(("train", "health", "bootstrap", "up"))], [])
    rows = re.findall(r'<g id="phase-([a-z-]+)">', svg)
    assert rows == ["up", "bootstrap", "health", "train"], rows


@pytest.mark.parametrize(("mode", "cached"), [(0o700, True), (0o777, False)])
def test_the_templates_compiled_cache_is_used_only_in_a_private_home(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, mode: int, cached: bool):
    """Fourth review (issue 61), Low 15: Jinja2's compiled template was loaded (unpickled) from
    $SORTIE_HOME whoever could write there: code another user planted would run in every
    report. A home others can write in gets no cache (the template is compiled in memory)."""
    from sortie.rundir import report

    home = tmp_path / "home"
    home.mkdir()
    home.chmod(mode)
    monkeypatch.setenv("SORTIE_HOME", str(home))
    report._report_template.cache_clear()
    try:
        assert (report._report_template().environment.bytecode_cache is not None) is cached
    finally:
        report._report_template.cache_clear()
