"""A bare DDP loop on the bundled trainer's model and data: the baseline for trainer_throughput.

Run under torchrun with the trainer's model flags; prints `BARE samples_per_s=<n>` on rank 0."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from sortie.trainer.config import parse_args  # noqa: E402
from sortie.trainer.data import batch, samples_per_step  # noqa: E402
from sortie.trainer.model import build_model  # noqa: E402
from sortie.trainer.train import autocast_for, init_distributed  # noqa: E402


def main() -> None:
    cfg = parse_args(sys.argv[1:])
    device, local_rank = init_distributed()  # as the trainer: NCCL and bf16 on GPUs, else gloo
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(cfg.seed)
    model = DDP(build_model(cfg).to(device),
                device_ids=[local_rank] if device.type == "cuda" else None)
    optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=0.01)
    started = time.perf_counter()
    for step in range(1, cfg.steps + 1):
        inputs, targets = batch(cfg, step, rank, device)
        optimizer.zero_grad(set_to_none=True)
        with autocast_for(device):
            loss = model(inputs, targets)
        loss.backward()
        optimizer.step()
    if device.type == "cuda":
        torch.cuda.synchronize()
    elapsed = time.perf_counter() - started
    if rank == 0:
        print(f"BARE samples_per_s={samples_per_step(cfg, world) * cfg.steps / elapsed}")
    del model, optimizer
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
