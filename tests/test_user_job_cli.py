"""Your own job through the real CLI (`sortie run`): `--script` and a task file with `run:` on a
real 2-node x 2-process local cluster; every rank's view comes back as a verified artifact;
a bad task field, a setup failure and a rank failure each end with one clear line."""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

import pytest

from sortie.engine.task import load_task
from sortie.stacks.local.local_backend import LocalBackend
from tests.browser import open_report_or_skip
from tests.helpers import (
    REPO,
    assert_nothing_left,
    controller_output,
    exit_code,
    follow_until,
    loopback_listeners,
    needs_sshd,
    reached_step,
    sortie,
    start_sortie,
)

pytestmark = [pytest.mark.e2e, needs_sshd]

SECRET = "tok-93ac5e"
SCRIPT = """\
import json, os, sys
import torch, torch.distributed as dist
dist.init_process_group("gloo")
rank = dist.get_rank()
if os.environ.get("FAIL_RANK") == str(rank):
    sys.exit(3)
total = torch.tensor([1.0])
dist.all_reduce(total)
os.makedirs("outputs", exist_ok=True)
seen = {n: v for n, v in os.environ.items() if n.startswith("SORTIE_")}
seen.update(rank=rank, world=int(total.item()), args=sys.argv[1:],
            secret=os.environ.get("MY_TOKEN") == os.environ.get("EXPECTED"))
with open(f"outputs/rank-{rank}.json", "w") as f:
    json.dump(seen, f)
if rank == 0:  # the report plots every numeric field of these lines against step
    with open(os.path.join(os.environ["SORTIE_ARTIFACT_DIR"], "metrics.jsonl"), "w") as f:
        for step in range(1, 6):
            f.write(json.dumps({"step": step, "accuracy": step / 10, "note": "text"}) + "\\n")
        f.write(json.dumps({"step": 5, "checkpoint": True}) + "\\n")
dist.destroy_process_group()
"""


def project(tmp_path: Path) -> Path:
    root = tmp_path / "project"
    root.mkdir()
    (root / "train.py").write_text(SCRIPT)
    (root / ".gitignore").write_text("*.log\n")
    (root / "debug.log").write_text("not sent")
    return root


def ranks(run: Path) -> dict[int, dict]:
    found = [json.loads(p.read_text()) for p in run.rglob("outputs/rank-*.json")]
    return {seen["rank"]: seen for seen in found}


