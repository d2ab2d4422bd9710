"""Training data, deterministic per (seed, step, rank): each rank reads its own shard of the
stream, and the position in the data is the step itself, so resuming needs no loader state.

Synthetic by default; with ``--data-dir``, language-model sequences come from a directory of
token shards: ``.bin`` files of uint16 tokens (nanoGPT's format) or ``.npy`` integer arrays.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from .config import TrainConfig
from .model import MLP


class TokenShards:
    """Memory-mapped token shards; a sample is ``seq_len + 1`` tokens at a random offset."""

    def __init__(self, directory: str, seq_len: int) -> None:
        files = sorted(p for p in Path(directory).iterdir() if p.suffix in (".bin", ".npy"))
        self.shards = [np.memmap(f, dtype=np.uint16, mode="r") if f.suffix == ".bin"
                       else np.load(f, mmap_mode="r") for f in files]
        self.shards = [s for s in self.shards if len(s) > seq_len + 1]
        if not self.shards:
            raise ValueError(f"--data-dir {directory}: no .bin or .npy shard longer than "
                             f"--seq-len + 1 ({seq_len + 1}) tokens")
        self.seq_len = seq_len
        # Valid start offsets of every shard, laid end to end.
        self.ends = np.cumsum([len(s) - seq_len - 1 for s in self.shards])

    def sample(self, count: int, gen: torch.Generator) -> torch.Tensor:
        starts = torch.randint(int(self.ends[-1]), (count,), generator=gen).numpy()
        rows = []
        for start in starts:
            index = int(np.searchsorted(self.ends, start, side="right"))
            offset = int(start - (self.ends[index - 1] if index else 0))
            rows.append(np.asarray(self.shards[index][offset:offset + self.seq_len + 1],
                                   dtype=np.int64))
        return torch.from_numpy(np.stack(rows))


def batch(cfg: TrainConfig, step: int, rank: int, device: torch.device,
          shards: TokenShards | None = None):
    gen = torch.Generator().manual_seed(cfg.seed * 1_000_003 + rank * 10_007 + step)
    if cfg.model == "gpt":
        if shards is not None:
            seq = shards.sample(cfg.batch_size, gen)
            if int(seq.max()) >= cfg.vocab_size:
                raise ValueError(f"--vocab-size {cfg.vocab_size} is too small: the shards in "
                                 f"--data-dir hold token {int(seq.max())}")
        else:
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
