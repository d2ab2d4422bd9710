"""Ctrl-C on `sortie exec` (issue 47.5): the run is recorded as interrupted, not failed; the
terminal says the held cluster is still up and where the report is, exit 130; the job's own
stopping noise (torchrun's traceback on SIGTERM) stays in its logs."""

from __future__ import annotations

import json
import re
import signal
from pathlib import Path

import psutil
import pytest

from sortie.stacks.local.local_backend import LocalBackend
from tests.helpers import (
    exit_code,
    follow_until,
    needs_sshd,
    sortie,
    start_sortie,
    wait_until,
)

pytestmark = [pytest.mark.e2e, needs_sshd]

WAITS = """import time
import torch.distributed as dist
dist.init_process_group("gloo")
print("ready", flush=True)
time.sleep(600)
"""


def test_ctrl_c_on_exec_is_an_interruption_and_the_cluster_stays(
        sortie_home: Path, tmp_path: Path, backend: LocalBackend):
    code = tmp_path / "code"
    code.mkdir()
    (code / "wait.py").write_text(WAITS)
    assert sortie("up", "--nodes", "2", "--name", "held", cwd=tmp_path).returncode == 0
    proc = start_sortie(tmp_path, "exec", "held", "--workdir", str(code), "--script",
                        "wait.py", "-p", "1")
    seen: list[str] = []
    reader = follow_until(proc, seen, lambda line: "ready" in line, timeout=180)
    proc.send_signal(signal.SIGINT)
    assert exit_code(proc, seen, 120) == 130, "".join(seen)[-3000:]
    reader.join(10)
    said = "".join(seen)
    last = said.strip().splitlines()[-1]
    (run_dir,) = (tmp_path / "runs").iterdir()
    assert last == ("sortie: error: interrupted; the job was stopped; cluster held is still up "
                    f"(`sortie down held` ends it); report: runs/{run_dir.name}/report.html"), said
    # Before: torchrun's SignalException traceback, streamed while the job was stopped.
    assert "Traceback" not in said and "SignalException" not in said, said[-3000:]
    run = json.loads((run_dir / "run.json").read_text())
    assert run["result"]["interrupted"] == "Ctrl-C"
    assert run["failure"].startswith("interrupted (Ctrl-C): the job was stopped")
    assert set(run["result"]["node_states"].values()) == {"interrupted"}
    assert re.search(r'id="outcome">interrupted<',
                     (run_dir / "report.html").read_text())
    status = json.loads(sortie("status", "--json", cwd=tmp_path).stdout)["sorties"]
    assert [(row["name"], row["nodes_up"]) for row in status] == [("held", 2)]
    # The lock went with the controller: the next exec runs.
    (code / "task.yaml").write_text("workdir: .\nrun: 'true'\n")
    again = sortie("exec", "held", str(code / "task.yaml"), cwd=tmp_path)
    assert again.returncode == 0, again.stderr


def sleeping(seconds: int) -> list[int]:
    """Processes `sleep SECONDS` (a number no other test sleeps)."""
    return [p.pid for p in psutil.process_iter(["cmdline"])
            if p.info["cmdline"] == ["sleep", str(seconds)]]


def test_a_setup_interrupted_or_failed_elsewhere_is_not_left_running(
        sortie_home: Path, tmp_path: Path):
    """Before: Ctrl-C during a setup said "the job was stopped" and left every node's setup
    running (a `pip install` for as long as it took, holding the nodes' setup lock), and so did
    a setup that failed on one node: the others' went on."""
    code = tmp_path / "code"
    code.mkdir()
    assert sortie("up", "--nodes", "2", "--name", "held", cwd=tmp_path).returncode == 0
    (code / "task.yaml").write_text("workdir: .\nrun: 'true'\nsetup: echo started; sleep 613\n")
    proc = start_sortie(tmp_path, "exec", "held", str(code / "task.yaml"))
    seen: list[str] = []
    reader = follow_until(proc, seen, lambda line: "node-1 setup | started" in line,
                          timeout=120)
    wait_until(lambda: len(sleeping(613)) == 2, 30, "both nodes' setups sleeping")
    proc.send_signal(signal.SIGINT)
    assert exit_code(proc, seen, 120) == 130, "".join(seen)[-3000:]
    reader.join(10)
    last = "".join(seen).strip().splitlines()[-1]
    assert last.startswith("sortie: error: interrupted; the job was not launched (a setup "
                           "running was stopped); cluster held is still up"), last
    assert sleeping(613) == [], "a setup goes on running"

    (code / "task.yaml").write_text(
        "workdir: .\nrun: 'true'\nsetup: |\n  if [ $SORTIE_NODE_RANK = 0 ]; then exit 3; fi\n"
        "  echo started; sleep 617\n")
    failed = start_sortie(tmp_path, "exec", "held", str(code / "task.yaml"))
    seen = []
    reader = follow_until(failed, seen, lambda line: "node-1 setup | started" in line,
                          timeout=120)
    assert exit_code(failed, seen, 120) == 1, "".join(seen)[-3000:]
    reader.join(10)
    assert "node-0: setup failed (exit 3)" in "".join(seen)
    assert sleeping(617) == [], "node-1's setup goes on after node-0's failed"
    assert sortie("exec", "held", "--workdir", str(code), "--script", "task.yaml", "--",
                  cwd=tmp_path).returncode in (0, 1), "the nodes' setup lock is free"
