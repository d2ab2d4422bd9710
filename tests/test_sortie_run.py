"""Whole sorties through the real CLI: real sshd, real torchrun, real teardown."""

from __future__ import annotations

import contextlib
import hashlib
import json
import re
import signal
import socket
import subprocess
import time
from pathlib import Path

import pytest

from sortie.stacks.local.local_backend import LocalBackend
from tests.browser import open_report_or_skip
from tests.helpers import (
    assert_nothing_left,
    controller_output,
    exit_code,
    follow_until,
    loopback_listeners,
    needs_sshd,
    start_run,
    start_sortie,
)

pytestmark = [pytest.mark.e2e, needs_sshd]


def test_full_run_two_nodes_two_procs(sortie_home: Path, tmp_path: Path):
    from tests.helpers import sortie

    before = loopback_listeners()
    result = sortie("run", "--nodes", "2", "--procs-per-node", "2", "--steps", "30",
                    "--name", "e2e", "--json", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["ok"] and report["ranks"] == 4 and report["teardown_clean"]
    assert report["summary"]["world_size"] == 4 and report["summary"]["steps"] == 30

    run_dir = tmp_path / "runs" / "e2e"
    metrics = [json.loads(line) for line in
               (run_dir / "artifacts" / "metrics.jsonl").read_text().splitlines()]
    assert metrics[-1]["step"] == 30
    assert (run_dir / "artifacts" / "checkpoint-final.pt").stat().st_size > 0
    logs = {p.name: p.read_text() for p in (run_dir / "logs").iterdir()}
    assert set(logs) == {"node-0.log", "node-1.log"}
    assert "trainer: done" in "".join(logs.values())
    assert "node-0 |" in result.stderr and "Tearing down" in result.stderr  # progress shown
    assert report["artifacts_verified"] and report["collect_error"] is None
    manifest = json.loads((run_dir / "manifest.json").read_text())
    files = {entry["path"]: entry for entry in manifest["files"]}
    assert {"artifacts/checkpoint-final.pt", "artifacts/metrics.jsonl",
            "logs/node-0.log"} <= files.keys()
    final = (run_dir / "artifacts" / "checkpoint-final.pt").read_bytes()
    assert files["artifacts/checkpoint-final.pt"]["sha256"] == hashlib.sha256(final).hexdigest()
    assert files["artifacts/checkpoint-final.pt"]["bytes"] == len(final)
    assert_nothing_left(sortie_home, before)
    # The run's report, in a real browser: it loads clean, plots a point per logged step and
    # marks the checkpoint saves (every 20 steps by default, and the last).
    assert report["report"] == "runs/e2e/report.html"  # as --runs-dir (relative) says
    page = open_report_or_skip(run_dir / "report.html", tmp_path / "report.png")
    assert not page.console_errors and not page.page_errors and not page.requests
    assert page.title == "sortie e2e: ok" and "0 resources remain" in page.text
    logged = [m["step"] for m in metrics if "loss" in m]
    for name in ("loss", "lr", "samples_per_s", "tokens_per_s"):
        assert page.series_points[name] == len(set(logged)), name
    assert [m["step"] for m in metrics if m.get("checkpoint")] == [20, 30]
    assert "checkpoint saves (2)" in page.text
    assert (tmp_path / "report.png").stat().st_size > 10_000


def test_trainer_failure_still_collects_logs_and_tears_down(sortie_home: Path, tmp_path: Path):
    from tests.helpers import sortie

    before = loopback_listeners()
    result = sortie("run", "--nodes", "2", "--procs-per-node", "1", "--name", "bad",
                    # the flags are the trainer's; only a node can tell its data is not there
                    "--", "--data-dir", "/no/such/data", cwd=tmp_path)
    assert result.returncode == 1
    last = result.stderr.strip().splitlines()[-1]
    # Both nodes fail; which first is a race between them.
    assert re.match(r"sortie: error: training failed on node-(0 first \(exit 1\), node-1|"
                    r"1 first \(exit 1\), node-0) \(exit 1\)", last), last
    logs = tmp_path / "runs" / "bad" / "logs"
    assert "trainer: error: argument --data-dir" in (logs / "node-0.log").read_text()
    assert_nothing_left(sortie_home, before)


@pytest.mark.parametrize(("signum", "code"), [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_signal_mid_training_tears_down(signum, code, sortie_home: Path, tmp_path: Path):
    before = loopback_listeners()
    proc = start_run(tmp_path, "--nodes", "2", "--procs-per-node", "1", "--steps", "1000000",
                     "--name", "sig", "--", "--log-every", "50")
    seen: list[str] = []
    reader = follow_until(proc, seen, lambda line: "loss" in line)
    time.sleep(1)
    proc.send_signal(signum)
    assert exit_code(proc, seen, 60) == code, "".join(seen)
    reader.join(10)
    controller = controller_output(seen)
    assert "Tearing down" in controller and "Traceback" not in controller, controller
    # The last line says what the run left: the teardown's proof and the report.
    how = "interrupted" if signum == signal.SIGINT else "stopped by SIGTERM"
    last = controller.strip().splitlines()[-1]
    assert re.fullmatch(f"sortie: error: {how}; sig: removed \\d+ processes; 0 resources "
                        "remain; report: runs/sig/report.html", last), last
    run = json.loads((tmp_path / "runs" / "sig" / "run.json").read_text())
    assert run["result"]["interrupted"] == ("Ctrl-C" if signum == signal.SIGINT else "SIGTERM")
    assert run["failure"].startswith("interrupted"), run["failure"]
    # Stopping training gave the trainer its SIGTERM: it saved a checkpoint on the way out.
    marker = json.loads((tmp_path / "runs" / "sig" / "artifacts" / "preempted.json").read_text())
    # (a rank the signal had not yet reached says so: every rank stops at the same step)
    assert marker["reason"] in ("SIGTERM", "SIGTERM (another rank)"), marker
    assert (tmp_path / "runs" / "sig" / "checkpoints" / f"step-{marker['step']:08d}").is_dir()
    assert (tmp_path / "runs" / "sig" / "artifacts" / "metrics.jsonl").is_file(), \
        "metrics were not collected"
    assert_nothing_left(sortie_home, before)


def test_up_status_ssh_down(sortie_home: Path, tmp_path: Path, backend: LocalBackend):
    """(``backend`` tears the held cluster down should the test fail half-way.)"""
    from tests.helpers import sortie

    before = loopback_listeners()
    up = sortie("up", "--nodes", "2", "--name", "held", "--json", cwd=tmp_path)
    assert up.returncode == 0, up.stderr
    inventory = json.loads(up.stdout)
    assert [n["name"] for n in inventory["nodes"]] == ["node-0", "node-1"]

    status = json.loads(sortie("status", "--json", cwd=tmp_path).stdout)["sorties"]
    assert status[0]["name"] == "held" and status[0]["nodes_up"] == 2
    assert status[0]["state"] == "up", "a held cluster is never orphaned"

    remote = sortie("ssh", "node-1", "--", "echo", "hello-from", "$SSH_CONNECTION", cwd=tmp_path)
    assert remote.returncode == 0, remote.stderr
    assert remote.stdout.startswith("hello-from")
    assert remote.stdout.split()[3] == inventory["nodes"][1]["address"]
    named = sortie("ssh", "held", "node-0", "--", "echo", "ok", cwd=tmp_path)
    assert named.returncode == 0 and named.stdout.strip() == "ok", named.stderr
    # A command runs where the interactive shell starts (before: in $HOME, not the README's).
    where = sortie("ssh", "held", "node-0", "--", "pwd", cwd=tmp_path)
    assert where.stdout.strip() == inventory["nodes"][0]["workdir"], where.stdout + where.stderr
    # Without a command: a shell in the node's workdir (its job's, once a job ran), not $HOME.
    shell = sortie("ssh", "held", "node-0", cwd=tmp_path, input="pwd\nexit\n")
    assert shell.returncode == 0, shell.stderr
    assert shell.stdout.strip().splitlines()[-1] == inventory["nodes"][0]["workdir"]
    # Issue 66: no NODE is the head; the session has the job's variables.
    told = sortie("ssh", "held", "--", "echo", "$SORTIE_NODE_RANK/$SORTIE_NUM_NODES/$NODE_RANK",
                  cwd=tmp_path)
    assert told.returncode == 0 and told.stdout.strip() == "0/2/0", told.stdout + told.stderr
    told = sortie("ssh", "held", "node-1", "--", "echo", "$MASTER_ADDR:$MASTER_PORT",
                  cwd=tmp_path)
    head = inventory["nodes"][0]["private_address"]
    assert told.stdout.strip() == f"{head}:{inventory['rdzv_port']}", told.stdout + told.stderr
    # ssh's -L passes through: a local port forwarded to node-1's sshd answers with its banner.
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        local = probe.getsockname()[1]
    node1 = inventory["nodes"][1]
    forward = start_sortie(tmp_path, "ssh", "held", "-L",
                           f"127.0.0.1:{local}:{node1['address']}:{node1['port']}", "-N")
    try:
        deadline, banner = time.monotonic() + 60, b""
        while not banner.startswith(b"SSH-2.0") and time.monotonic() < deadline:
            with contextlib.suppress(OSError), \
                    socket.create_connection(("127.0.0.1", local), timeout=5) as tunnel:
                banner = tunnel.recv(64)
            time.sleep(0.1)
        assert banner.startswith(b"SSH-2.0"), (banner, forward.poll())
    finally:
        forward.kill()
        forward.wait(10)
    # ssh-config: plain ssh reaches a node through the entries, its key pinned.
    config = tmp_path / "ssh_config"
    wrote = sortie("ssh-config", "held", "--write", "--config", str(config), cwd=tmp_path)
    assert wrote.returncode == 0 and "wrote 2 entries" in wrote.stdout, wrote.stderr
    plain = subprocess.run(["ssh", "-F", str(config), "-o", "BatchMode=yes", "held-node-1",
                            "echo", "plain ssh"], capture_output=True, text=True, timeout=60)
    assert plain.returncode == 0 and plain.stdout.strip() == "plain ssh", plain.stderr
    removed = sortie("ssh-config", "held", "--remove", "--config", str(config), cwd=tmp_path)
    assert removed.returncode == 0 and config.read_text() == ""
    assert sortie("reap", cwd=tmp_path).stdout == "", "reap leaves a held cluster alone"

    first = sortie("down", "held", cwd=tmp_path)
    assert first.returncode == 0 and "0 resources remain" in first.stdout
    second = sortie("down", "held", cwd=tmp_path)  # gone: a clear error, and harmless
    assert second.returncode == 2 and "no sortie named 'held'" in second.stderr
    assert_nothing_left(sortie_home, before)
