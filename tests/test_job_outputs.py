"""Nothing a job makes is lost or mistaken (issue 60): what a user's job writes in its workdir is
collected by default (the rest named, with its size and the flag that keeps it), and a run lists
only files it wrote, never an earlier run's."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from sortie.bootstrap.job_outputs import (
    CUT,
    Listed,
    NewFile,
    OutsideLook,
    _find_outside,
    choose,
    glob_regex,
    left_line,
    named_by,
    outside_line,
    outside_records,
    unmatched,
)
from tests.helpers import (
    assert_nothing_left,
    loopback_listeners,
    needs_boot,
    needs_sshd,
    sortie,
)


def new(node: str, path: str, size: int, named: bool = False, mtime: str = "1.5") -> NewFile:
    return NewFile(node, path, size, mtime, named)


@pytest.mark.unit
def test_globs_first_then_the_smallest_within_the_cap_and_shared_files_once():
    both = frozenset({"node-0", "node-1"})
    head = Listed([new("node-0", "outputs/model.pt", 900), new("node-0", "big.bin", 5000),
                   new("node-0", "log.txt", 50), new("node-0", "ckpt.pt", 7000, named=True)],
                  node="node-0", sees=both)
    # node-1 shares node-0's disk (each sees the other's directory): its copy (same path,
    # size, time) is node-0's file.
    other = Listed([new("node-1", "outputs/model.pt", 900), new("node-1", "rank2.json", 10)],
                   node="node-1", sees=both)
    chosen = choose([head, other], most_bytes=900)
    assert [f.path for f in chosen.taken] == ["ckpt.pt", "rank2.json", "log.txt"]
    assert [(f.node, f.path) for f in chosen.left] == [("node-0", "outputs/model.pt"),
                                                       ("node-0", "big.bin")]
    assert chosen.on("node-1") == [new("node-1", "rank2.json", 10)]
    assert choose([head], most_bytes=0).taken == [new("node-0", "ckpt.pt", 7000, named=True)]
    # Disks of their own (each sees its own directory alone, or one sees the other's that a
    # disk kept): a file both wrote alike is each node's. Before: node-1's was dropped unsaid.
    for sees in (frozenset({"node-1"}), both):
        apart = Listed(other.files, node="node-1", sees=sees)
        alone = Listed(head.files, node="node-0", sees=frozenset({"node-0"}))
        chosen = choose([alone, apart], most_bytes=1 << 20)
        assert [f.node for f in chosen.taken if f.path == "outputs/model.pt"] == [
            "node-0", "node-1"]


@pytest.mark.unit
def test_a_glob_that_names_no_new_file_is_found():
    listed = [Listed(files=[NewFile("node-0", "output/model.pt", 9, "1.0", False)]),
              Listed(files=[NewFile("node-1", "logs/x.txt", 9, "1.0", False)])]
    assert unmatched(("outputs/*.pt", "output", "logs/*.txt", "*.pt"), listed) == \
        ["outputs/*.pt", "*.pt"]


@pytest.mark.unit
def test_artifact_globs_read_as_pythons_glob_and_name_what_is_below_a_directory():
    globs = [glob_regex(p) for p in ("outputs/*.pt", "ckpt", "**/*.json", "r[!x]n?.txt")]
    assert named_by("outputs/model.pt", globs) and not named_by("outputs/sub/model.pt", globs)
    assert named_by("ckpt/step-1/state.pt", globs), "a directory brings back all below it"
    assert named_by("a/b/c.json", globs) and named_by("c.json", globs)
    assert named_by("run1.txt", globs) and not named_by("rxn1.txt", globs)
    assert not named_by("ckpt2/x", globs) and not named_by("outputs/model.ptx", globs)


@pytest.mark.unit
def test_what_is_left_is_one_line_with_its_size_and_the_flag_that_keeps_it():
    left = [new("node-0", "outputs/model.pt", 3 << 30), new("node-1", "a.txt", 10),
            new("node-0", "b.txt", 20), new("node-0", "c.txt", 30)]
    line = left_line(left, 1 << 30, "they go with the cluster")
    assert line is not None and "\n" not in line
    assert line.startswith("not collected (over the 1.0 GiB of new files collected a run): "
                           "4 files the job wrote, 3.0 GiB: outputs/model.pt (3.0 GiB, "
                           "node-0), c.txt (30 B, node-0), b.txt (20 B, node-0) and 1 more")
    assert line.endswith("they go with the cluster; --collect-max 5G (or --artifact GLOB) "
                         "keeps them")
    assert "--no-collect" in (left_line(left[1:], 0, "x") or "")
    assert left_line([], 1 << 30, "x") is None


@pytest.mark.unit
def test_an_empty_workdir_is_recorded_with_nothing_to_copy(tmp_path: Path):
    """Before: a run of an empty workdir (a new project, `--run 'nvidia-smi'`) ended in a
    traceback writing code/.sortieignore, the run's code/ never made."""
    from sortie.bootstrap.workdir import SyncPlan
    from sortie.engine.job_files import write_code

    (tmp_path / "empty").mkdir()
    write_code(SyncPlan(tmp_path / "empty", (), 0, "no ignore file"), tmp_path / "run")
    assert json.loads((tmp_path / "run" / "code.json").read_text())["files"] == {}
    assert (tmp_path / "run" / "code" / ".sortieignore").is_file(), "a re-run sends what is there"


@pytest.mark.unit
def test_what_came_back_is_named_the_largest_first_and_no_log_of_sorties(tmp_path: Path):
    """Before: the summary said "4 files, SHA-256 verified" (two of them the nodes' logs) and
    not which, nor where the model a new user's script saved had gone."""
    from sortie.bootstrap.verified_copy import Artifact
    from sortie.rundir.result import RunResult

    def artifact(path: str, size: int) -> Artifact:
        return Artifact(path=path, bytes=size, sha256="0" * 64, node="node-0")

    result = RunResult(run_id="r", nodes=2, ranks=4, artifacts=tmp_path)
    assert result.kept_files() is None
    result.collected = [artifact("logs/node-0.log", 9 << 20), artifact("setup/node-0.log", 99),
                        artifact("artifacts/a.txt", 10)]
    assert result.kept_files() == "artifacts/a.txt (1 file, 10 B)"
    result.collected += [artifact("artifacts/checkpoints/model.pt", 3 << 20),
                         artifact("nodes/node-1/outputs/b.txt", 10),
                         artifact("artifacts/" + "d/" * 60 + "deep.txt", 5),
                         artifact("artifacts/z.txt", 1)]
    assert result.kept_files(shown=3) == (
        "artifacts/checkpoints/model.pt, artifacts/a.txt, nodes/node-1/outputs/b.txt and 2 more "
        "(5 files, 3.0 MiB)")
    deep = (result.kept_files(shown=4) or "").split(", ")[3].split(" and ")[0]
    assert deep.startswith("artifacts/d/") and deep.endswith("d/deep.txt") and "…" in deep
    assert len(deep) == 80, "a long path shortened, its file's name kept"
    # A checkpoint's directory is one entry (its shards and each rank's RNG would have filled
    # the row, the model the job saved named after them); a file of checkpoints/ itself is one.
    result.collected = [artifact("artifacts/model.pt", 2 << 20),
                        *(artifact(f"checkpoints/step-00000060/rng-rank{rank}.pt", 1 << 20)
                          for rank in range(4)),
                        artifact("checkpoints/latest.txt", 3)]
    assert result.kept_files() == ("checkpoints/step-00000060/ with 4 files, artifacts/model.pt, "
                                   "checkpoints/latest.txt (6 files, 6.0 MiB)")


