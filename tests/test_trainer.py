"""The bundled trainer under real torchrun (CPU, gloo): exact resume, preemption, checkpoints."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from sortie.trainer.checkpoint import CheckpointStore
from tests.helpers import REPO, CloudMetadata, follow_until

pytestmark = pytest.mark.e2e

TORCHRUN = [sys.executable, "-m", "torch.distributed.run", "--standalone"]


def torchrun(procs: int, *args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([*TORCHRUN, f"--nproc-per-node={procs}", "-m", "trainer", *args],
                          cwd=REPO, capture_output=True, text=True, timeout=timeout)


def final_weights(out: Path) -> dict[str, torch.Tensor]:
    return torch.load(out / "checkpoint-final.pt", weights_only=True)["model"]


@pytest.mark.parametrize(("procs", "extra"), [(2, ()), (4, ("--deterministic",))])
def test_resumed_run_is_bit_identical(procs, extra, tmp_path: Path):
    whole, resumed = tmp_path / "whole", tmp_path / "resumed"
    common = ("--steps", "16", "--log-every", "4", *extra)
    first = torchrun(procs, *common, "--ckpt-every", "8", "--keep-last", "4", "--out", str(whole))
    assert first.returncode == 0, first.stderr[-3000:]
    # The interrupted run: only the step-8 checkpoint survives, and training resumes from it.
    (resumed / "checkpoints").mkdir(parents=True)
    (whole / "checkpoints" / "step-00000008").rename(resumed / "checkpoints" / "step-00000008")
    second = torchrun(procs, *common, "--out", str(resumed))
    assert second.returncode == 0, second.stderr[-3000:]
    assert "resumed from step 8" in second.stdout
    a, b = final_weights(whole), final_weights(resumed)
    assert a.keys() == b.keys()
    assert all(torch.equal(a[name], b[name]) for name in a), "resume is not bit-identical"
    summary = json.loads((resumed / "summary.json").read_text())
    assert summary["resumed_from"] == 8 and summary["steps"] == 16


def _start_long_run(out: Path, *extra: str) -> subprocess.Popen:
    return subprocess.Popen(
        [*TORCHRUN, "--nproc-per-node=2", "-m", "trainer", "--steps", "1000000", "--log-every",
         "5", "--out", str(out), *extra],
        cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        start_new_session=True)


def _wait_for_training(proc: subprocess.Popen, seen: list[str]) -> None:
    follow_until(proc, seen, lambda line: line.startswith("step "))


def _preempted_step(out: Path, proc: subprocess.Popen, seen: list[str]) -> int:
    proc.wait(60)
    marker = json.loads((out / "preempted.json").read_text())
    assert f"preempted ({marker['reason']}) at step {marker['step']}" in "".join(seen)
    return marker["step"]


def test_sigterm_saves_a_checkpoint_and_resume_continues(tmp_path: Path):
    out = tmp_path / "out"
    proc, seen = _start_long_run(out), []
    _wait_for_training(proc, seen)
    started = time.monotonic()
    os.killpg(proc.pid, signal.SIGTERM)  # a cloud shutdown signals every process
    step = _preempted_step(out, proc, seen)
    assert time.monotonic() - started < 30
    ckpt = CheckpointStore(str(out / "checkpoints"), rank=0, world_size=2)
    assert ckpt.latest() == step, "the preemption checkpoint is not the latest complete one"

    resumed = torchrun(2, "--steps", str(step + 3), "--out", str(out))
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert f"resumed from step {step}" in resumed.stdout


def test_metadata_notice_stops_every_rank_at_the_same_step(metadata: str, tmp_path: Path):
    """A stand-in AWS IMDSv2: it answers only requests carrying its session token."""
    out = tmp_path / "out"
    proc, seen = _start_long_run(out, "--preemption-notice", "aws", "--metadata-url",
                                 metadata), []
    _wait_for_training(proc, seen)
    CloudMetadata.preempted = True
    step = _preempted_step(out, proc, seen)
    assert "exitcode  : 75" in "".join(seen), "workers did not exit with the preemption code"
    # Both ranks wrote their part of the same step's checkpoint: they stopped together.
    step_dir = out / "checkpoints" / f"step-{step:08d}"
    assert {p.name for p in step_dir.glob("done-rank*")} == {"done-rank00000", "done-rank00001"}


def test_kill_mid_write_leaves_the_previous_checkpoint_loadable(tmp_path: Path):
    url = str(tmp_path / "ckpt")
    writer = f"""
