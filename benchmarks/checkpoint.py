"""Checkpoint costs for a ~100M-parameter model (the GPT at d_model 768, 14 layers, with AdamW).

In one run, side by side:
- save_vs_plain_write: Checkpointer.save (sync) over writing the very same bytes with plain file
  I/O to the same disk (target <= 1.5);
- async_stall_ratio: how long training is blocked by an async save (the copy into reused CPU
  staging buffers, from the second save on) over a sync save;
- sigterm_to_ckpt_s: from SIGTERM to every process of a 2-rank torchrun job until the preemption
  checkpoint is complete (target <= 5; clouds give 30 s to 2 min).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from trainer.checkpoint import Checkpointer  # noqa: E402
from trainer.config import parse_args  # noqa: E402
from trainer.data import batch  # noqa: E402
from trainer.model import build_model  # noqa: E402

MODEL = ["--d-model", "768", "--n-layers", "14", "--n-heads", "12", "--seq-len", "16",
         "--batch-size", "1"]


def training_state() -> dict:
    cfg = parse_args(MODEL)
    torch.manual_seed(0)
    model = build_model(cfg)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    model(*batch(cfg, 1, 0, torch.device("cpu"))).backward()
    optimizer.step()  # fills AdamW's moments: the state is ~3x the weights
    params = sum(p.numel() for p in model.parameters())
    print(f"model: {params / 1e6:.1f}M parameters")
    return {"step": 1, "model": model.state_dict(), "optimizer": optimizer.state_dict()}


def timed(fn) -> float:
    started = time.perf_counter()
    fn()
    return time.perf_counter() - started


def sigterm_to_checkpoint(tmp: Path) -> float:
    out = tmp / "sigterm"
    proc = subprocess.Popen(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2",
         "-m", "trainer", *MODEL, "--steps", "100000", "--log-every", "1", "--out", str(out)],
        cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
        start_new_session=True)
    for line in proc.stdout:  # wait until training runs
        if line.startswith("step "):
            break
    sent = time.perf_counter()
    os.killpg(proc.pid, signal.SIGTERM)
    marker = out / "preempted.json"
    while not marker.exists() and proc.poll() is None:
        time.sleep(0.01)
    elapsed = time.perf_counter() - sent
    proc.wait(120)
    if not marker.exists():
        sys.exit("the job ended without a preemption checkpoint")
    return elapsed


def main() -> None:
    state = training_state()
    with tempfile.TemporaryDirectory(prefix="sortie-bench-", dir=REPO) as name:
        tmp = Path(name)
        sync = Checkpointer(str(tmp / "sync"), rank=0, world_size=1, keep_last=1)
        save_s = timed(lambda: sync.save(1, state))
        payload = (tmp / "sync" / "step-00000001" / "state.pt").read_bytes()

        def plain_write() -> None:
            with open(tmp / "plain.bin", "wb") as f:
                f.write(payload)

        plain_s = timed(plain_write)
        print(f"sync save {save_s:.3f}s; plain write of the same {len(payload) / 2**20:,.0f} MiB "
              f"{plain_s:.3f}s")

        # Async: the first save allocates its staging buffers; training saves many times, so the
        # stall that counts is the steady one, from the second save on.
        background = Checkpointer(str(tmp / "async"), rank=0, world_size=1, async_save=True)
        first_stall_s = timed(lambda: background.save(1, state))
        background.wait()
        stall_s = timed(lambda: background.save(2, state))
        finish_s = timed(background.wait)
        print(f"async save blocks training {stall_s:.3f}s (first save {first_stall_s:.3f}s), "
              f"then writes for {finish_s:.3f}s")

        sigterm_s = sigterm_to_checkpoint(tmp)
        print(f"SIGTERM to complete checkpoint: {sigterm_s:.2f}s")
    print(f"RESULT save_vs_plain_write={save_s / plain_s:.3f}")
    print(f"RESULT async_stall_ratio={stall_s / save_s:.3f}")
    print(f"RESULT sigterm_to_ckpt_s={sigterm_s:.2f}")


if __name__ == "__main__":
    main()