def test_script_flag_runs_your_torchrun_script(sortie_home: Path, tmp_path: Path):
    before = loopback_listeners()
    code = project(tmp_path)
    git = ["git", "-C", str(code), "-c", "user.name=t", "-c", "user.email=t@example.com"]
    subprocess.run([*git, "init", "-q"], check=True)
    subprocess.run([*git, "add", "-A"], check=True)
    subprocess.run([*git, "commit", "-qm", "first"], check=True)
    commit = subprocess.run([*git, "rev-parse", "HEAD"], capture_output=True, text=True,
                            check=True).stdout.strip()
    result = sortie("run", "--workdir", str(code), "--script", "train.py", "-p", "2",
                    "--artifact", "outputs/*.json", "--name", "mine", "--json",
                    "--", "--epochs", "3", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["ok"] and report["ranks"] == 4 and report["artifacts_verified"]
    assert {"sync", "train", "collect"} <= report["phase_s"].keys()
    run = tmp_path / "runs" / "mine"
    seen = ranks(run)
    assert sorted(seen) == [0, 1, 2, 3] and {s["world"] for s in seen.values()} == {4}
    assert all(s["args"] == ["--epochs", "3"] and s["SORTIE_NUM_NODES"] == "2"
               for s in seen.values())
    assert {s["SORTIE_NODE_RANK"] for s in seen.values()} == {"0", "1"}
    manifest = {entry["path"] for entry in
                json.loads((run / "manifest.json").read_text())["files"]}
    assert "artifacts/outputs/rank-0.json" in manifest  # the head's
    assert "nodes/node-1/outputs/rank-2.json" in manifest  # the other node's
    assert "Syncing 2 files" in result.stderr, "train.py and .gitignore; debug.log is ignored"
    record = json.loads((run / "run.json").read_text())  # which code ran, with the rest
    assert record["result"]["ok"] and record["result"]["exit_codes"] == {"node-0": 0, "node-1": 0}
    assert record["code"]["files"] == 2 and len(record["code"]["sha256"]) == 64
    assert record["code"]["git_commit"] == commit and record["code"]["git_dirty"] is False
    assert set(record["node_facts"]) == {"node-0", "node-1"}
    assert all(facts["torch"] for facts in record["node_facts"].values())
    assert {"sync", "train"} <= record["result"]["phase_s"].keys()
    assert not (run / "record.json").exists(), "one file says what ran: run.json"
    assert (run / "task.yaml").is_file()
    assert report["report"] == "runs/mine/report.html"
    assert_nothing_left(sortie_home, before)
    page = open_report_or_skip(run / "report.html", tmp_path / "user-job-report.png")
    assert page.series_points == {"accuracy": 5} and not page.console_errors  # its metrics
    assert "your script train.py --epochs 3" in page.text


def test_task_file_with_run_setup_env_and_secrets(sortie_home: Path, tmp_path: Path):
    code = project(tmp_path)
    (code / "task.yaml").write_text(
        "name: tasked\nnodes: 2\nprocs_per_node: 2\nworkdir: .\n"
        "setup: echo \"setup on $SORTIE_NODE_RANK\"\n"
        "run: $SORTIE_TORCHRUN --nnodes=$SORTIE_NUM_NODES "
        "--nproc-per-node=$SORTIE_PROCS_PER_NODE --node-rank=$SORTIE_NODE_RANK "
        "--master-addr=$MASTER_ADDR --master-port=$MASTER_PORT train.py --from-task\n"
        f"env: {{EXPECTED: {SECRET}}}\nsecrets: [MY_TOKEN]\nartifacts: [outputs]\n")
    result = sortie("run", str(code / "task.yaml"), "--json", cwd=tmp_path,
                    env={"MY_TOKEN": SECRET})
    assert result.returncode == 0, result.stderr
    seen = ranks(tmp_path / "runs" / "tasked")
    assert sorted(seen) == [0, 1, 2, 3]
    assert all(s["secret"] and s["args"] == ["--from-task"] for s in seen.values())
    assert SECRET not in result.stdout + result.stderr
    assert all(SECRET not in p.read_text() for p in (tmp_path / "runs").rglob("*")
               if p.is_file() and p.name != "task.yaml")  # (its env holds EXPECTED)

    # The task as it ran is kept with the run, secrets by name, and runs again as it is.
    recorded = tmp_path / "runs" / "tasked" / "task.yaml"
    task = load_task(recorded)
    assert task.name is None and task.nodes == 2 and task.procs_per_node == 2
    assert task.workdir == code.resolve() and task.secrets == ("MY_TOKEN",)
    assert task.run and task.run.endswith("train.py --from-task")
    again = sortie("run", str(recorded), "--name", "again", cwd=tmp_path,
                   env={"MY_TOKEN": SECRET})
    assert again.returncode == 0, again.stderr
    assert sorted(ranks(tmp_path / "runs" / "again")) == [0, 1, 2, 3]


@pytest.mark.parametrize(("task", "env", "message"), [
    ("script: train.py\nprocs_per_node: 0\n", {}, "task.yaml: procs_per_node: Input should be"),
    ("script: train.py\nworkdir: .\nsecrets: [MY_TOKEN]\n", {},
     "secrets: MY_TOKEN not set in your environment"),
    ("script: debug.log\nworkdir: .\n", {}, "script: debug.log is not among the files synced"),
    ("workdir: .\n", {}, "workdir: give `script` or `run`"),
])
def test_bad_task_is_one_line_before_anything_starts(sortie_home: Path, tmp_path: Path,
                                                     task: str, env: dict, message: str):
    code = project(tmp_path)
    (code / "task.yaml").write_text(task)
    result = sortie("run", str(code / "task.yaml"), cwd=tmp_path, env=env)
    assert result.returncode == 2, result.stderr
    assert message in result.stderr and len(result.stderr.strip().splitlines()) == 1
    assert not (sortie_home / "clusters").exists() or not any(
        (sortie_home / "clusters").iterdir()), "nothing was started"


def test_a_dry_run_says_what_would_run_and_starts_nothing(sortie_home: Path, tmp_path: Path):
    """`run --dry-run`: every check a run makes first (a missing secret refused as a run
    would), then where, which files, the setup, the job and where results land; no cluster,
    no run directory, no secret's value."""
    code = project(tmp_path)
    (code / "setup.py").write_text('os.environ["MASTER_ADDR"] = "localhost"\n')
    argv = ("run", "--workdir", str(code), "--script", "train.py", "--setup", "echo ready",
            "--env", "MODE=fast", "--env", "MY_TOKEN", "--artifact", "outputs/*", "-p", "2",
            "--dry-run")
    refused = sortie(*argv, cwd=tmp_path)
    assert refused.returncode == 2 and "MY_TOKEN" in refused.stderr, refused.stderr
    result = sortie(*argv, "--json", "--", "--epochs", "3", cwd=tmp_path,
                    env={"MY_TOKEN": SECRET})
    assert result.returncode == 0, result.stderr
    said = json.loads(result.stdout)
    assert said["dry_run"] is True and said["started"] is False
    assert said["where"] == "2 nodes x 2 processes (local)"
    assert said["job"] == "your script train.py --epochs 3 under torchrun on every node"
    assert said["workdir"].startswith(f"{code.resolve()}: 3 files") and "*.log" not in said
    assert said["warnings"] == ["setup.py:1 sets MASTER_ADDR itself: with 2 nodes, every rank "
                                "must use the head's, which torchrun sets (each would look for "
                                "the store on its own node and wait); remove the line "
                                "(`init_method=\"env://\"`, the default, reads torchrun's)"]
    assert said["setup"].startswith("echo ready (on every node first; cached")
    assert said["env"] == "MODE=fast" and said["secrets"].startswith("MY_TOKEN (read from")
    assert said["artifacts"] == "outputs/*" and said["results"].startswith("runs/<run id>/")
    assert SECRET not in result.stdout + result.stderr
    assert not (tmp_path / "runs").exists()
    assert not (sortie_home / "clusters").exists() or not any(
        (sortie_home / "clusters").iterdir()), "nothing was started"
    (tmp_path / "runs" / "taken").mkdir(parents=True)
    plain = sortie("run", "--workdir", str(code), "--run", "python train.py", "--dry-run",
                   "--json", cwd=tmp_path)
    assert plain.returncode == 0, plain.stderr
    assert "the run line starts train.py with plain Python, and it joins a process group" in \
        " ".join(json.loads(plain.stdout)["warnings"]), plain.stdout
    (code / "train.sh").write_text("#!/bin/bash\ntorchrun train.py\n")
    shell = sortie("run", "--script", "train.sh", "--dry-run", cwd=code)
    assert shell.returncode == 2 and shell.stderr.strip() == (
        "sortie: error: script: train.sh is a script for '/bin/bash', and torchrun runs a "
        "script with Python: run it with `--run 'bash train.sh'` (once on every node, with "
        "MASTER_ADDR, NODE_RANK and the rest set)"), shell.stderr
    taken = sortie("run", "--dry-run", "--name", "taken", cwd=tmp_path)
    assert taken.returncode == 2 and "runs/taken already holds an earlier run" in taken.stderr
    table = sortie("run", "--dry-run", "--steps", "7", cwd=tmp_path)
    assert table.returncode == 0 and "dry run: nothing was started" in table.stdout
    assert "the bundled trainer under torchrun: 7 steps" in table.stdout, table.stdout


def test_setup_failure_and_rank_failure_say_where(sortie_home: Path, tmp_path: Path):
    code = project(tmp_path)
    # The flags a README user gives, no task file (`--setup` is a task's `setup:`), from the
    # project's directory: the workdir (before: "give one (--workdir DIR)").
    failed_setup = sortie("run", "--script", "train.py", "--setup",
                          "echo fetching; echo 'no such package' >&2; exit 7", "--name",
                          "nosetup", "--runs-dir", str(tmp_path / "runs"), cwd=code)
    assert failed_setup.returncode == 1
    assert f"from {code} to the nodes" in " ".join(failed_setup.stdout.split())
    assert "setup failed (exit 7)" in failed_setup.stderr
    assert "no such package" in failed_setup.stderr
    # The copy that outlasts the cluster first (the node's is gone with a `run`'s teardown).
    assert re.search(r"\(all of it: \S+/runs/nosetup/setup/node-[01]\.log; on the node while "
                     r"it lasts: ", failed_setup.stderr), failed_setup.stderr
    # Each node's setup output as it came, before the phase's ✗.
    for node in ("node-0", "node-1"):
        assert failed_setup.stdout.index(f"{node} setup | fetching") < \
            failed_setup.stdout.index("✗ Setup on every node"), failed_setup.stdout
        assert f"{node} setup | no such package" in failed_setup.stdout
    assert "Training" not in failed_setup.stderr, "nothing was launched"
    recorded = json.loads((tmp_path / "runs" / "nosetup" / "run.json").read_text())["failure"]
    assert "setup failed (exit 7)" in recorded and "no such package" in recorded, recorded
    # Kept, as the error line says (before: it said so, and the setup's output went with the
    # cluster: nothing had launched, so nothing was collected), and `sortie logs` shows it.
    for node in ("node-0", "node-1"):
        kept = tmp_path / "runs" / "nosetup" / "setup" / f"{node}.log"
        assert kept.read_text() == "fetching\nno such package\n"
    shown = sortie("logs", "nosetup", cwd=tmp_path)
    assert shown.returncode == 0, shown.stderr
    assert "node-1 | [its setup's output: the job never started]" in shown.stdout
    assert "node-1 | no such package" in shown.stdout

    # `--env` sets one variable over the task's (rank 9 does not exist: no rank would fail).
    (code / "task.yaml").write_text("workdir: .\nscript: train.py\nenv: {FAIL_RANK: '9'}\n")
    failed_rank = sortie("run", str(code / "task.yaml"), "-p", "2", "--name", "rankfail",
                         "--env", "FAIL_RANK=3", cwd=tmp_path)
    assert failed_rank.returncode == 1
    assert "training failed on" in failed_rank.stderr
    assert re.search(r"node-1( first)? \(exit 1\)", failed_rank.stderr), failed_rank.stderr
    # Which node's torchrun ends first when rank 3 exits is a race between the two agents: the
    # table marks the first by the nodes' exit times and shows that node's log.
    assert "how the job ended" in failed_rank.stdout and "failed (first)" in failed_rank.stdout
    assert re.search(r"last \d+ lines of node-\d's log:", failed_rank.stdout)
    # torchrun's own failure table is one line (issue 66.7).
    assert re.search(r"\[sortie\] torchrun: .*rank 3 \(exit 3\).* failed", failed_rank.stdout)
    # The report of the failed run shows the failure and the failing node's log.
    assert "report" in failed_rank.stdout
    run = tmp_path / "runs" / "rankfail"
    assert (run / "report.html").is_file() and (run / "run.json").is_file()
    page = open_report_or_skip(run / "report.html", tmp_path / "failed-report.png")
    assert not page.console_errors and not page.page_errors and not page.requests
    assert page.title == "sortie rankfail: failed"
    assert "training failed on" in page.text
    assert re.search(r"node-1( first)? \(exit 1\)", page.text)
    assert "last 20 lines of node-" in page.text and "No metrics" in page.text
    assert (tmp_path / "failed-report.png").stat().st_size > 10_000

    # A script in a subdirectory importing the workdir's own package, which the user's shell
    # found through its PYTHONPATH: the error line says where it is and the flag that adds it.
    (code / "mypkg").mkdir()
    (code / "mypkg" / "__init__.py").write_text("VALUE = 3\n")
    (code / "src").mkdir()
    (code / "src" / "entry.py").write_text("from mypkg import VALUE\nprint('value', VALUE)\n")
    no_module = sortie("run", "--script", "src/entry.py", "-p", "1", "--name", "nomodule",
                       "--runs-dir", str(tmp_path / "runs"), cwd=code)
    assert no_module.returncode == 1
    told = "src/entry.py imports mypkg, which the workdir has at its top (mypkg/)"
    assert told in " ".join(no_module.stdout.split()), "said before the job starts"
    assert "the job's Python has no module 'mypkg', which the workdir has (mypkg/): Python " \
        "looks in the script's own directory, not the workdir; `--env PYTHONPATH=.` adds it" \
        in no_module.stderr, no_module.stderr
    added = sortie("run", "--script", "src/entry.py", "-p", "1", "--name", "withpath",
                   "--env", "PYTHONPATH=.", "--runs-dir", str(tmp_path / "runs"), cwd=code)
    assert added.returncode == 0 and "value 3" in added.stdout, added.stderr
    assert told not in " ".join(added.stdout.split())
    # A typo: where it is, in the workdir's terms (the node's log has the node's path).
    (code / "src" / "typo.py").write_text("import os\nprint('hi'\n")
    typo = sortie("run", "--script", "src/typo.py", "-p", "1", "--name", "typo",
                  "--runs-dir", str(tmp_path / "runs"), cwd=code)
    assert typo.returncode == 1
    assert "raised SyntaxError at src/typo.py:2: '(' was never closed" in typo.stderr, \
        typo.stderr


def test_exec_on_a_held_cluster_syncs_changes_and_caches_setup(sortie_home: Path,
                                                               tmp_path: Path):
    before = loopback_listeners()
    code = project(tmp_path)
    (code / "old.py").write_text("")
    (code / "requirements.txt").write_text("numpy\n")
    assert sortie("up", "--nodes", "2", "--name", "held", cwd=tmp_path).returncode == 0
    nothing_yet = sortie("logs", "held", cwd=tmp_path)  # before: empty, and no word of why
    assert nothing_yet.returncode == 0 and "held: no logs yet" in nothing_yet.stderr
    dry = sortie("exec", "held", "--workdir", str(code), "--script", "train.py", "--dry-run",
                 "--json", cwd=tmp_path)
    assert dry.returncode == 0, dry.stderr
    planned = json.loads(dry.stdout)
    assert planned["where"] == "2 nodes x 1 process (local cluster held)"
    assert planned["results"].endswith("held left running") and "queue" in planned
    on = sortie("run", "--on", "held", "--steps", "5", "--dry-run", "--json", cwd=tmp_path)
    assert on.returncode == 0, on.stderr
    assert json.loads(on.stdout)["job"].startswith("the bundled trainer under torchrun: 5 steps")
    assert not (tmp_path / "runs").exists(), "a dry run starts nothing"
    first = sortie("exec", "held", "--workdir", str(code), "--script", "train.py", "-p", "2",
                   "--artifact", "outputs/*.json", "--json", cwd=tmp_path)
    assert first.returncode == 0, first.stderr
    report = json.loads(first.stdout)
    assert report["ok"] and report["teardown"] is None, "exec leaves the cluster up"
    # Its workdir has a requirements.txt that nothing installs (no setup): said, before.
    assert "requirements.txt is in the workdir, but the task has no setup" in \
        " ".join(first.stderr.split()), first.stderr[-2000:]
    assert sorted(ranks(tmp_path / report["artifacts"])) == [0, 1, 2, 3]

    (code / "old.py").unlink()
    # The task file a `sortie run` takes: what makes a new cluster is ignored here, and said to be.
    # A `run` job, not the torchrun script again: what these runs prove is the sync and the
    # setup cache (the script ran above), and each torchrun costs every node a torch import.
    task_text = ("name: exp\nnodes: 2\nstack: aws-p3-dev\nset: [spot=false]\nworkdir: .\n"
                 "run: test -f train.py\nsetup: echo installing\n"
                 "setup_inputs: [requirements.txt]\n")
    (code / "task.yaml").write_text(task_text)
    task = str(code / "task.yaml")

    def execute() -> str:  # from the workdir: its runs land in it (code/runs), never synced
        done = sortie("exec", "held", task, cwd=code)
        assert done.returncode == 0, done.stderr
        # Progress goes to the terminal without --json; words only, however lines wrap.
        return " ".join((done.stdout + done.stderr).split())

    said = execute()
    assert "setup cached" not in said and "setup ran on node-0, node-1" in said
    assert "the task's `name`, `stack` and `set` make a new cluster: ignored on held" in said
    # What this sync did (before, every sync said "Syncing 4 files" and nothing more).
    assert (f"workdir: sent 1 file ({len(task_text)} B): task.yaml; deleted 1: old.py on "
            "node-0, node-1") in said
    assert "runs/ (sortie's runs directory)" in said
    said = execute()
    assert "setup cached on node-0, node-1" in said and "workdir unchanged on node-0, node-1" \
        in said, "the last run's report and logs in code/runs were not sent"
    assert (code / "runs").is_dir()
    (code / "requirements.txt").write_text("numpy\nscipy\n")
    said = execute()
    assert "setup cached" not in said, "an input changed"
    assert "workdir: sent 1 file (12 B): requirements.txt on node-0, node-1" in said

    disks = sorted((sortie_home / "clusters" / "held" / "nodes").glob("node-*/disk/job"))
    assert len(disks) == 2
    for disk in disks:
        assert not (disk / "old.py").exists(), "deleted locally, deleted on the node"
        assert (disk / "outputs" / "rank-0.json").exists() or \
            (disk / "outputs" / "rank-2.json").exists(), "what the job wrote stays"
    refused = sortie("exec", "held", "--workdir", str(code), cwd=tmp_path)
    assert refused.returncode == 2 and "give `script` or `run`" in refused.stderr
    # A command on every node from the command line, no task file, no workdir.
    quick = sortie("exec", "held", "--run", "echo on $SORTIE_NODE_RANK of $SORTIE_NUM_NODES",
                   cwd=tmp_path)
    assert quick.returncode == 0 and all(f"node-{rank} | on {rank} of 2" in quick.stdout
                                         for rank in (0, 1)), quick.stdout[-2000:]
    # Silent past --hang-timeout, every node reaching the others: a job may work without
    # printing (loading, compiling). Said and left running (before: stopped, "the job itself
    # hangs", its work lost).
    silent = sortie("exec", "held", "--run", "sleep 7; echo done after 7 s", "--hang-timeout",
                    "2s", cwd=tmp_path)
    assert silent.returncode == 0, silent.stderr[-2000:]
    said = " ".join((silent.stdout + silent.stderr).split())
    assert re.search(r"no log line from any node for \d+s, yet every node reaches the others "
                     r"over the job's network: left running", said), said[-2000:]
    assert "node-1 | done after 7 s" in silent.stdout
    both = sortie("exec", "held", "--run", "true", "--script", "train.py", cwd=tmp_path)
    assert both.returncode == 2 and both.stderr.count("\n") == 1 and "not both" in both.stderr
    (code / "three.yaml").write_text("nodes: 3\nworkdir: .\nscript: train.py\n")
    refused = sortie("exec", "held", str(code / "three.yaml"), cwd=tmp_path)
    assert refused.returncode == 2 and "nodes: 3: cluster held has 2 nodes" in refused.stderr

    # Rank 0 wrote its metrics on node-1 (c10d places it on any node) and printed no steps:
    # its outputs are the run's artifacts, and its report plots them (before: under
    # nodes/node-1/, and "No metrics").
    (code / "metrics.yaml").write_text(
        "workdir: .\nrun: |\n  if [ $SORTIE_NODE_RANK = 1 ]; then\n"
        "    echo '{\"step\": 1, \"acc\": 0.5}' > $SORTIE_ARTIFACT_DIR/metrics.jsonl\n"
        "  else touch $SORTIE_ARTIFACT_DIR/other; fi\n")
    done = sortie("exec", "held", str(code / "metrics.yaml"), "--json", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    run_dir = tmp_path / json.loads(done.stdout)["artifacts"]
    assert (run_dir / "artifacts" / "metrics.jsonl").is_file()
    assert (run_dir / "nodes" / "node-0" / "other").is_file()
    assert 'data-metric="acc"' in (run_dir / "report.html").read_text()

    # One node fails, the other would wait for ever: it is stopped, and the story is one
    # (before: 15 s later, one at a time, and "stopped by sortie" in the table but "exit
    # unknown" in the error).
    (code / "hang.yaml").write_text(
        "workdir: .\nrun: if [ $SORTIE_NODE_RANK = 1 ]; then echo giving up; exit 4; fi; "
        "echo waiting; sleep 300\n")
    failed = sortie("exec", "held", str(code / "hang.yaml"), "--json", cwd=tmp_path)
    assert failed.returncode == 1
    report = json.loads(failed.stdout)
    assert (report["first_failed"], report["stopped"]) == ("node-1", ["node-0"])
    assert report["exit_codes"] == {"node-0": None, "node-1": 4}
    assert report["node_states"] == {"node-0": "stopped by sortie", "node-1": "failed"}
    assert report["phase_s"]["train"] < 300, "stopped, not waited for"
    assert "node-0 | [sortie] stopping this node's job: node-1 ended (exit 4) 3s ago" in \
        failed.stderr
    assert failed.stderr.strip().splitlines()[-1].startswith(
        "sortie: error: training failed on node-1 (exit 4); stopped by sortie: node-0; logs in")
    assert "✗ Training" in failed.stderr
    # Every exec in the run history, from wherever it ran, with how it ended.
    runs = json.loads(sortie("runs", "--cluster", "held", "--json", cwd=tmp_path).stdout)
    assert [(r["kind"], r["state"]) for r in runs] == \
        [("exec", "succeeded")] * 7 + [("exec", "failed")]
    assert runs[1]["directory"].startswith(str(code / "runs")) and \
        runs[-1]["directory"] == str(tmp_path / report["artifacts"])
    assert sortie("down", "held", cwd=tmp_path).returncode == 0
    assert_nothing_left(sortie_home, before)


# A job that resumes from $SORTIE_CHECKPOINT_URL: rank 0 saves every 10 steps; rank 3 stops once
# for a preemption (exit 75) at step PREEMPT_AT; the job checks that setup ran on its node and
# that it has its secret.
RESUMING = """\
import json, os, sys, time
import torch, torch.distributed as dist
assert os.path.exists("setup-ran"), "setup did not run on this node"
assert os.environ.get("MY_TOKEN") == os.environ["EXPECTED"], "no secret"
dist.init_process_group("gloo")
rank, steps = dist.get_rank(), int(os.environ["STEPS"])
checkpoints = os.environ["SORTIE_CHECKPOINT_URL"]
saved = os.path.join(checkpoints, "step.json")
start = json.load(open(saved))["step"] if os.path.exists(saved) else 0
if start and rank == 0:
    print(f"resumed from step {start}", flush=True)
for step in range(start + 1, steps + 1):
    dist.all_reduce(torch.ones(1))
    time.sleep(0.1)
    if rank == 0 and step % 10 == 0:
        os.makedirs(checkpoints, exist_ok=True)
        with open(saved + ".tmp", "w") as f:
            json.dump({"step": step}, f)
        os.replace(saved + ".tmp", saved)
        print(f"step {step}/{steps}", flush=True)
    while rank == 0 and step == int(os.environ["HOLD_AT"]) and not os.path.exists("GO_FILE"):
        time.sleep(0.1)  # the test's node loss comes before the end, however slow the machine
    if rank == 3 and step == int(os.environ["PREEMPT_AT"]) and start == 0:
        sys.exit(75)
if rank == 0:
    os.makedirs("outputs", exist_ok=True)
    with open("outputs/done.json", "w") as f:
        json.dump({"from": start, "run": os.environ["SORTIE_RUN_ID"]}, f)
dist.destroy_process_group()
"""


def resuming_task(tmp_path: Path, name: str, steps: int, preempt_at: int, hold_at: int) -> Path:
    """Rank 0 waits after step ``hold_at`` until the test writes ``tmp_path/go``."""
    code = tmp_path / "project"
    code.mkdir()
    (code / "train.py").write_text(RESUMING.replace("GO_FILE", str(tmp_path / "go")))
    task = code / "task.yaml"
    task.write_text(f"name: {name}\nnodes: 2\nprocs_per_node: 2\nworkdir: .\n"
                    "script: train.py\nsetup: touch setup-ran\nartifacts: [outputs/*]\n"
                    f"env: {{STEPS: '{steps}', PREEMPT_AT: '{preempt_at}', HOLD_AT: '{hold_at}', "
                    f"EXPECTED: {SECRET}}}\nsecrets: [MY_TOKEN]\n")
    return task


def test_user_job_recovers_and_is_taken_over_with_its_secrets_and_code(sortie_home: Path,
                                                                        tmp_path: Path):
    """Exit 75 from a rank is a preemption: relaunched, not failed. Then the controller dies: a
    new one reads the secrets from its own environment (refusing, with nothing touched, when one
    is missing) and the code from the run's own copy (not the workdir, edited since), so a
    node lost after the takeover is replaced with the code that ran, its setup and the secret,
    and the job resumes from its checkpoint."""
    before = loopback_listeners()
    task = resuming_task(tmp_path, "again", steps=150, preempt_at=25, hold_at=70)
    first = start_sortie(tmp_path, "run", str(task), env={"MY_TOKEN": SECRET})
    seen: list[str] = []
    follow_until(first, seen, reached_step(40), timeout=180)
    output = " ".join("".join(seen).split())  # rich wraps long lines
    assert "recovery 1: relaunched (preempted); lost at step 20, resumed from step 20" in output
    # An expected preemption is one line, not torchrun's failure table (issue 66.7).
    assert "stopped for a preemption (exit 75)" in output and "Root Cause" not in output
    first.kill()  # the controller dies; the job goes on
    first.wait(10)
    # Edited since the launch: the node replaced below runs the code the job started with.
    (task.parent / "train.py").write_text("raise SystemExit(3)\n")

    refused = sortie("watch", "again", cwd=tmp_path)
    assert refused.returncode == 2, refused.stderr
    assert "secrets: MY_TOKEN not set in your environment" in refused.stderr
    assert LocalBackend(sortie_home).processes("again"), "a refused takeover touches nothing"

    watch = start_sortie(tmp_path, "watch", "again", env={"MY_TOKEN": SECRET})
    seen = []
    reader = follow_until(watch, seen, reached_step(60), timeout=180)
    assert LocalBackend(sortie_home).reclaim("again", "node-1"), "node-1 had processes to kill"
    (tmp_path / "go").touch()
    assert exit_code(watch, seen, 240) == 0, "".join(seen)[-4000:]
    reader.join(10)
    output = " ".join("".join(seen).split())
    assert re.search(r"recovery 1: replaced node-1 \(machine gone\); lost at step \d+, "
                     r"resumed from step \d+", output), output[-3000:]
    assert SECRET not in output
    run = tmp_path / "runs" / "again"
    done = json.loads((run / "artifacts" / "outputs" / "done.json").read_text())
    assert done["run"] == "again" and done["from"] >= 60
    manifest = json.loads((run / "manifest.json").read_text())
    assert "artifacts/outputs/done.json" in {entry["path"] for entry in manifest["files"]}
    assert_nothing_left(sortie_home, before)


LATIN1_JOB = """\
import os, sys
sys.stdout.buffer.write(b"loss 0.5 \\xff\\xfe not UTF-8\\n")
sys.stdout.flush()
os.makedirs("outputs", exist_ok=True)
for name in (b"outputs/caf\\xe9.txt", b"outputs/ok.txt"):
    with open(name, "wb") as f:
        f.write(b"x")
"""


def test_what_a_job_writes_need_not_be_utf8(sortie_home: Path, tmp_path: Path):
    """Before: a workdir file name that is not UTF-8, an artifact name that is not, and a log
    line that is not, each ended in a traceback (the collection of every node was lost)."""
    root = tmp_path / "latin"
    root.mkdir()
    (root / "job.py").write_text(LATIN1_JOB)
    (root / os.fsdecode(b"donn\xe9es.txt")).write_bytes(b"synced as it is")
    ran = sortie("run", "--nodes", "1", "--name", "latin", "--workdir", str(root), "--script",
                 "job.py", "--artifact", "outputs/*", "--json", cwd=tmp_path)
    assert "Traceback" not in ran.stderr, ran.stderr
    result = json.loads(ran.stdout)
    assert ran.returncode == 1 and result["exit_codes"] == {"node-0": 0}, ran.stderr
    assert not result["artifacts_verified"]
    manifest = json.loads((tmp_path / "runs" / "latin" / "manifest.json").read_text())
    assert [f["path"] for f in manifest["files"] if f["path"].startswith("artifacts/")] == \
        ["artifacts/outputs/ok.txt"], "the other artifacts are still collected"
    assert "node-0: 'outputs/caf\ufffd.txt' (not a UTF-8 file name)" in result["collect_error"]
    logs = sortie("logs", "latin", cwd=tmp_path)
    assert logs.returncode == 0 and "node-0 | loss 0.5 \ufffd\ufffd not UTF-8" in logs.stdout
    down = sortie("down", "latin", cwd=tmp_path)  # its bucket was kept: artifacts unverified
    assert down.returncode == 0, down.stderr
    assert_nothing_left(sortie_home)


TICKING = """\
import os, sys, time
print(f"started on node {os.environ['SORTIE_NODE_RANK']}", flush=True)
deadline = time.monotonic() + 120  # held until the test has looked (never by a fixed time)
while not os.path.exists(RELEASE) and time.monotonic() < deadline:
    time.sleep(0.05)
print("step 3/3", flush=True)
print("finished", flush=True)
"""


def test_an_execd_job_is_followed_from_a_second_terminal(sortie_home: Path, tmp_path: Path):
    """Before: `sortie logs CLUSTER` looked for a run named like the cluster and printed
    nothing, and `sortie logs RUN` said no sortie ran by that name, while an exec ran."""
    code, release = tmp_path / "ticking", tmp_path / "release"
    code.mkdir()
    (code / "tick.py").write_text(f"RELEASE = {str(release)!r}\n" + TICKING)
    assert sortie("up", "--nodes", "2", "--name", "follow", cwd=tmp_path).returncode == 0
    proc = start_sortie(tmp_path, "exec", "follow", "--workdir", str(code), "--script",
                        "tick.py")
    seen: list[str] = []
    reader = follow_until(proc, seen, lambda line: "started on node 1" in line)
    (run_id,) = [p.name for p in (tmp_path / "runs").iterdir()]
    for name in ("follow", run_id):  # the cluster's newest exec, or that exec by its run id
        live = sortie("logs", name, cwd=tmp_path)
        assert live.returncode == 0, live.stderr
        assert "node-0 | started on node 0" in live.stdout, live.stdout + live.stderr
        assert "node-1 | started on node 1" in live.stdout
    assert "node-1 | started on node 1" in sortie("logs", "follow", "node-1", cwd=tmp_path).stdout
    # A second exec while the job runs that asks not to wait in the queue (third review: it
    # synced over the running job's files, then failed on the rendezvous port): refused in
    # one line naming the running job, before anything of it reaches the nodes.
    other = tmp_path / "other"
    other.mkdir()
    (other / "tick.py").write_text("print('the second job')\n")
    second = sortie("exec", "follow", "--workdir", str(other), "--script", "tick.py",
                    "--no-queue", cwd=tmp_path)
    assert second.returncode == 2 and "Traceback" not in second.stderr, second.stderr
    error = second.stderr.strip().splitlines()[-1]
    assert error.startswith("sortie: error: follow: ") and run_id in error, error
    assert "not starting another beside it" in error
    head = LocalBackend(sortie_home).inventory("follow").head
    assert "the second job" not in (Path(head.workdir) / "job" / "tick.py").read_text(), \
        "nothing of it was synced"
    # Issue 47: the snapshot says the job still runs; -f follows it to its end, then exits.
    snapshot = sortie("logs", "follow", cwd=tmp_path)
    assert "follow: the job still runs on node-0, node-1 (`sortie logs follow -f`" in \
        snapshot.stderr, snapshot.stderr
    following = start_sortie(tmp_path, "logs", "follow", "-f")
    followed: list[str] = []
    follow_reader = follow_until(following, followed, lambda line: "started on node 1" in line)
    release.touch()
    assert exit_code(following, followed, 120) == 0, "".join(followed)
    follow_reader.join(10)
    assert "node-0 | finished" in "".join(followed) and "node-1 | finished" in "".join(followed)
    assert exit_code(proc, seen, 120) == 0, "".join(seen)
    reader.join(10)
    # Before: `steps -` though rank 0 printed its steps, and run.json named no report.
    assert re.search(r"steps\s+│\s+3\s", controller_output(seen)), controller_output(seen)
    run_file = json.loads((tmp_path / "runs" / run_id / "run.json").read_text())
    assert run_file["result"]["report"] == str(tmp_path / "runs" / run_id / "report.html") or \
        run_file["result"]["report"] == f"runs/{run_id}/report.html"
    assert "node-0 | finished" in sortie("logs", "follow", cwd=tmp_path).stdout
    assert sortie("down", "follow", cwd=tmp_path).returncode == 0
    collected = sortie("logs", run_id, cwd=tmp_path)  # from runs/<id>/logs once it is gone
    assert collected.returncode == 0 and "node-1 | finished" in collected.stdout
    assert_nothing_left(sortie_home)


README_JOB = """\
import argparse, os
import torch, torch.distributed as dist
parser = argparse.ArgumentParser()
parser.add_argument("--epochs", type=int)
epochs = parser.parse_args().epochs
dist.init_process_group("gloo")
total = torch.ones(1)
dist.all_reduce(total)
assert os.environ["HF_TOKEN"] == "hf-secret" and os.environ["DATA_DIR"] == "/data"
if dist.get_rank() == 0:
    os.makedirs("outputs", exist_ok=True)
    with open("outputs/result.txt", "w") as f:
        f.write(f"{epochs} epochs on {int(total.item())} ranks")
dist.destroy_process_group()
"""


def test_the_readmes_task_file_runs_as_written_through_run_and_exec(sortie_home: Path,
                                                                      tmp_path: Path):
    """The task file of "Your own job" (docs/your-job.md), as it is there: through `exec` on a held
    cluster whole (its name, stack and set are said to be ignored), and through `run` without
    its `stack` and `set` (which need the Pulumi CLI and a cloud here)."""
    text = (REPO / "docs" / "your-job.md").read_text()
    start = text.index("# task.yaml — `sortie run task.yaml`")
    task = text[start:text.index("```", start)]
    code = tmp_path / "my-project"
    code.mkdir()
    (code / "train.py").write_text(README_JOB)
    (code / "requirements.txt").write_text("pyyaml\n")  # installed already: pip needs no network
    (code / "task.yaml").write_text(task)
    local = "".join(line for line in task.splitlines(keepends=True)
                    if not line.startswith(("stack:", "set:")))
    (code / "local.yaml").write_text(local)
    env = {"HF_TOKEN": "hf-secret", "DATA_DIR": "/data"}

    ran = sortie("run", str(code / "local.yaml"), cwd=tmp_path, env=env)
    assert ran.returncode == 0, ran.stdout[-3000:] + ran.stderr
    # (c10d places rank 0 on any node: its outputs are the head's artifacts/ or nodes/<node>/)
    (result,) = (tmp_path / "runs" / "my-exp").glob("**/outputs/result.txt")
    assert result.read_text() == "3 epochs on 8 ranks"
    kept = result.relative_to(tmp_path / "runs" / "my-exp")  # said where it went, by name
    assert re.search(rf"│ your files +│ {kept} \(1 file, 19 B\) +│", ran.stdout), ran.stdout

    assert sortie("up", "--nodes", "2", "--name", "scratch", cwd=tmp_path).returncode == 0
    execd = sortie("exec", "scratch", str(code / "task.yaml"), "--json", cwd=tmp_path, env=env)
    assert execd.returncode == 0, execd.stderr[-3000:]
    said = " ".join(execd.stderr.split())
    assert "the task's `name`, `stack` and `set` make a new cluster: ignored on scratch" in said
    report = json.loads(execd.stdout)
    (result,) = (tmp_path / report["artifacts"]).glob("**/outputs/result.txt")
    assert result.read_text() == "3 epochs on 8 ranks"
    assert sortie("down", "scratch", cwd=tmp_path).returncode == 0
    assert_nothing_left(sortie_home)


# Makes a distribution as pip would leave one (its dist-info) in the job's environment, on
# node-1 alone: what a setup that resolved another version there does.
FAKE_INSTALL = ('if [ "$SORTIE_NODE_RANK" = 1 ]; then site=$("$SORTIE_PYTHON" -c "import '
                'sysconfig; print(sysconfig.get_paths()[\'purelib\'])"); mkdir -p '
                '"$site/fake_pkg-1.0.dist-info"; printf "Metadata-Version: 2.1\\nName: '
                'fake-pkg\\nVersion: 1.0\\n" > "$site/fake_pkg-1.0.dist-info/METADATA"; fi')


def test_the_packages_a_job_ran_with_are_kept_and_compared(sortie_home: Path, tmp_path: Path):
    """Before: nothing said which packages a job ran with, nor that a node's differed, nor
    that a re-run of a run's task.yaml (its code, kept) ran with other versions."""
    code = project(tmp_path)
    (code / "task.yaml").write_text(f"name: pk\nworkdir: .\nnodes: 2\nrun: 'true'\n"
                                    f"setup: {json.dumps(FAKE_INSTALL)}\n")
    first = sortie("run", str(code / "task.yaml"), cwd=tmp_path)
    assert first.returncode == 0, first.stderr
    said = " ".join(first.stdout.split())
    assert "! node-1's Python packages differ from node-0's: +fake-pkg 1.0 (the job may not " \
        "run alike there)" in said, said
    kept = tmp_path / "runs" / "pk" / "packages.txt"
    listed = kept.read_text().splitlines()
    assert any(p.startswith("torch==2.13.0") for p in listed)
    assert not any(p.startswith("fake") for p in listed)
    assert listed == sorted(listed, key=str.lower)

    # The run's own task again: its code, and today's packages, said where they differ.
    kept.write_text("".join(f"{line}\n" for line in ["fake-old==0.1", *listed]))
    again = sortie("run", str(tmp_path / "runs" / "pk" / "task.yaml"), "--name", "again",
                   cwd=tmp_path)
    assert again.returncode == 0, again.stderr
    said = " ".join(again.stdout.split())
    assert "! the job's Python packages differ from those run pk ran with: -fake-old 0.1 " \
        "(its list: " in said, said
