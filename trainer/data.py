"""Synthetic data, deterministic per (seed, step, rank): each rank reads its own shard of the
stream, and the position in the data is the step itself, so resuming needs no loader state."""

from __future__ import annotations

import torch

from trainer.config import TrainConfig
from trainer.model import MLP


def batch(cfg: TrainConfig, step: int, rank: int, device: torch.device):
    gen = torch.Generator().manual_seed(cfg.seed * 1_000_003 + rank * 10_007 + step)
    if cfg.model == "gpt":
        # A learnable language: each sequence counts up by a stride from a random start.
        start = torch.randint(cfg.vocab_size, (cfg.batch_size, 1), generator=gen)
        stride = torch.randint(1, 4, (cfg.batch_size, 1), generator=gen)
        seq = (start + stride * torch.arange(cfg.seq_len + 1)) % cfg.vocab_size
        return seq[:, :-1].to(device), seq[:, 1:].to(device)
    teacher = torch.randn(MLP.IN_FEATURES, 1, generator=torch.Generator().manual_seed(cfg.seed))
    x = torch.randn(cfg.batch_size, MLP.IN_FEATURES, generator=gen)
    y = torch.sin(x @ teacher) + 0.01 * torch.randn(cfg.batch_size, 1, generator=gen)
    return x.to(device), y.to(device)


def samples_per_step(cfg: TrainConfig, world: int) -> int:
    return cfg.batch_size * world


def tokens_per_step(cfg: TrainConfig, world: int) -> int:
    return cfg.batch_size * world * (cfg.seq_len if cfg.model == "gpt" else 1)
