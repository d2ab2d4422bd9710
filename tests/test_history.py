"""Issue 66 (2): one run history under $SORTIE_HOME, read as untrusted; runs found by id from
any directory (`sortie runs`, `logs`, `report`, `run RUN`)."""

from __future__ import annotations

import json
import os
import re
import socket
from pathlib import Path

import pytest
from click.testing import CliRunner

from sortie.cli.app import app
from sortie.cli.options import TaskFile
from sortie.core.errors import UsageError
from sortie.rundir import history
from sortie.rundir.history import RunEntry
from sortie.rundir.result import RunResult
from sortie.stacks.records import Process, this_machine

pytestmark = pytest.mark.unit


def entry(directory: Path, run_id: str = "exp", started: float = 1000.0,
          **fields: object) -> RunEntry:
    return RunEntry(**{"id": run_id, "kind": "run", "cluster": run_id, "backend": "local",
                       "job": "bundled trainer", "directory": str(directory), "state": "succeeded",
                       "started": started, "ended": started + 60, **fields})


def process(pid: int, started: float = 1000.0, **fields: str) -> Process:
    """A process of this machine (unless ``fields`` say another) that started at ``started``."""
    return Process(**{"host": socket.gethostname(), "pid": pid, "started": started,
                      "machine": this_machine(), **fields})


def test_a_run_is_kept_by_id_and_directory_and_a_takeover_keeps_its_start(tmp_path: Path):
    home = tmp_path / "home"
    one, two = tmp_path / "a" / "runs" / "exp", tmp_path / "b" / "runs" / "exp"
    one.mkdir(parents=True)
    two.mkdir(parents=True)
    assert history.record(home, entry(one, started=1000.0, state="running")) is None
    assert history.record(home, entry(two, started=2000.0)) is None
    # The same run, written again by the controller that took it over: its end, its start kept.
    assert history.record(home, entry(one, started=1500.0, state="failed")) is None
    kept = history.read_history(home)
    assert [(e.directory, e.started, e.state) for e in kept] == [
        (str(one), 1000.0, "failed"), (str(two), 2000.0, "succeeded")]
    assert oct((home / history.HISTORY).stat().st_mode & 0o777) == "0o700"
    assert history.find_run(home, "exp").directory == str(two), "the newest"
    two.rmdir()
    assert history.find_run(home, "exp").directory == str(one), "the newest still there"
    assert history.find_run(home, "other") is None


def test_what_the_history_holds_is_read_as_untrusted(tmp_path: Path):
    home = tmp_path / "home"
    (tmp_path / "runs" / "ok").mkdir(parents=True)
    history.record(home, entry(tmp_path / "runs" / "ok", "ok"))
    folder = home / history.HISTORY
    (folder / "junk.json").write_text("{not json")
    (folder / "big.json").write_text(json.dumps({"id": "big", "job": "x" * (64 << 10)}))
    bad = entry(tmp_path, "bad").model_dump(mode="json")
    (folder / "name.json").write_text(json.dumps({**bad, "id": "../../etc"}))
    (folder / "inf.json").write_text(json.dumps({**bad, "cost_usd": 1e300}))
    os.symlink("/etc/passwd", folder / "link.json")
    assert [e.id for e in history.read_history(home)] == ["ok"]
    assert history.read_history(tmp_path / "no-home") == []


def test_a_history_that_cannot_be_written_is_said_never_raised(tmp_path: Path):
    home = tmp_path / "home"
    home.write_text("a file where the home should be")
    said = history.record(home, entry(tmp_path))
    assert said is not None and said.startswith("the run history could not be written")


def test_a_running_entry_whose_controller_is_gone_says_so(tmp_path: Path):
    pid_max = int(Path("/proc/sys/kernel/pid_max").read_text())
    dead = next(pid for pid in range(pid_max - 1, 1, -1) if not Path(f"/proc/{pid}").exists())
    gone = entry(tmp_path, state="running", ended=None, controller=process(dead))
    assert gone.shown_state() == "controller gone"
    alive = entry(tmp_path, state="running", ended=None, controller=Process.me())
    assert alive.shown_state() == "running"
    elsewhere = entry(tmp_path, state="running", ended=None,
                      controller=process(dead, machine="other/boot"))
    assert elsewhere.shown_state() == "running", "another host's controller is not ours to ask"
    assert history.select([gone, alive], state="controller gone") == [gone]


def test_an_outcome_is_one_word():
    def result(**fields: object) -> RunResult:
        return RunResult(run_id="r", nodes=1, ranks=1, artifacts=Path("runs/r"), **fields)

    assert history.outcome(result(exit_codes={"node-0": 0})) == "succeeded"
    assert history.outcome(result(exit_codes={"node-0": 1})) == "failed"
    assert history.outcome(result(exit_codes={"node-0": 1}, interrupted="Ctrl-C")) == \
        "interrupted"
    assert history.outcome(result(budget_reached="budget of $5.00 reached")) == "budget"
    assert history.outcome(result(cluster_went="detached")) == "cluster gone"
    assert history.outcome(result(hung="no log line")) == "hung"