@pytest.mark.unit
def test_what_the_job_wrote_outside_is_named_and_a_look_cut_short_is_said():
    """A model saved to ~/model.pt on a machine the teardown destroys is named; a node whose
    look ran out of time (a $HOME of millions of files) or failed may hold more: said, never
    taken for "nothing there"."""
    files = [new("node-0", "/root/model.pt", 3 << 20), new("node-1", "/tmp/x.log", 10)]
    whole = outside_line([OutsideLook("node-0", files[:1]), OutsideLook("node-1", files[1:])],
                         "they go with the cluster")
    assert whole == ("the job wrote 2 files outside its workdir, not collected (only the "
                     "workdir is): /root/model.pt (3.0 MiB, node-0), /tmp/x.log (10 B, node-1); "
                     "they go with the cluster; save into the workdir (or $SORTIE_ARTIFACT_DIR) "
                     "what is to come back")
    cut = OutsideLook("node-1", [], "the look stopped after 60 s")
    partial = outside_line([OutsideLook("node-0", files[:1]), cut], "x")
    assert partial is not None and partial.startswith("the job wrote 1+ file outside")
    assert "(node-1: the look stopped after 60 s)" in partial
    nothing_seen = outside_line([OutsideLook("node-0", []), cut], "they go with the cluster")
    assert nothing_seen is not None and "\n" not in nothing_seen
    assert nothing_seen.startswith("the job may have written files outside its workdir that "
                                   "were not looked at (node-1: the look stopped after 60 s;")
    assert "they go with the cluster" in nothing_seen
    assert outside_line([OutsideLook("node-0", [])], "x") is None


# Rank 0's node writes a model (the way torch.save does) and a copy that keeps an old time
# (shutil.copy2: still this run's file); node 1 writes a log of its own; both write a file of
# one path, size and time (as every node saving at one step does, times as coarse as a clock
# tick), each its own; FAIL makes a run fail before it writes anything, as an interrupted run
# would.
JOB = """\
workdir: .
run: |
  if [ -n "$FAIL" ]; then echo failing early; exit 3; fi
  mkdir -p outputs
  echo "node $SORTIE_NODE_RANK" > outputs/each.txt && touch -d @1700000000 outputs/each.txt
  if [ $SORTIE_NODE_RANK = 0 ]; then
    head -c 3000 /dev/urandom > outputs/model.pt
    $SORTIE_PYTHON -c "import shutil; shutil.copy2('input.txt', 'outputs/copied.txt')"
    head -c 200000 /dev/urandom > outputs/big.bin
  else
    echo node one > outputs/node1.txt
  fi
"""


@needs_sshd
@pytest.mark.e2e
def test_a_held_clusters_runs_each_own_only_what_they_wrote(sortie_home: Path, tmp_path: Path):
    before = loopback_listeners()
    code = tmp_path / "project"
    code.mkdir()
    (code / "job.yaml").write_text(JOB)
    (code / "input.txt").write_text("an input, older than any run\n")
    os.utime(code / "input.txt", (1_000_000_000, 1_000_000_000))
    assert sortie("up", "--nodes", "2", "--name", "own", cwd=tmp_path).returncode == 0
    first = sortie("exec", "own", str(code / "job.yaml"), "--collect-max", "100K", "--json",
                   cwd=tmp_path)
    assert first.returncode == 0, first.stderr
    run = tmp_path / json.loads(first.stdout)["artifacts"]
    listed = {f["path"] for f in json.loads((run / "manifest.json").read_text())["files"]}
    assert {"artifacts/outputs/model.pt", "artifacts/outputs/copied.txt",
            "nodes/node-1/outputs/node1.txt"} <= listed, "collected without --artifact"
    # Before: node-1's was taken for node-0's (one path, size and time), and left unsaid.
    assert (run / "artifacts" / "outputs" / "each.txt").read_text() == "node 0\n"
    assert (run / "nodes" / "node-1" / "outputs" / "each.txt").read_text() == "node 1\n"
    assert not {"artifacts/job.yaml", "artifacts/input.txt"} & listed, "synced, not written"
    assert "artifacts/outputs/big.bin" not in listed, "over --collect-max"
    said = " ".join(first.stderr.split())
    assert ("not collected (over the 100.0 KiB of new files collected a run): 1 file the job "
            "wrote, 195.3 KiB: outputs/big.bin (195.3 KiB, node-0); they stay on own under "
            in said and "--collect-max 1M (or --artifact GLOB) keeps them" in said)
    assert json.loads(first.stdout)["left_on_nodes"] == ["node-0: outputs/big.bin (200000 bytes)"]
    model = (run / "artifacts" / "outputs" / "model.pt").read_bytes()

    # A run that fails before it writes: the earlier run's model is still on the node, and
    # none of it is this run's (before: listed, "verified", as its own).
    (code / "fail.yaml").write_text(JOB.replace("workdir: .", "workdir: .\nenv: {FAIL: '1'}"))
    failed = sortie("exec", "own", str(code / "fail.yaml"), "--artifact", "outputs/*", "--json",
                    cwd=tmp_path)
    assert failed.returncode == 1
    second = tmp_path / json.loads(failed.stdout)["artifacts"]
    files = json.loads((second / "manifest.json").read_text())["files"]
    assert [f["path"] for f in files] == ["logs/node-0.log", "logs/node-1.log"]
    # ... and it says so of the glob (before: nothing said that it named no file of this run).
    assert "artifacts 'outputs/*' named no file the job wrote (in its workdir, since it " \
        "started): nothing of it comes back" in " ".join(failed.stderr.split()), failed.stderr
    disk = sortie_home / "clusters" / "own" / "nodes" / "node-0" / "disk" / "job"
    assert (disk / "outputs" / "model.pt").read_bytes() == model, "the held cluster keeps it"

    third = sortie("exec", "own", str(code / "job.yaml"), "--no-collect", "--json",
                   cwd=tmp_path)
    assert third.returncode == 0, third.stderr
    assert "not collected (--no-collect): 6 files the job wrote" in " ".join(third.stderr.split())
    assert sortie("down", "own", cwd=tmp_path).returncode == 0
    assert_nothing_left(sortie_home, before)