import sys, torch
from sortie.trainer.checkpoint import CheckpointStore

ckpt = CheckpointStore({url!r}, rank=0, world_size=1)
ckpt.save(1, {{"step": 1, "w": torch.ones(4)}})
print("saved 1", flush=True)
ckpt.save(2, {{"step": 2, "w": torch.randn(64, 1024, 1024)}})  # 256 MB: slow enough to interrupt
print("saved 2", flush=True)
"""
    proc = subprocess.Popen([sys.executable, "-c", writer], cwd=REPO, stdout=subprocess.PIPE,
                            text=True)
    assert proc.stdout.readline().strip() == "saved 1"
    partial = tmp_path / "ckpt" / "step-00000002" / "state.pt"
    deadline = time.monotonic() + 60
    while not (partial.exists() and partial.stat().st_size > 0) and time.monotonic() < deadline:
        time.sleep(0.005)
    proc.kill()  # SIGKILL in the middle of writing step 2
    proc.wait()
    assert partial.exists(), "the write finished before the kill; the test proves nothing"
    assert not (partial.parent / "done-rank00000").exists()

    ckpt = CheckpointStore(url, rank=0, world_size=1)
    assert ckpt.latest() == 1
    state, rng = ckpt.load(1)
    assert torch.equal(state["w"], torch.ones(4)) and rng is not None


def test_checkpoint_store_keeps_the_last_k_and_ignores_incomplete(tmp_path: Path):
    url = str(tmp_path / "ckpt")
    rank0, rank1 = (CheckpointStore(url, rank=r, world_size=2, keep_last=2) for r in (0, 1))
    for step in (1, 2, 3):
        rank1.save(step, None)
        rank0.save(step, {"step": step})
    rank0.save(4, {"step": 4})  # rank 1 never finishes step 4
    names = sorted(p.name for p in (tmp_path / "ckpt").iterdir())
    assert names == ["step-00000002", "step-00000003", "step-00000004"]
    assert rank0.latest() == 3
    other_world = CheckpointStore(url, rank=0, world_size=4)
    assert other_world.load(3)[1] is None, "RNG of another world size"


def test_checkpointer_decides_when_to_save_and_restores_what_it_saved(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """Every `every` steps and the last step; rank 0 prunes once per checkpoint, after its own
    done marker (before: twice, both before it), and once more when every rank is done."""
    import torch.distributed as dist

    from sortie.trainer.checkpoint import Checkpointer

    url = str(tmp_path / "ckpt")
    pruned_with_marker: list[bool] = []
    original_prune = CheckpointStore.prune

    def prune(store: CheckpointStore) -> None:
        newest = store._steps()[-1]
        pruned_with_marker.append(
            Path(store.step_dir(newest), "done-rank00000").exists())
        original_prune(store)

    monkeypatch.setattr(CheckpointStore, "prune", prune)
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        model = torch.nn.Linear(3, 3)
        saver = Checkpointer(url, 0, 1, {"model": model}, every=3, last_step=8, keep_last=2)
        for step in range(1, 9):
            saver.save(step, last_step=step == 8)
        assert sorted(p.name for p in (tmp_path / "ckpt").iterdir()) == [
            "step-00000006", "step-00000008"]
        assert pruned_with_marker == [True] * 4, "saved 3, 6, 8: one prune each, one at the end"

        restored = torch.nn.Linear(3, 3)
        loader = Checkpointer(url, 0, 1, {"model": restored}, every=3, last_step=8)
        assert loader.load() == 8
        assert torch.equal(restored.weight, model.weight)
        loader.save(8, last_step=True)  # the checkpoint it resumed from: not written again
        assert len(pruned_with_marker) == 4
    finally:
        dist.destroy_process_group()


def test_async_save_writes_the_state_at_call_time(tmp_path: Path):
    ckpt = CheckpointStore(str(tmp_path / "ckpt"), rank=0, world_size=1, async_save=True)
    weights = torch.zeros(1000)
    ckpt.save(1, {"step": 1, "w": weights})
    weights.add_(1)  # training goes on while the background write runs
    ckpt.wait()
    assert torch.equal(ckpt.load(1)[0]["w"], torch.zeros(1000))


def test_resumes_after_a_torchrun_restart(tmp_path: Path):
    """A worker killed mid-run: torchrun restarts the group, which resumes from its checkpoint."""
    import psutil

    out = tmp_path / "out"
    proc = subprocess.Popen(
        # Paced (at least 7.5 s in all), so that the crash below comes mid-run: 400 unpaced
        # steps did as much, for ~15 CPU-seconds of training more.
        [*TORCHRUN, "--nproc-per-node=2", "--max-restarts=1", "-m", "trainer", "--steps", "150",
         "--min-step-s", "0.05", "--ckpt-every", "10", "--log-every", "10", "--out", str(out)],
        cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        start_new_session=True,
        # torch 2.13: without this, restarted workers read stale rendezvous addresses.
        env={**os.environ, "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"})
    seen: list[str] = []
    _wait_for_training(proc, seen)
    ckpt = CheckpointStore(str(out / "checkpoints"), rank=0, world_size=2)
    deadline = time.monotonic() + 60
    while ckpt.latest() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert ckpt.latest() is not None, "no checkpoint before the crash"
    worker = psutil.Process(proc.pid).children()[-1]
    worker.kill()  # a crash, not a preemption: no chance to save
    assert proc.wait(240) == 0, "".join(seen)[-3000:]
    output = "".join(seen)
    assert "resumed from step" in output, output[-3000:]
    assert json.loads((out / "summary.json").read_text())["steps"] == 150


def write_shards(directory: Path) -> None:
    import numpy as np

    directory.mkdir()
    for i in range(2):  # nanoGPT's format: raw uint16 tokens
        ((np.arange(3000) * 3 + i) % 200).astype(np.uint16).tofile(directory / f"s{i}.bin")
    np.save(directory / "s2.npy", (np.arange(500) % 200).astype(np.int32))


def test_token_shards_sample_deterministically_within_bounds(tmp_path: Path):
    from sortie.trainer.data import TokenShards

    write_shards(tmp_path / "shards")
    shards = TokenShards(str(tmp_path / "shards"), seq_len=16)
    first = shards.sample(64, torch.Generator().manual_seed(7))
    again = shards.sample(64, torch.Generator().manual_seed(7))
    assert first.shape == (64, 17) and torch.equal(first, again)
    assert int(first.min()) >= 0 and int(first.max()) < 200
    # Every row is a contiguous run from one shard: consecutive tokens differ by 1 or 3 (mod 200).
    steps = (first[:, 1:] - first[:, :-1]) % 200
    assert all(len(set(row.tolist())) == 1 and row[0] in (1, 3) for row in steps)


def test_trains_on_token_shards_at_a_pace(tmp_path: Path):
    write_shards(tmp_path / "shards")
    result = torchrun(2, "--steps", "10", "--data-dir", str(tmp_path / "shards"), "--out",
                      str(tmp_path / "out"), "--min-step-s", "0.2", "--log-every", "5")
    assert result.returncode == 0, result.stderr[-3000:]
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["steps"] == 10 and summary["final_loss"] < 6
    # --min-step-s: no step faster than asked (a slower machine only adds to it)
    assert summary["train_time_s"] >= 10 * 0.2
    lines = [record for line in (tmp_path / "out" / "metrics.jsonl").open()
             if "step_time_s" in (record := json.loads(line))]
    assert [line["step"] for line in lines] == [5, 10]
    assert all(line["step_time_s"] >= 0.2 for line in lines)


def test_the_preemption_notice_comes_from_the_environment_sortie_sets(
        monkeypatch: pytest.MonkeyPatch):
    from sortie.trainer.config import parse_args

    assert parse_args([]).preemption_notice == "none"
    monkeypatch.setenv("SORTIE_PREEMPTION_NOTICE", "gcp")
    monkeypatch.setenv("SORTIE_METADATA_URL", "http://127.0.0.1:8080")
    config = parse_args([])
    assert (config.preemption_notice, config.metadata_url) == ("gcp", "http://127.0.0.1:8080")
    assert parse_args(["--preemption-notice", "none"]).preemption_notice == "none"


@pytest.mark.parametrize(("exit_code", "expected"), [(75, 75), (3, 1)])
def test_torchrun_wrapper_passes_a_preemption_exit_on(exit_code: int, expected: int,
                                                      tmp_path: Path):
    """Plain torchrun exits 1 whichever way a rank failed; trainer/torchrun.py exits 75 when a
    rank did (preempted: sortie relaunches), and 1 for any other failure."""
    script = tmp_path / "job.py"
    script.write_text(f"import os, sys, time\nif os.environ['RANK'] == '1':\n"
                      f"    sys.exit({exit_code})\ntime.sleep(5)\n")
    ran = subprocess.run([sys.executable, str(REPO / "trainer" / "torchrun.py"), "--standalone",
                          "--nproc-per-node=2", str(script)],
                         cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert ran.returncode == expected, ran.stderr[-3000:]
    # torchrun's table is one line (issue 66.7), which still says which rank and which exit.
    said = (r"\[sortie\] rank 1 stopped for a preemption \(exit 75\)" if exit_code == 75 else
            r"\[sortie\] torchrun: .*rank 1 \(exit 3\).* failed")
    assert re.search(said, ran.stderr), ran.stderr[-3000:]
    assert "Root Cause" not in ran.stderr


def test_a_run_resumed_at_its_last_step_reports_no_loss_rather_than_nan(tmp_path: Path):
    """A node lost between the last step and the exit: the relaunch resumes at the last step and
    trains nothing. Before, its summary said final loss NaN and 0 samples/s."""
    out = tmp_path / "out"
    common = ("--steps", "4", "--ckpt-every", "2", "--log-every", "2", "--out", str(out))
    assert torchrun(1, *common).returncode == 0
    again = torchrun(1, *common)
    assert again.returncode == 0, again.stderr[-3000:]
    assert "nothing left to train" in again.stdout
    summary = json.loads((out / "summary.json").read_text())
    assert summary["resumed_from"] == 4 and summary["final_loss"] is None
    assert summary["samples_per_s"] is None and "NaN" not in (out / "summary.json").read_text()


LISTENERS = """\
import os
port = int(os.environ["MASTER_PORT"])
for table in ("/proc/net/tcp", "/proc/net/tcp6"):
    for line in open(table).read().splitlines()[1:]:
        local, state = line.split()[1], line.split()[3]
        address, hexport = local.split(":")
        if state == "0A" and int(hexport, 16) == port:  # LISTEN on the store's port
            print("listening", address)
"""


def test_the_static_store_listens_only_on_the_rendezvous_address(tmp_path: Path):
    """Third review: the store listened on every interface (`*:PORT`) in loopback mode."""
    from sortie.stacks.machine.loopback import free_port

    script = tmp_path / "listeners.py"
    script.write_text(LISTENERS)
    port = free_port("127.0.1.7")
    done = subprocess.run(
        [sys.executable, str(REPO / "trainer" / "torchrun.py"), "--nnodes=1",
         "--nproc-per-node=1", "--rdzv-backend=static", "--node-rank=0",
         f"--rdzv-endpoint=127.0.1.7:{port}", "--rdzv-id=t", str(script)],
        capture_output=True, text=True, timeout=120, cwd=tmp_path,
        env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert done.returncode == 0, done.stderr[-2000:]
    seen = {line.split()[1] for line in done.stdout.splitlines() if line.startswith("listening")}
    assert seen == {"0701007F"}, seen  # 127.0.1.7 (little-endian), and nothing else
