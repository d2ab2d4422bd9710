"""How the trainer benchmarks start a local torchrun job: one process per GPU where there are
GPUs (NCCL, bf16), else two CPU processes (gloo), as the trainer itself chooses."""

from __future__ import annotations

import sys


def procs_per_node() -> int:
    import torch

    return torch.cuda.device_count() or 2


def torchrun_command(*args: str) -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", "--standalone",
            f"--nproc-per-node={procs_per_node()}", *args]
