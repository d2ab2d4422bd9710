"""A minimal DDP trainer: a small MLP regressing a fixed synthetic teacher.

Runs under torchrun on CPU (gloo) or GPU (nccl, one process per GPU by LOCAL_RANK). Global rank 0
writes ``metrics.jsonl``, ``summary.json`` and ``checkpoint-final.pt`` into ``--out``.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from trainer.config import TrainConfig, parse_args

IN_FEATURES = 32


def build_model(hidden: int) -> nn.Module:
    return nn.Sequential(nn.Linear(IN_FEATURES, hidden), nn.ReLU(), nn.Linear(hidden, 1))


def synthetic_batch(step: int, rank: int, cfg: TrainConfig, device: torch.device):
    """Deterministic per (seed, rank, step): each rank sees its own shard of the stream."""
    gen = torch.Generator().manual_seed(cfg.seed * 1_000_003 + rank * 10_007 + step)
    x = torch.randn(cfg.batch_size, IN_FEATURES, generator=gen)
    teacher = torch.Generator().manual_seed(cfg.seed)
    w = torch.randn(IN_FEATURES, 1, generator=teacher)
    y = torch.sin(x @ w) + 0.01 * torch.randn(cfg.batch_size, 1, generator=gen)
    return x.to(device), y.to(device)


def atomic_save(obj: object, path: Path) -> None:
    """Write to a temporary name, then rename: a crash never leaves a half-written file."""
    tmp = path.with_name(path.name + ".tmp")
    torch.save(obj, tmp)
    os.replace(tmp, path)


def main(argv: list[str] | None = None) -> int:
    cfg = parse_args(argv)
    use_cuda = torch.cuda.is_available()
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if use_cuda:
        torch.cuda.set_device(local_rank)
    device = torch.device("cuda", local_rank) if use_cuda else torch.device("cpu")
    dist.init_process_group(backend="nccl" if use_cuda else "gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    is_main = rank == 0

    torch.manual_seed(cfg.seed)  # same initial weights on every rank
    model = DDP(build_model(cfg.hidden).to(device),
                device_ids=[local_rank] if use_cuda else None)
    optimizer = torch.optim.SGD(model.parameters(), lr=cfg.lr, momentum=0.9)
    loss_fn = nn.MSELoss()

    if is_main:
        cfg.out.mkdir(parents=True, exist_ok=True)
        metrics = (cfg.out / "metrics.jsonl").open("w")
        print(f"trainer: world_size={world} device={device.type} steps={cfg.steps}", flush=True)

    started = time.perf_counter()
    window_start, window_steps = started, 0
    loss_value = float("nan")
    for step in range(1, cfg.steps + 1):
        x, y = synthetic_batch(step, rank, cfg, device)
        optimizer.zero_grad(set_to_none=True)
        loss = loss_fn(model(x), y)
        loss.backward()
        optimizer.step()
        window_steps += 1
        if step % cfg.log_every == 0 or step == cfg.steps:
            # Average the loss over ranks so the logged figure describes the whole job.
            reduced = loss.detach().clone()
            dist.all_reduce(reduced, op=dist.ReduceOp.SUM)
            loss_value = reduced.item() / world
            now = time.perf_counter()
            step_time = (now - window_start) / window_steps
            samples_per_s = cfg.batch_size * world / step_time
            window_start, window_steps = now, 0
            if is_main:
                record = {"step": step, "loss": loss_value, "lr": cfg.lr,
                          "samples_per_s": samples_per_s, "step_time_s": step_time}
                metrics.write(json.dumps(record) + "\n")
                metrics.flush()
                print(f"step {step:>6}/{cfg.steps}  loss {loss_value:.5f}  "
                      f"{samples_per_s:,.0f} samples/s", flush=True)
    train_time = time.perf_counter() - started

    if is_main:
        metrics.close()
        atomic_save({"step": cfg.steps, "model": model.module.state_dict(),
                     "optimizer": optimizer.state_dict()}, cfg.out / "checkpoint-final.pt")
        summary = {"steps": cfg.steps, "world_size": world, "final_loss": loss_value,
                   "samples_per_s": cfg.batch_size * world * cfg.steps / train_time,
                   "train_time_s": train_time, "device": device.type}
        (cfg.out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
        print(f"trainer: done in {train_time:.2f}s, final loss {loss_value:.5f}", flush=True)
    # Release the DDP reducer before the process group, then leave together: gloo work still
    # referenced at interpreter shutdown aborts the process ("terminate called without an
    # active exception"), and a barrier avoids a teardown race when ranks finish apart.
    del model, optimizer
    dist.barrier()
    dist.destroy_process_group()
    return 0
