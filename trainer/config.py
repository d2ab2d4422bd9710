"""Trainer configuration: a dataclass filled from flags, and from the environment for what
bootstrap injects (the run id and the checkpoint URL)."""

from __future__ import annotations

import argparse
import os
import sys
from dataclasses import dataclass, fields

PREEMPTED_EXIT_CODE = 75  # EX_TEMPFAIL: "try again" - bootstrap restarts the job from a checkpoint


@dataclass(frozen=True)
class TrainConfig:
    steps: int = 100
    out: str = "out"  # metrics.jsonl, summary.json, checkpoint-final.pt
    model: str = "gpt"  # "gpt" (a small transformer LM) or "mlp"
    data_dir: str = ""  # token shards for the gpt model; synthetic data when empty
    batch_size: int = 8  # sequences (gpt) or samples (mlp) per rank per step
    seq_len: int = 64
    vocab_size: int = 256
    d_model: int = 64
    n_layers: int = 2
    n_heads: int = 4
    lr: float = 3e-3
    warmup_steps: int = 10
    seed: int = 0
    log_every: int = 10
    ckpt_url: str = ""  # local path or fsspec URL (s3://, gs://, az://); default <out>/checkpoints
    ckpt_every: int = 0  # 0: only the final checkpoint
    keep_last: int = 2
    async_ckpt: bool = False
    deterministic: bool = False  # all-reduce each gradient on its own: bit-exact resume
    preemption_notice: str = "none"  # "aws", "gcp", "azure" or "none"
    metadata_url: str = ""  # override the cloud's metadata endpoint (tests use a local server)
    run_id: str = "local"

    @property
    def checkpoint_url(self) -> str:
        return self.ckpt_url or f"{self.out.rstrip('/')}/checkpoints"


class _OneLineErrorParser(argparse.ArgumentParser):
    """Bad flags end in one line on stderr and exit code 2, never a usage dump."""

    def error(self, message: str) -> None:  # type: ignore[override]
        sys.stderr.write(f"trainer: error: {message}\n")
        sys.exit(2)


def _at_least(minimum: int):
    def parse(text: str) -> int:
        value = int(text)
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be >= {minimum}, got {value}")
        return value
    return parse


def _positive_float(text: str) -> float:
    value = float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {value}")
    return value


def parse_args(argv: list[str] | None = None) -> TrainConfig:
    defaults = TrainConfig()
    p = _OneLineErrorParser(prog="python -m trainer",
                            description="The bundled sortie trainer (run it under torchrun).")
    p.add_argument("--steps", type=_at_least(1), default=defaults.steps, help="steps to train to")
    p.add_argument("--out", default=defaults.out, help="output directory")
    p.add_argument("--model", choices=("gpt", "mlp"), default=defaults.model)
    p.add_argument("--data-dir", default=defaults.data_dir,
                   help="directory of token shards (.bin uint16 or .npy) for --model gpt; "
                   "synthetic data if not given")
    p.add_argument("--batch-size", type=_at_least(1), default=defaults.batch_size,
                   help="per rank per step")
    p.add_argument("--seq-len", type=_at_least(2), default=defaults.seq_len)
    p.add_argument("--vocab-size", type=_at_least(2), default=defaults.vocab_size)
    p.add_argument("--d-model", type=_at_least(8), default=defaults.d_model)
    p.add_argument("--n-layers", type=_at_least(1), default=defaults.n_layers)
    p.add_argument("--n-heads", type=_at_least(1), default=defaults.n_heads)
    p.add_argument("--lr", type=_positive_float, default=defaults.lr, help="peak learning rate")
    p.add_argument("--warmup-steps", type=_at_least(0), default=defaults.warmup_steps)
    p.add_argument("--seed", type=int, default=defaults.seed)
    p.add_argument("--log-every", type=_at_least(1), default=defaults.log_every,
                   help="record metrics and print a line every K steps")
    p.add_argument("--ckpt-url", default=os.environ.get("SORTIE_CHECKPOINT_URL", ""),
                   help="checkpoint directory or fsspec URL (env SORTIE_CHECKPOINT_URL)")
    p.add_argument("--ckpt-every", type=_at_least(0), default=defaults.ckpt_every,
                   help="save every N steps (0: only at the end)")
    p.add_argument("--keep-last", type=_at_least(1), default=defaults.keep_last,
                   help="complete checkpoints to keep")
    p.add_argument("--async-ckpt", action="store_true", help="write checkpoints in the background")
    p.add_argument("--deterministic", action="store_true",
                   help="reduce each gradient separately so that a resumed run is bit-identical")
    p.add_argument("--preemption-notice", choices=("none", "aws", "gcp", "azure"),
                   default=os.environ.get("SORTIE_PREEMPTION_NOTICE",
                                          defaults.preemption_notice),
                   help="poll this cloud's preemption notice (env SORTIE_PREEMPTION_NOTICE, "
                   "which sortie sets on cloud nodes)")
    p.add_argument("--metadata-url", default=os.environ.get("SORTIE_METADATA_URL",
                                                            defaults.metadata_url),
                   help="base URL of the metadata service (default: the cloud's own; env "
                   "SORTIE_METADATA_URL)")
    p.add_argument("--run-id", default=os.environ.get("SORTIE_RUN_ID", defaults.run_id),
                   help="run id (env SORTIE_RUN_ID)")
    args = p.parse_args(argv)
    config = TrainConfig(**{f.name: getattr(args, f.name) for f in fields(TrainConfig)})
    if config.data_dir and not os.path.isdir(config.data_dir):
        p.error(f"argument --data-dir: {config.data_dir} is not a directory")
    if config.data_dir and config.model != "gpt":
        p.error("argument --data-dir: token shards need --model gpt")
    if config.model == "gpt" and config.d_model % config.n_heads:
        p.error(f"argument --d-model: {config.d_model} is not divisible by --n-heads "
                f"{config.n_heads}")
    return config