@pytest.mark.unit
def test_a_log_tail_keeps_the_line_that_names_the_failure(tmp_path: Path):
    """Before: the report's last 20 lines were C++ frames; `terminate called …` was cut off."""
    from sortie.rundir.report import log_tail

    log = tmp_path / "node-1.log"
    frames = [f"frame #{n}: <unknown function> + 0x{n:x}" for n in range(40)]
    log.write_text("\n".join(["step 8/8", "terminate called without an active exception",
                              *frames]) + "\n")
    tail = log_tail(log, 20)
    assert len(tail) == 20 and tail[0] == "terminate called without an active exception"
    assert tail[1] == "[… 22 lines …]" and tail[2:] == frames[-18:]
    log.write_text("\n".join(f"step {n}/50" for n in range(50)) + "\n")
    assert log_tail(log, 20) == [f"step {n}/50" for n in range(30, 50)], "nothing to keep"
    # A progress bar's redraws are its last state: the lines before it are not pushed out.
    bar = "".join(f"\r{n}/1000 batches" for n in range(1, 401))
    log.write_text("loading data\n" + bar + "Traceback (most recent call last):\n"
                   "ValueError: bad batch\n")
    assert log_tail(log, 20) == ["loading data", "400/1000 batchesTraceback (most recent call "
                                 "last):", "ValueError: bad batch"]


@pytest.mark.e2e
def test_arguments_after_dashes_replace_the_tasks_args(tmp_path: Path):
    """Before: `sortie run runs/<id>/task.yaml -- --epochs 5` ran `--epochs 3 --epochs 5`."""
    from sortie.engine.task import Task, resolve_job

    (tmp_path / "train.py").write_text("")
    task = Task(workdir=tmp_path, script="train.py", args=("--epochs", "3"))
    assert resolve_job(task).command.script_args == ("--epochs", "3")
    replaced = resolve_job(task, passthrough=("--epochs", "5"))
    assert replaced.command.script_args == ("--epochs", "5")
    assert replaced.command.describe() == "your script train.py --epochs 5"


def wheel_project(tmp_path: Path, task: str) -> Path:
    """A workdir holding a wheel of one module, made here (no index is reached), and ``task``
    (whose setup installs it): the task file's path."""
    import zipfile

    code = tmp_path / "project"
    code.mkdir()
    wheel = code / "tinypkg_sortie-1.0-py3-none-any.whl"
    info = "tinypkg_sortie-1.0.dist-info"
    files = {"tinypkg_sortie.py": "VALUE = 42\n",
             f"{info}/METADATA": "Metadata-Version: 2.1\nName: tinypkg-sortie\nVersion: 1.0\n",
             f"{info}/WHEEL": "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\n"
                              "Tag: py3-none-any\n"}
    with zipfile.ZipFile(wheel, "w") as archive:
        for name, text in files.items():
            archive.writestr(name, text)
        archive.writestr(f"{info}/RECORD", "".join(f"{name},,\n" for name in files)
                         + f"{info}/RECORD,,\n")
    (code / "task.yaml").write_text(task)
    return code / "task.yaml"