def test_a_run_is_found_by_path_by_id_in_the_runs_dir_or_by_id_in_the_history(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    home, runs = tmp_path / "home", tmp_path / "project" / "runs"
    (runs / "exp").mkdir(parents=True)
    (runs / "exp" / "run.json").write_text("{}")
    history.record(home, entry(runs / "exp"))
    monkeypatch.chdir(tmp_path)
    here = Path("runs")  # another directory's runs/: nothing there
    assert history.run_directory(home, str(runs / "exp"), here, "run.json") == runs / "exp"
    assert history.run_directory(home, "exp", runs, "run.json") == runs / "exp"
    assert history.run_directory(home, "exp", here, "run.json") == runs / "exp"
    assert history.runs_dir_of(home, "exp", here) == runs
    assert history.runs_dir_of(home, "nope", here) == here
    with pytest.raises(UsageError, match="^RUN: no run directory runs/nope, none in the run "
                                         "history and no directory nope"):
        history.run_directory(home, "nope", here, "run.json")


def test_run_takes_a_run_id_for_its_task_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    home = tmp_path / "home"
    monkeypatch.setenv("SORTIE_HOME", str(home))
    monkeypatch.chdir(tmp_path)
    mine, trainer = tmp_path / "runs" / "mine", tmp_path / "runs" / "trainer"
    mine.mkdir(parents=True)
    trainer.mkdir()
    (mine / "task.yaml").write_text("run: 'true'\n")
    history.record(home, entry(mine, "mine"))
    history.record(home, entry(trainer, "trainer"))
    task = TaskFile()
    assert task.convert("mine", None, None) == mine / "task.yaml"
    assert task.convert("task.yaml", None, None) == Path("task.yaml"), "a file name stays one"
    assert task.convert("unknown", None, None) == Path("unknown")
    with pytest.raises(UsageError, match="^TASK: run trainer ran the bundled trainer: it kept "
                                         "no task.yaml"):
        task.convert("trainer", None, None)


def test_runs_lists_filters_and_says_it_as_json(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    home = tmp_path / "home"
    monkeypatch.setenv("SORTIE_HOME", str(home))
    monkeypatch.chdir(tmp_path)
    for number, state in enumerate(("succeeded", "failed", "succeeded")):
        directory = tmp_path / "runs" / f"r{number}"
        directory.mkdir(parents=True)
        history.record(home, entry(directory, f"r{number}", started=1000.0 + number,
                                   state=state, cluster="dev", kind="exec", cost_usd=0.5))
    runner = CliRunner()
    table = runner.invoke(app, ["runs"], env={"COLUMNS": "200"})
    assert table.exit_code == 0, table.output
    assert "3 runs" in table.output and "runs/r1" in table.output and "$0.50" in table.output
    listed = runner.invoke(app, ["runs", "--state", "succeeded", "--last", "1", "--json"])
    assert [(r["id"], r["state"]) for r in json.loads(listed.output)] == [("r2", "succeeded")]
    assert json.loads(runner.invoke(app, ["runs", "--cluster", "x", "--json"]).output) == []
    queued = runner.invoke(app, ["runs", "--state", "queued", "--json"])  # (every State)
    assert queued.exit_code == 0 and json.loads(queued.output) == [], queued.output
    bad = runner.invoke(app, ["runs", "--state", "odd"])
    assert bad.exit_code == 2 and "--state" in bad.output


def test_help_says_what_the_commands_do():
    """Issue 66 (7): help that said the wrong thing, read as a user reads it."""
    def helped(*command: str) -> str:
        said = CliRunner().invoke(app, [*command, "--help"], env={"COLUMNS": "400"})
        assert said.exit_code == 0, said.output
        return " ".join(said.output.split())

    check = helped("check")
    assert "all-reduce" not in check.split("full:")[0], "quick is the TCP ring, not a collective"
    assert "each link of a ring of the nodes over TCP" in check
    plan = helped("plan")
    assert "no cloud credentials and no Pulumi CLI are needed" in plan
    assert "`plan` needs neither" in plan
    for command in ("run", "reap"):
        assert "no new log line" in helped(command).split("--hang-timeout")[1][:200].lower(), \
            command
    for command in ("runs", "ssh", "ssh-config"):
        assert helped(command)
    assert "head" in helped("ssh") and "-L 6006:localhost:6006" in helped("ssh")


def test_cancel_signals_only_a_sortie_controller_of_this_machine(tmp_path: Path):
    """A pid read from the history is never trusted to be ours: another host's, a gone one, or
    one another process holds now (its start time is not the controller's) is refused."""
    from sortie.engine import held_jobs

    home = tmp_path / "home"
    pid_max = int(Path("/proc/sys/kernel/pid_max").read_text())
    dead = next(pid for pid in range(pid_max - 1, 1, -1) if not Path(f"/proc/{pid}").exists())
    cases = [(process(os.getpid(), host="elsewhere", machine="elsewhere/boot"),
              "runs on elsewhere: cancel it there"),
             (process(dead), f"controller is gone (pid {dead})"),
             (process(os.getpid(), started=1.0), "is another process now")]  # a recycled pid
    for controller, said in cases:
        running = entry(tmp_path, "job", state="running", ended=None, controller=controller,
                        cluster="dev", kind="exec")
        with pytest.raises(UsageError, match=re.escape(said)):
            held_jobs.controller_pid(running)
    history.record(home, entry(tmp_path, "a", state="running", ended=None, cluster="dev",
                               kind="exec", controller=Process.me()))
    history.record(home, entry(tmp_path, "b", state="queued", ended=None, cluster="dev",
                               kind="exec", started=2000.0, controller=Process.me()))
    history.record(home, entry(tmp_path, "c", cluster="dev", kind="exec", started=500.0))
    assert held_jobs.to_cancel(home, "dev", None).id == "a"
    assert held_jobs.to_cancel(home, "dev", "b").id == "b"
    with pytest.raises(UsageError, match="^JOB: no job c runs or waits on dev"):
        held_jobs.to_cancel(home, "dev", "c")
    with pytest.raises(UsageError, match="^JOB: no job runs on other$"):
        held_jobs.to_cancel(home, "other", None)


def test_the_terminal_is_spared_harmless_lines_and_stack_frames():
    """Issue 66 (7): torch's c10d hostname line on every rehearsal and Slurm job, and C++
    frames streamed to the terminal; they stay in the node's log."""
    from sortie.engine.recovery import StepTracker
    from tests.helpers import Recorder

    said = Recorder()
    tracker = StepTracker(said, [], "exp")
    for line in ["[W1129 socket.cpp:755] [c10d] The hostname of the client socket cannot be "
                 "retrieved. err=-3",
                 "step 3/8  loss 1.0",
                 "terminate called after throwing an instance of 'c10::Error'",
                 "Exception raised from recvBytes at socket.cpp:670 (most recent call first):",
                 "frame #0: c10::Error::Error() + 0x9a (0x7f in libc10.so)",
                 "frame #1: <unknown function> + 0x51 (0x7f in libtorch_cpu.so)",
                 "<omitting python frames>", "", "  ", "after the frames", ""]:
        tracker("node-1", line)
    assert said.lines == [
        "node-1 | step 3/8  loss 1.0",
        "node-1 | terminate called after throwing an instance of 'c10::Error'",
        "node-1 | [sortie] a C++ stack trace: its frames are in this node's log (`sortie logs "
        "exp node-1`)", "node-1 | after the frames", "node-1 | "]
    assert tracker.last_step == 3


def test_a_job_that_stopped_for_a_notice_is_preempted_even_when_its_machine_went_first():
    """CI, under load: the rehearsal took node-1 (15 s after its notice) before the controller
    looked, and the recovery said "machine gone" though the job had exited 75 for the notice."""
    from types import SimpleNamespace

    from sortie.engine.recovery import find_lost
    from sortie.stacks.backend import Lost

    def found(lost: Lost, codes: dict[str, int | None]) -> tuple[list[str] | None, str]:
        backend = SimpleNamespace(lost_nodes=lambda inventory: lost, preemption_notice_s=0.0)
        result = RunResult(run_id="r", nodes=2, ranks=2, artifacts=Path("runs/r"),
                           exit_codes=codes)
        return find_lost(backend, SimpleNamespace(), result)  # type: ignore[arg-type]

    assert found(Lost(["node-1"]), {"node-0": 1, "node-1": 75}) == (["node-1"], "preempted")
    assert found(Lost(["node-1"]), {"node-0": 1, "node-1": 1}) == (["node-1"], "machine gone")
    # A reason the backend knows better (Slurm's) stays its own.
    assert found(Lost(["node-1"], "time limit"), {"node-1": 75}) == (["node-1"], "time limit")


def test_budget_unset_says_what_it_removed(tmp_path: Path):
    """Issue 66 (7): `budget unset` printed nothing."""
    from tests.helpers import cli

    env = {"SORTIE_HOME": str(tmp_path / "home")}
    assert cli("budget", "set", "ana", "--monthly", "2000", cwd=tmp_path, env=env).returncode == 0
    unset = cli("budget", "unset", "ana", cwd=tmp_path, env=env)
    assert unset.returncode == 0 and unset.stdout == "ana: budget removed (was $2,000.00 a month)\n"
    again = cli("budget", "unset", "ana", cwd=tmp_path, env=env)
    assert again.returncode == 2 and "OWNER: 'ana' has no budget" in again.stderr
