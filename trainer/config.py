"""Trainer configuration: a dataclass filled from command-line flags."""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass, fields
from pathlib import Path


@dataclass(frozen=True)
class TrainConfig:
    steps: int = 100
    out: Path = Path("out")
    batch_size: int = 32  # per rank
    lr: float = 0.05
    seed: int = 0
    hidden: int = 256
    log_every: int = 10


class _OneLineErrorParser(argparse.ArgumentParser):
    """Bad flags end in one line on stderr and exit code 2, never a usage dump."""

    def error(self, message: str) -> None:  # type: ignore[override]
        sys.stderr.write(f"trainer: error: {message}\n")
        sys.exit(2)


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def _positive_float(text: str) -> float:
    value = float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {value}")
    return value


def parse_args(argv: list[str] | None = None) -> TrainConfig:
    parser = _OneLineErrorParser(prog="python -m trainer", description=__doc__)
    defaults = TrainConfig()
    parser.add_argument("--steps", type=_positive_int, default=defaults.steps,
                        help="optimizer steps to train")
    parser.add_argument("--out", type=Path, default=defaults.out,
                        help="directory for metrics.jsonl, summary.json and checkpoints")
    parser.add_argument("--batch-size", type=_positive_int, default=defaults.batch_size,
                        help="samples per rank per step")
    parser.add_argument("--lr", type=_positive_float, default=defaults.lr, help="learning rate")
    parser.add_argument("--seed", type=int, default=defaults.seed, help="seed for model and data")
    parser.add_argument("--hidden", type=_positive_int, default=defaults.hidden,
                        help="hidden width of the model")
    parser.add_argument("--log-every", type=_positive_int, default=defaults.log_every,
                        help="print and record metrics every K steps")
    args = parser.parse_args(argv)
    return TrainConfig(**{f.name: getattr(args, f.name) for f in fields(TrainConfig)})
