"""Checkpoint costs for a ~100M-parameter model (the GPT at d_model 768, 14 layers, with AdamW).

In one run, side by side:
- save_vs_plain_write: CheckpointStore.save (sync, durable) over writing the very same bytes with
  plain file I/O and fsync to the same disk: the median of per-round ratios over alternating
  rounds (target <= 1.5);
- async_stall_ratio: how long training is blocked by an async save (the copy into reused CPU
  staging buffers, from the second save on) over a sync save;
- sigterm_to_ckpt_s: from SIGTERM to every process of a torchrun job (one rank per GPU, else 2)
  until the preemption checkpoint is complete (target <= 5; clouds give 30 s to 2 min).

The state lives where training keeps it: on the GPU when there is one (a save then includes the
copy to host memory).
"""

from __future__ import annotations

import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from benchmarks.torchrun import torchrun_command  # noqa: E402
from sortie.trainer.checkpoint import CheckpointStore  # noqa: E402
from sortie.trainer.config import parse_args  # noqa: E402
from sortie.trainer.data import batch  # noqa: E402
from sortie.trainer.model import build_model  # noqa: E402

MODEL = ["--d-model", "768", "--n-layers", "14", "--n-heads", "12", "--seq-len", "16",
         "--batch-size", "1"]


def training_state() -> dict:
    cfg = parse_args(MODEL)
    torch.manual_seed(0)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    model = build_model(cfg).to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    model(*batch(cfg, 1, 0, device)).backward()
    optimizer.step()  # fills AdamW's moments: the state is ~3x the weights
    params = sum(p.numel() for p in model.parameters())
    print(f"model: {params / 1e6:.1f}M parameters")
    return {"step": 1, "model": model.state_dict(), "optimizer": optimizer.state_dict()}


ROUNDS = 5


def plain_write(path: Path, payload: bytes) -> None:
    """What a checkpoint save does at the least: a new file, durable, the previous one removed
    (like keep_last=1). Rewriting one file would reuse its freed blocks and flatter this side."""
    with open(path, "wb") as f:
        f.write(payload)
        f.flush()
        os.fsync(f.fileno())
    for older in path.parent.glob("plain-*.bin"):
        if older != path:
            older.unlink()


def timed(fn) -> float:
    started = time.perf_counter()
    fn()
    return time.perf_counter() - started


def sigterm_to_checkpoint(tmp: Path) -> float:
    out = tmp / "sigterm"
    proc = subprocess.Popen(
        torchrun_command("-m", "trainer", *MODEL, "--steps", "100000", "--log-every", "1",
                         "--out", str(out)),
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
        # Alternate save and plain write (swapping which goes first), each from a clean page cache,
        # each durable (fsync) and each to a new file, so that neither bills the other.
        sync = CheckpointStore(str(tmp / "sync"), rank=0, world_size=1, keep_last=1)
        sync.save(0, state)
        payload = (tmp / "sync" / f"step-{0:08d}" / "state.pt").read_bytes()
        saves, plains = [], []
        for round_ in range(1, ROUNDS + 1):
            runs = [(saves, lambda r=round_: sync.save(r, state)),
                    (plains, lambda r=round_: plain_write(tmp / f"plain-{r}.bin", payload))]
            for results, run in runs if round_ % 2 else reversed(runs):
                os.sync()
                results.append(timed(run))
        # This disk's speed swings several-fold from round to round; within a round both sides
        # see the same disk, so the figure is the median of the per-round ratios.
        save_s = statistics.median(saves)
        save_vs_plain = statistics.median(s / p for s, p in zip(saves, plains, strict=True))
        print(f"sync save vs plain write of the same {len(payload) / 2**20:,.0f} MiB, per round: "
              + ", ".join(f"{s:.2f}s/{p:.2f}s" for s, p in zip(saves, plains, strict=True)))

        # Async: the first save allocates its staging buffers; training saves many times, so the
        # stall that counts is the steady one, from the second save on.
        background = CheckpointStore(str(tmp / "async"), rank=0, world_size=1, async_save=True)
        first_stall_s = timed(lambda: background.save(1, state))
        background.wait()
        stall_s = timed(lambda: background.save(2, state))
        finish_s = timed(background.wait)
        print(f"async save blocks training {stall_s:.3f}s (first save {first_stall_s:.3f}s), "
              f"then writes for {finish_s:.3f}s")

        sigterm_s = sigterm_to_checkpoint(tmp)
        print(f"SIGTERM to complete checkpoint: {sigterm_s:.2f}s")
    print(f"RESULT save_vs_plain_write={save_vs_plain:.3f}")
    print(f"RESULT async_stall_ratio={stall_s / save_s:.3f}")
    print(f"RESULT sigterm_to_ckpt_s={sigterm_s:.2f}")


if __name__ == "__main__":
    main()