@needs_sshd
@pytest.mark.e2e
def test_setup_installs_into_the_jobs_own_environment_never_sorties(sortie_home: Path,
                                                                    tmp_path: Path):
    """Before: local nodes' $SORTIE_PYTHON was the controller's venv, so the docs' own setup
    (`$SORTIE_PYTHON -m pip install -r requirements.txt`) changed sortie's environment."""
    import importlib.util
    import sys

    task = wheel_project(
        tmp_path, "workdir: .\nsetup: $SORTIE_PYTHON -m pip install --no-index --no-deps "
        "./tinypkg_sortie-1.0-py3-none-any.whl\n"
        "run: python -c 'import tinypkg_sortie, torch, sys; print(\"env\", sys.prefix, "
        "tinypkg_sortie.VALUE)'; test \"$(command -v pip)\" = \"$VIRTUAL_ENV/bin/pip\"\n")
    done = sortie("run", "--nodes", "1", str(task), "--name", "env", "--json", cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    said = " ".join(done.stderr.split())
    assert "your job's own Python environment made on node-0" in said
    assert "setup ran on node-0; its output: runs/env/setup/<node>.log" in said
    setup_log = (tmp_path / "runs" / "env" / "setup" / "node-0.log").read_text()
    assert "Successfully installed tinypkg-sortie-1.0" in setup_log
    job_log = (tmp_path / "runs" / "env" / "logs" / "node-0.log").read_text()
    assert "/disk/env 42" in job_log, job_log
    assert importlib.util.find_spec("tinypkg_sortie") is None
    assert not list(Path(sys.prefix).rglob("tinypkg_sortie*")), "sortie's own venv unchanged"


@needs_sshd
@pytest.mark.e2e
def test_a_recorded_task_reruns_the_code_it_ran_or_says_which_files_differ(sortie_home: Path,
                                                                          tmp_path: Path):
    """Before: `sortie run runs/<id>/task.yaml` after an edit ran the edited code, unsaid; a task
    file with `name:` could not run twice ("--name 'again': ... choose another name"); runs
    were found only from the directory that held them (now: `sortie runs`, and a run id
    anywhere)."""
    code = tmp_path / "project"
    code.mkdir()
    (code / "msg.txt").write_text("first version\n")
    (code / "task.yaml").write_text("name: again\nworkdir: .\nrun: cat msg.txt\n")
    for expected in ("again", "again-2"):
        done = sortie("run", "--nodes", "1", str(code / "task.yaml"), "--json", cwd=tmp_path)
        assert done.returncode == 0, done.stderr[-2000:]
        assert json.loads(done.stdout)["run_id"] == expected
    run = tmp_path / "runs" / "again"
    assert (run / "code" / "msg.txt").read_text() == "first version\n"
    (code / "msg.txt").write_text("edited since\n")
    (code / "new.py").write_text("")
    # Run again by its id, from another directory: the run history finds its task.yaml.
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    rerun = sortie("run", "again", "--json", cwd=elsewhere)
    assert rerun.returncode == 0, rerun.stderr[-2000:]
    said = " ".join(rerun.stderr.split())
    assert (f"workdir {code} differs from the code run again ran (msg.txt (changed), new.py "
            f"(new)): running that code, kept in {run / 'code'}") in said
    rerun_id = json.loads(rerun.stdout)["run_id"]
    log = elsewhere / json.loads(rerun.stdout)["artifacts"] / "logs" / "node-0.log"
    assert log.read_text().strip() == "first version"

    # Every run, listed from anywhere, with where it is; its logs and report found by id.
    listed = json.loads(sortie("runs", "--json", cwd=elsewhere).stdout)
    assert [(r["id"], r["kind"], r["state"], r["directory"]) for r in listed] == [
        ("again", "run", "succeeded", str(run)),
        ("again-2", "run", "succeeded", str(tmp_path / "runs" / "again-2")),
        (rerun_id, "run", "succeeded", str(elsewhere / "runs" / rerun_id))]
    logs = sortie("logs", "again", cwd=elsewhere)
    assert logs.returncode == 0 and logs.stdout.strip() == "node-0 | first version", logs.stderr
    report = sortie("report", "again-2", cwd=elsewhere)
    assert report.returncode == 0 and report.stdout.strip() == \
        str(tmp_path / "runs" / "again-2" / "report.html"), report.stderr

    # A run that kept no copy (its code was over the cap) cannot run that code: one line.
    record = json.loads((run / "code.json").read_text())
    (run / "code.json").write_text(json.dumps({**record, "copied": False}))
    runs_before = sorted(p.name for p in (tmp_path / "runs").iterdir())
    refused = sortie("run", str(run / "task.yaml"), cwd=tmp_path)
    assert refused.returncode == 2
    assert refused.stderr.strip() == (
        f"sortie: error: workdir: {code} differs from the code run again ran (msg.txt (changed), "
        "new.py (new)) and the run kept no copy (over 64 MiB): restore those files, or give "
        f"--workdir {code} to run the code as it is now")
    assert sorted(p.name for p in (tmp_path / "runs").iterdir()) == runs_before


@pytest.mark.unit
def test_an_abort_after_training_is_said_with_the_line_that_names_it(tmp_path: Path):
    """Before: "training failed on node-1 (exit 1)", and the report's tail was C++ frames."""
    from sortie.rundir.result import RunResult

    result = RunResult(run_id="r", nodes=2, ranks=4, artifacts=tmp_path,
                       exit_codes={"node-0": 0, "node-1": 1}, first_failed="node-1",
                       failure_tail=["terminate called without an active exception",
                                     "[… 30 lines …]", "frame #31: _start + 0x21",
                                     "  traceback : Signal 6 (SIGABRT) received by PID 19602"],
                       last_step_line="step 8/8")
    failure = result.failure() or ""
    assert failure.startswith("training failed on node-1 (exit 1): a process of the job aborted "
                              "('terminate called without an active exception') after training "
                              "(step 8/8): a known torch/gloo abort at the process's exit "
                              "(docs/your-job.md); logs in "), failure
    result.last_step_line = None  # it never finished: no word of "after training"
    assert "after training" not in (result.failure() or "")
    # The abort is said of the node whose log shows it, never of one sortie stopped after
    # (before: "...; stopped by sortie: node-0: a process of the job aborted (...)").
    result.stopped, result.exit_codes = ["node-0"], {"node-0": None, "node-1": 1}
    assert (result.failure() or "").startswith(
        "training failed on node-1 (exit 1): a process of the job aborted ('terminate called "
        "without an active exception'); stopped by sortie: node-0; logs in "), result.failure()
    result.stopped, result.exit_codes = [], {"node-0": 1, "node-1": 1}
    assert (result.failure() or "").startswith(
        "training failed on node-1 first (exit 1), node-0 (exit 1): a process of the job on "
        "node-1 aborted ("), result.failure()
    result.failure_tail = ["Traceback (most recent call last):", "ValueError: bad"]
    assert "aborted" not in (result.failure() or "")


@pytest.mark.unit
@pytest.mark.parametrize("said", [
    "train.py: error: the following arguments are required: --local_rank",
    "[rank1]: train.py: error: unrecognized arguments: --local-rank=1"])
def test_a_script_written_for_the_old_launcher_is_told_of_local_rank(tmp_path: Path, said: str):
    """Before: "training failed on node-0 (exit 2)", argparse's line in the log only."""
    from sortie.rundir.result import RunResult

    result = RunResult(run_id="r", nodes=1, ranks=2, artifacts=tmp_path,
                       exit_codes={"node-0": 2}, first_failed="node-0",
                       failure_tail=["usage: train.py [-h] --local_rank LOCAL_RANK", said])
    assert (result.failure() or "").startswith(
        "training failed on node-0 (exit 2): the script takes a --local_rank flag, which "
        "torchrun does not pass (torch.distributed.launch did): it sets LOCAL_RANK in each "
        "process's environment; read that (or give the flag a default); logs in "), \
        result.failure()


@pytest.mark.unit
@pytest.mark.parametrize("said", [
    "RuntimeError: Distributed package doesn't have NCCL built in",
    "[rank0]: torch.distributed.DistBackendError: ProcessGroupNCCL is only supported with GPUs, "
    "no GPUs found!",
    "AssertionError: Torch not compiled with CUDA enabled",
    "RuntimeError: Found no NVIDIA driver on your system."])
def test_a_gpu_script_on_nodes_without_cuda_is_told_to_use_gloo(tmp_path: Path, said: str):
    """Before: a new user's DDP script (`init_process_group("nccl")`) rehearsed on local nodes
    failed with "training failed on node-0 first (exit 1)" and torch's line in the log only."""
    from sortie.rundir.result import RunResult

    result = RunResult(run_id="r", nodes=2, ranks=2, artifacts=tmp_path,
                       exit_codes={"node-0": 1, "node-1": 1}, first_failed="node-0",
                       failure_tail=["Traceback (most recent call last):", said])
    assert (result.failure() or "").startswith(
        "training failed on node-0 first (exit 1), node-1 (exit 1): on node-0, the job asks for "
        "CUDA or NCCL, which the node or its torch lacks (local and booted nodes have no GPUs; a "
        "CPU build of torch has no NCCL): where torch.cuda.is_available() is False, use gloo "
        "and the CPU (`dist.init_process_group(\"nccl\" if torch.cuda.is_available() else "
        "\"gloo\")`); logs in "), result.failure()


@pytest.mark.unit
def test_a_module_the_jobs_python_lacks_is_said_with_where_to_install_it(tmp_path: Path):
    """Before: "training failed on node-0 (exit 1)", the ModuleNotFoundError in the log only:
    a new user's script importing a package their setup never installed."""
    from sortie.rundir.result import RunResult

    result = RunResult(run_id="r", nodes=1, ranks=1, artifacts=tmp_path,
                       exit_codes={"node-0": 1}, first_failed="node-0",
                       failure_tail=["  File \"train.py\", line 3, in <module>", "[rank0]: "
                                     "ModuleNotFoundError: No module named 'transformers'"])
    assert (result.failure() or "").startswith(
        "training failed on node-0 (exit 1): the job's Python has no module 'transformers': "
        "install what provides it in the job's setup (`--setup 'pip install -r "
        "requirements.txt'`, or `setup:` in a task file; your own package in the workdir: `pip "
        "install -e .`), which runs on every node in the job's own environment (or its image) "
        "before the job; logs in "), \
        result.failure()
    # A package of the workdir's own that a script in a subdirectory imports (tried: the
    # user's shell had PYTHONPATH=.; the nodes' Python looks in src/): where it is, how to add.
    result.failure_tail = ["ModuleNotFoundError: No module named 'mypkg.models'"]
    result.workdir_files = ("README.md", "lib/x/mypkg/y.py", "mypkg/__init__.py",
                            "mypkg/models.py", "src/train.py")
    assert (result.failure() or "").startswith(
        "training failed on node-0 (exit 1): the job's Python has no module 'mypkg.models', "
        "which the workdir has (mypkg/): Python looks in the script's own directory, not the "
        "workdir; `--env PYTHONPATH=.` adds it (`env:` in a task file), or `pip install -e .` "
        "in the setup where the workdir is a package; logs in "), result.failure()
    result.workdir_files = ("lib/helpers.py", "src/train.py", "data/helpers.txt")
    result.failure_tail = ["ModuleNotFoundError: No module named 'helpers'"]
    assert "which the workdir has (lib/helpers.py): Python looks in the script's own " \
        "directory, not lib/; `--env PYTHONPATH=lib` adds it" in (result.failure() or "")
    result.workdir_files = ("src/train.py", "transformers.txt", "docs/transformers/a.md")
    result.failure_tail = ["ModuleNotFoundError: No module named 'transformers'"]
    assert "install what provides it in the job's setup" in (result.failure() or ""), \
        "not a Python file of that name: the workdir does not have it"
    # The script's own argparse refusing its arguments (before: the exits only).
    result.failure_tail = ["  usage: train.py [-h] --data DATA [--epochs EPOCHS]",
                           "  train.py: error: argument --epochs: invalid int value: 'x'",
                           "E1203 api.py:1002] failed (exitcode: 2) local_rank: 0 (pid: 7)"]
    assert (result.failure() or "").startswith(
        "training failed on node-0 (exit 1): the script refused its arguments (train.py: "
        "error: argument --epochs: invalid int value: 'x'): a job's arguments go after `--` "
        "(`sortie run ... -- --epochs 3`), a task's in `args:`; logs in "), result.failure()
    result.failure_tail = ["pip: error: no such option"]  # no usage line: not argparse's
    assert "refused its arguments" not in (result.failure() or "")
    # A DDP script a `run` line started with plain python (tried: `--run 'python train.py'`):
    # before, torch's ValueError alone; torchrun's variables are not there.
    for line, name in (("ValueError: Error initializing torch.distributed using env:// "
                        "rendezvous: environment variable RANK expected, but not set", "RANK"),
                       ("[rank0]: KeyError: 'LOCAL_RANK'", "LOCAL_RANK")):
        result.failure_tail = [line]
        assert f"(exit 1): the job's processes have no {name}, which torchrun sets in each " \
            "process it starts, and a `run` line's command is not started by it: `--script " \
            "train.py` runs the script under torchrun" in (result.failure() or ""), \
            result.failure()
    assert "refused its arguments" not in (result.failure() or "")
    result.failure_tail = ["ModuleNotFoundError: No module named 'torch'"]  # NO_TORCH's to say
    assert "no module" not in (result.failure() or "")
    # A rank the kernel killed (its out-of-memory killer, most often), as torchrun says it.
    result.failure_tail = ["E1201 api.py:1002] failed (exitcode: -9) local_rank: 0 (pid: 7) of "
                           "binary: /env/bin/python", "[sortie] torchrun: rank 1 (exit -9) failed"]
    assert "training failed on node-0 (exit 1): a process of the job was killed (SIGKILL), most " \
        "often by the kernel when the node ran out of memory" in (result.failure() or "")
    # A file the node lacks: a path of the user's own machine, or one the sync left out (data a
    # .gitignore names); before, the traceback's last line only.
    missing = "[rank0]: FileNotFoundError: [Errno 2] No such file or directory: "
    result.failure_tail = ["Traceback (most recent call last):", missing + "'/home/alice/d.bin'"]
    assert "(exit 1): the job opened '/home/alice/d.bin', which the node does not have: only " \
        "the workdir goes to the nodes" in (result.failure() or ""), result.failure()
    result.failure_tail = [missing + "'data/train.bin'"]
    assert "(exit 1): the job opened 'data/train.bin', which the node's copy of the workdir " \
        "does not have: a file the workdir's .gitignore names is not synced" in \
        (result.failure() or ""), result.failure()
    result.failure_tail = [missing + "'" + "x" * 5000 + "'", missing + "'b\x1b[2J'"]
    assert "the job opened" not in (result.failure() or ""), "unbounded or odd: not quoted"


@pytest.mark.unit
def test_a_jobs_python_without_torch_is_said_in_the_failure_line(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]):
    """Before: a script job in an image without torch failed with a traceback in sortie's own
    `trainer/torchrun.py` ("No module named 'torch'"), and the error line said only the exits."""
    import sys

    from sortie.rundir.result import RunResult
    from sortie.trainer import torchrun

    monkeypatch.setitem(sys.modules, "torch.distributed.run", None)  # its import fails
    assert torchrun.main(["--nnodes", "2", "train.py"]) == 1
    said = capsys.readouterr().err.strip()
    assert said.startswith(f"{torchrun.NO_TORCH}{sys.executable} cannot import torch ("), said
    result = RunResult(run_id="r", nodes=2, ranks=4, artifacts=tmp_path,
                       exit_codes={"node-0": 1, "node-1": 1}, first_failed="node-0",
                       failure_tail=[said])
    assert (result.failure() or "").startswith(
        "training failed on node-0 first (exit 1), node-1 (exit 1): on node-0, "
        f"{sys.executable} cannot import torch ("), result.failure()
    assert "install torch there; logs in" in (result.failure() or "")


