"""Ctrl-C on `sortie exec` (issue 47.5): the run is recorded as interrupted, not failed; the
terminal says the held cluster is still up and where the report is, exit 130; the job's own
stopping noise (torchrun's traceback on SIGTERM) stays in its logs."""

from __future__ import annotations

import json
import re
import signal
from pathlib import Path

import pytest

from sortie.stacks.local.local_backend import LocalBackend
from tests.helpers import exit_code, follow_until, needs_sshd, sortie, start_sortie

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