@pytest.mark.unit
def test_a_rendezvous_port_taken_before_the_job_started_is_said_not_a_traceback(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    """The port was free when sortie chose it; another program listened there by the time the
    store's host started (seen once in CI, a local sortie's image pull between): before, node
    0's log ended in an `OSError: [Errno 98]` traceback in sortie's own torchrun.py."""
    import socket

    from sortie.rundir.result import RunResult
    from sortie.trainer import torchrun

    with socket.create_server(("127.0.0.1", 0)) as other:
        endpoint = f"127.0.0.1:{other.getsockname()[1]}"
        with pytest.raises(SystemExit) as ended:
            torchrun.bind_static_store(["--rdzv-backend=static", "--node-rank=0",
                                        f"--rdzv-endpoint={endpoint}", "train.py"])
    assert ended.value.code == 1
    said = capsys.readouterr().err.strip()
    assert said == f"{torchrun.PORT_TAKEN}{endpoint} (another program listens there)"
    result = RunResult(run_id="r", nodes=2, ranks=4, artifacts=tmp_path,
                       exit_codes={"node-0": 1, "node-1": 143}, first_failed="node-0",
                       failure_tail=["Traceback (most recent call last):", said])
    assert f"on node-0, the rendezvous port {endpoint} was taken by another program on the " \
        "head node after sortie chose it free" in (result.failure() or ""), result.failure()


@pytest.mark.unit
def test_a_local_rendezvous_port_taken_since_it_was_chosen_is_chosen_again(tmp_path: Path):
    """Local nodes share this machine's ports with every other program on it: one that took
    the port while the cluster pulled its image (CI) is left to it, and the job launched on
    another, saved for the cluster's next job. A free port, or a network of the nodes' own,
    stays as it is."""
    import socket

    from sortie.core.inventory import Inventory, Node
    from sortie.stacks.local.local_backend import LocalBackend
    from sortie.stacks.machine.loopback import is_listening

    backend = LocalBackend(home=tmp_path)
    assert backend.shared_ports() is backend
    backend.state_dir("c").mkdir(parents=True)

    def cluster(address: str, port: int) -> Inventory:
        node = Node(name="node-0", address=address, port=22, user="u", key_path=Path("/k"),
                    host_key="ssh-ed25519 AAAA", gpus=0, private_address=address, workdir="/w")
        return Inventory(cluster_id="c", backend="local", nodes=[node], rdzv_port=port)

    with socket.create_server(("127.0.1.1", 0)) as other:  # where the head's store binds
        taken = other.getsockname()[1]
        assert is_listening("127.0.1.1", taken)
        moved = backend.rendezvous_for_launch(cluster("127.0.1.1", taken))
        assert moved.rdzv_port != taken and not is_listening("127.0.1.1", moved.rdzv_port)
        assert backend.inventory("c").rdzv_port == moved.rdzv_port  # the next job's too
        assert backend.rendezvous_for_launch(moved) is moved
        own_network = cluster("10.77.0.2", taken)
        assert backend.rendezvous_for_launch(own_network) is own_network


@pytest.mark.unit
def test_torchruns_store_host_leaves_last_and_the_others_at_once(monkeypatch: pytest.MonkeyPatch):
    """After the exit barrier each agent counts itself out on the rendezvous store (a real
    TCPStore here, in this process); the host waits for all, the others leave at once. Before:
    every agent waited on the count, and one still asking as the host left logged the store's
    "recvValue failed ... Connection was likely closed" after a job that succeeded (4 of 12
    runs of a user's 2 x 2 script; 0 of 12 after)."""
    import threading
    import time
    from types import SimpleNamespace

    from torch.distributed import TCPStore
    from torch.distributed.elastic.agent.server.api import SimpleElasticAgent

    from sortie.trainer import torchrun

    def agent(store: TCPStore, hosting: bool) -> threading.Thread:
        """One agent past the barrier, counting itself out (in a thread: it may wait)."""
        monkeypatch.setattr(SimpleElasticAgent, "_exit_barrier", lambda self: None)
        torchrun.leave_after_every_agent(hosting)
        me = SimpleNamespace(_worker_group=SimpleNamespace(group_world_size=2), _store=store)
        thread = threading.Thread(target=SimpleElasticAgent._exit_barrier, args=(me,))
        thread.start()
        return thread

    for first in ("other", "host"):
        host_store = TCPStore("127.0.0.1", 0, 2, True, wait_for_workers=False)
        other_store = TCPStore("127.0.0.1", host_store.port, 2, False)
        if first == "other":  # it leaves at once, the host not yet counted (before: it waited)
            other = agent(other_store, False)
            other.join(torchrun.DEPART_WAIT_S / 2)
            assert not other.is_alive() and host_store.add(torchrun.DEPARTED_KEY, 0) == 1
            host = agent(host_store, True)
        else:  # the host waits for the other, then leaves
            host = agent(host_store, True)
            time.sleep(0.3)
            assert host.is_alive() and host_store.add(torchrun.DEPARTED_KEY, 0) == 1
            other = agent(other_store, False)
        for thread in (host, other):
            thread.join(torchrun.DEPART_WAIT_S / 2)
            assert not thread.is_alive()
        assert host_store.add(torchrun.DEPARTED_KEY, 0) == 2


@needs_boot
@pytest.mark.e2e
@pytest.mark.timeout(600)
def test_a_booted_nodes_job_installs_into_its_own_environment(sortie_home: Path, tmp_path: Path,
                                                             monkeypatch: pytest.MonkeyPatch):
    """A booted node reaches the controller's Python through a read-only bind: its job's own
    environment is made inside the node, and what setup installs lands there."""
    from sortie.stacks.booted.image import build_image
    from sortie.stacks.booted.nodes import NODES_ENV

    build_image(print)  # kept: `make test` built it
    monkeypatch.setenv(NODES_ENV, "booted")
    task = wheel_project(
        tmp_path, "workdir: .\nsetup: pip install --no-index --no-deps "
        "./tinypkg_sortie-1.0-py3-none-any.whl\n"
        "run: python -c 'import tinypkg_sortie, sys; print(\"env\", sys.prefix, "
        "tinypkg_sortie.VALUE)' > $SORTIE_ARTIFACT_DIR/where.txt\n")
    done = sortie("run", "--nodes", "1", str(task), "--name", "bootenv", "--json",
                  cwd=tmp_path, timeout=500)
    assert done.returncode == 0, done.stderr[-3000:]
    where = (tmp_path / "runs" / "bootenv" / "artifacts" / "where.txt").read_text()
    assert where.startswith("env ") and where.rstrip().endswith("/env 42"), where
    assert "Successfully installed tinypkg-sortie-1.0" in \
        (tmp_path / "runs" / "bootenv" / "setup" / "node-0.log").read_text()


@pytest.mark.e2e  # git is asked of the workdir
def test_a_takeover_reads_the_job_from_its_record_alone(tmp_path: Path):
    """Issue 65 (4): a relaunch after a takeover read `runs/<id>/task.yaml` again and rebuilt
    the job from it (its setup fingerprint recomputed: without the workdir, from no inputs).
    Now the backend's record (`job.json`) holds what a relaunch needs: the same command, setup
    fingerprint and artifacts come back with task.yaml gone, and the files from the run's copy."""
    from sortie.core.job import Job
    from sortie.engine.job_files import recorded_user_job, write_task
    from sortie.engine.request import RunRequest
    from sortie.engine.task import Task, resolve_job
    from sortie.rundir.result import RunResult

    code = tmp_path / "code"
    code.mkdir()
    (code / "train.py").write_text("print('hi')\n")
    (code / "requirements.txt").write_text("tqdm\n")
    task = Task(workdir=code, script="train.py", setup="pip install -r requirements.txt",
                setup_inputs=("requirements.txt",), artifacts=("outputs/*",),
                secrets=("HF_TOKEN",), overrides=("nodes=2",))
    user = resolve_job(task, environ={"HF_TOKEN": "hf_s3cret"})
    runs = tmp_path / "runs"
    request = RunRequest(nodes=2, procs_per_node=1, runs_dir=runs, user_job=user)
    write_task(request, RunResult(run_id="r1", nodes=2, ranks=2, artifacts=runs / "r1"))
    record = request.job("r1").model_dump_json()
    assert "hf_s3cret" not in record  # secrets by name only
    (runs / "r1" / "task.yaml").unlink()
    (code / "train.py").write_text("raise SystemExit(3)\n")  # edited since: the copy runs

    job = Job.model_validate_json(record)
    assert job.is_user_job and job.overrides == ("nodes=2",)
    again = recorded_user_job(job, {"HF_TOKEN": "hf_s3cret"})
    assert again is not None and again.command == user.command
    assert again.setup_fingerprint == user.setup_fingerprint and again.setup == task.setup
    assert again.artifacts == ("outputs/*",) and again.secrets == {"HF_TOKEN": "hf_s3cret"}
    assert again.files is not None and again.files.root == (runs / "r1" / "code").resolve()
    assert (again.files.root / "train.py").read_text() == "print('hi')\n"
    # reap only collects: no secret and no code needed, the same record.
    collected = recorded_user_job(job, {}, relaunch=False)
    assert collected is not None and collected.files is None
    assert collected.setup_fingerprint == user.setup_fingerprint


@pytest.mark.e2e
@pytest.mark.skipif(os.geteuid() != 0, reason="a data disk is mounted: needs root")
def test_what_the_job_wrote_on_a_data_disk_is_found_and_nothing_older_or_anothers(
        tmp_path: Path) -> None:
    """A checkpoint saved to the node's local NVMe (an instance store, a cloud's temporary
    disk), or beside the workdir (`../model.pt`), goes with the machine like one in $HOME:
    before, only $HOME and /tmp were looked in, so it went unsaid. A real ext4 disk, mounted
    in a mount namespace of the test's own (nothing on this machine sees it); the node's
    listing script as it runs."""
    if not shutil.which("mkfs.ext4") or not shutil.which("unshare"):
        pytest.skip("needs mkfs.ext4 and unshare (e2fsprogs, util-linux)")
    image, disk, home, scratch, own = (tmp_path / n for n in ("disk.img", "nvme", "home", "tmp",
                                                              "sortie-node"))
    for directory in (disk, home, scratch, own / "job", own / "nodes" / "node-0"):
        directory.mkdir(parents=True)
    with image.open("wb") as out:
        out.truncate(16 << 20)
    subprocess.run(["mkfs.ext4", "-q", str(image)], check=True)
    marker = tmp_path / "started"
    script = (f"mount -o loop {image} {disk} || exit 99\n"
              f"mkdir {disk}/ckpt {disk}/.cache && echo old > {disk}/ckpt/older.pt\n"
              f"echo other > {disk}/ckpt/anothers.pt && chown 65534 {disk}/ckpt/anothers.pt\n"
              f"touch -d '1 minute ago' {disk}/ckpt/older.pt {disk}/ckpt/anothers.pt && "
              f"touch {marker} && sleep 0.05\n"  # (the marker: the run starts here)
              f"head -c 4096 /dev/zero > {disk}/ckpt/model.pt; touch {disk}/.cache/x\n"
              # Beside the workdir (a job's `../model.pt`), and sortie's own parts there.
              f"echo 1 > {own}/beside.pt; echo 2 > {own}/job/out.pt; "
              f"echo 3 > {own}/nodes/node-0/torchrun.log\n"
              + _find_outside(str(own), str(marker)))
    listed = subprocess.run(["unshare", "--mount", "--propagation", "private", "sh", "-c",
                             script], capture_output=True, timeout=120,
                            env={**os.environ, "HOME": str(home), "TMPDIR": str(scratch)})
    if listed.returncode == 99:
        pytest.skip(f"no loop device to mount a disk on: {listed.stderr.decode().strip()}")
    fields = listed.stdout.decode().split("\0")
    found = dict(zip(fields[1::2], fields[0:-1:2], strict=False))
    assert found.get(f"{disk}/ckpt/model.pt") == "4096", (found, listed.stderr)
    assert found.get(f"{own}/beside.pt") == "2", found
    # Older than the run, another user's, a hidden cache, the workdir's own files (listed
    # apart), sortie's: never among these.
    assert not {f"{disk}/ckpt/older.pt", f"{disk}/ckpt/anothers.pt", f"{disk}/.cache/x",
                f"{own}/job/out.pt", f"{own}/nodes/node-0/torchrun.log"} & set(found), found
    assert not outside_records(listed.stdout.decode())[1], fields  # it looked everywhere
    # A look that runs out of time (here at once, in a $HOME of 5,000 files) says so last.
    cut = subprocess.run(["sh", "-c", f"mkdir {tmp_path}/many && cd {tmp_path}/many && "
                          "seq 5000 | xargs touch\n" + _find_outside(str(own), str(marker),
                                                                      limit_s=0.001)],
                         capture_output=True, timeout=120,
                         env={**os.environ, "HOME": str(tmp_path), "TMPDIR": str(scratch)})
    assert cut.stdout.decode().endswith(f"\0{CUT}\0") and \
        outside_records(cut.stdout.decode())[1], cut


@pytest.mark.unit
def test_a_look_cut_within_a_record_lists_no_file_of_a_shorter_name():
    """Seen in CI under load: the look's timeout cut find's output within a path (find writes a
    buffer at a time), and the cut's marker, run on to it, read as part of a file's name; the
    look then said it had looked everywhere, and named a file that is not there."""
    whole = "4096\0/mnt/ckpt/model.pt\0" "2\0/home/u/beside.pt\0"
    assert outside_records(whole) == ({"/mnt/ckpt/model.pt": 4096, "/home/u/beside.pt": 2},
                                      False)
    for cut_at in range(len("4096\0/mnt/ckpt/model.pt\0"), len(whole) + 1):
        found, cut = outside_records(whole[:cut_at] + f"\0{CUT}\0")
        assert cut, cut_at
        assert found == ({"/mnt/ckpt/model.pt": 4096, "/home/u/beside.pt": 2}
                         if cut_at == len(whole) else {"/mnt/ckpt/model.pt": 4096}), cut_at


@pytest.mark.unit
def test_a_failed_setup_is_said_by_its_error_lines_not_pips_notices():
    """A README user's `--setup 'pip install -r requirements.txt'` naming a package the index
    lacks: the error line was pip's last 20 lines in one, its upgrade notices and index warnings
    last, the line that said what failed in the middle."""
    from sortie.bootstrap.setup_cache import telling_lines

    pip = ("Looking in indexes: https://pypi.org/simple, file:///opt/pypi/simple\n"
           "WARNING: Location 'file:///opt/pypi/simple/nope/' is ignored: it is neither a file"
           " nor a directory.\n"
           "ERROR: Could not find a version that satisfies the requirement nope==1.0\n"
           "ERROR: No matching distribution found for nope==1.0\n\n"
           "[notice] A new release of pip is available: 23.2.1 -> 26.3\n"
           "[notice] To update, run: pip install --upgrade pip\n")
    assert telling_lines(pip) == ("ERROR: Could not find a version that satisfies the "
                                  "requirement nope==1.0 / ERROR: No matching distribution "
                                  "found for nope==1.0")
    assert telling_lines("Traceback (most recent call last):\n  File \"x\", line 1\n"
                         "ModuleNotFoundError: No module named 'yaml'\n") == \
        "ModuleNotFoundError: No module named 'yaml'"
    # No error line: the last lines as they were; nothing at all is said so.
    assert telling_lines("fetching\nno such package\n") == "fetching / no such package"
    assert telling_lines("\n") == "(no output)"
    assert telling_lines("ERROR: " + "x" * 10_000) == "ERROR: " + "x" * 293, "bounded"


@pytest.mark.unit
def test_the_exception_a_rank_raised_is_said_with_the_failure_not_its_peers_closed_link(
        tmp_path: Path):
    """Before: "training failed on node-1 first (exit 1), node-0 (exit 1)", the ValueError a new
    user's script raised on rank 3 only in the log's tail, beside rank 2's gloo error."""
    from sortie.rundir.result import RunResult

    tail = ["[rank2]: Traceback (most recent call last):",
            "[rank2]: RuntimeError: [../gloo/transport/tcp/pair.cc:553] Connection closed by "
            "peer [127.0.0.1]:51405. This is typically caused by a remote worker crashing.",
            "[rank3]: Traceback (most recent call last):",
            '[rank3]:   File "train.py", line 7, in <module>',
            '[rank3]:     raise ValueError("bad batch shape (3, 7)")',
            "[rank3]: ValueError: bad batch shape (3, 7)",
            "torch.distributed.elastic.multiprocessing.errors.ChildFailedError: train.py FAILED"]
    result = RunResult(run_id="r", nodes=2, ranks=4, artifacts=tmp_path,
                       exit_codes={"node-0": 1, "node-1": 1}, first_failed="node-1",
                       failure_tail=tail)
    assert (result.failure() or "").startswith(
        "training failed on node-1 first (exit 1), node-0 (exit 1): on node-1, rank 3 raised "
        "ValueError: bad batch shape (3, 7); logs in "), result.failure()
    alone = RunResult(run_id="r", nodes=1, ranks=1, artifacts=tmp_path, exit_codes={"node-0": 1},
                      failure_tail=["KeyError: 'labels'"])
    assert (alone.failure() or "").startswith(
        "training failed on node-0 (exit 1): a process raised KeyError: 'labels'; logs in ")



@pytest.mark.unit
def test_the_place_in_the_workdir_an_exception_came_from_is_said(tmp_path: Path):
    """Before: "a process raised SyntaxError: '(' was never closed", a new user's typo, and
    where only in the node's log (a path of the node's copy of the workdir). The innermost
    frame in a workdir file is named; a library's frames, another rank's and an earlier
    traceback's are not."""
    from sortie.rundir.result import RunResult

    def failure(tail: list[str], files: tuple[str, ...] = ("bad.py", "src/train.py")) -> str:
        result = RunResult(run_id="r", nodes=1, ranks=2, artifacts=tmp_path,
                           exit_codes={"node-0": 1}, failure_tail=tail, workdir_files=files)
        return result.failure() or ""
    job = "/root/.sortie/clusters/c/nodes/node-0/disk/job"
    typo = [f'  File "{job}/bad.py", line 2', '    print("hi"', "         ^",
            "SyntaxError: '(' was never closed"]
    assert "a process raised SyntaxError at bad.py:2: '(' was never closed; logs in " in \
        failure(typo)
    deep = ["[rank1]: Traceback (most recent call last):",
            f'[rank1]:   File "{job}/src/train.py", line 40, in <module>',
            "[rank1]:     main()",
            f'[rank1]:   File "{job}/src/train.py", line 31, in main',
            "[rank1]:     loss = model(batch)",
            '[rank0]:   File "/usr/lib/python3/x.py", line 3, in f',
            '[rank1]:   File "/env/lib/python3.11/site-packages/torch/nn/modules/linear.py", '
            "line 125, in forward",
            "[rank1]:     return F.linear(input, self.weight, self.bias)",
            "[rank1]: RuntimeError: mat1 and mat2 shapes cannot be multiplied (8x3 and 4x1)"]
    assert "rank 1 raised RuntimeError at src/train.py:31: mat1 and mat2 shapes" in \
        failure(deep)
    assert "rank 1 raised RuntimeError: mat1" in failure(deep, files=()), "no workdir: unsaid"
    earlier = ["[rank1]: Traceback (most recent call last):",
               f'[rank1]:   File "{job}/src/train.py", line 9, in <module>',
               "[rank1]: Traceback (most recent call last):",
               '[rank1]:   File "/env/lib/python3.11/threading.py", line 1045, in run',
               "[rank1]: OSError: boom"]
    assert "rank 1 raised OSError: boom" in failure(earlier)
