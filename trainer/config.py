"""Trainer configuration: one dataclass. Each field is one option: its flag (``--batch-size``),
type, default, bounds, help, and for what bootstrap injects, the environment variable that sets
it, are declared once, in the field; `parse_args` builds the command line from them."""

from __future__ import annotations

import argparse
import math
import os
import sys
from dataclasses import MISSING, dataclass, field, fields
from typing import Any

from .notices import NOTICES

PREEMPTED_EXIT_CODE = 75  # EX_TEMPFAIL: "try again" - bootstrap restarts the job from a checkpoint


def option(default: Any, help: str = "", *, minimum: float | None = None,  # noqa: A002
           above: float | None = None, choices: tuple[str, ...] = (), env: str = "") -> Any:
    """A dataclass field that is also a flag: ``minimum`` (>=) or ``above`` (>) bound a number,
    ``env`` names the variable that sets the default (what sortie injects on its nodes)."""
    return field(default=default, metadata={"help": help, "minimum": minimum, "above": above,
                                            "choices": choices, "env": env})


@dataclass(frozen=True)
class TrainConfig:
    steps: int = option(100, "steps to train to", minimum=1)
    out: str = option("out", "output directory: metrics.jsonl, summary.json, "
                      "checkpoint-final.pt")
    model: str = option("gpt", "a small transformer LM (gpt) or an MLP", choices=("gpt", "mlp"))
    data_dir: str = option("", "directory of token shards (.bin uint16 or .npy) for --model gpt; "
                           "synthetic data if not given")
    batch_size: int = option(8, "sequences (gpt) or samples (mlp) per rank per step", minimum=1)
    seq_len: int = option(64, minimum=2)
    vocab_size: int = option(256, minimum=2)
    d_model: int = option(64, minimum=8)
    n_layers: int = option(2, minimum=1)
    n_heads: int = option(4, minimum=1)
    lr: float = option(3e-3, "peak learning rate", above=0)
    warmup_steps: int = option(10, minimum=0)
    seed: int = option(0)
    log_every: int = option(10, "record metrics and print a line every K steps", minimum=1)
    ckpt_url: str = option("", "checkpoint directory or fsspec URL (s3://, gs://, az://); "
                           "default <out>/checkpoints", env="SORTIE_CHECKPOINT_URL")
    ckpt_every: int = option(0, "save every N steps (0: only at the end)", minimum=0)
    keep_last: int = option(2, "complete checkpoints to keep", minimum=1)
    async_ckpt: bool = option(False, "write checkpoints in the background")
    min_step_s: float = option(0.0, "pace: each step takes at least this many seconds (a GPU "
                               "step's time when rehearsing on shared CPUs; 0: flat out)",
                               minimum=0)
    deterministic: bool = option(False, "reduce each gradient separately so that a resumed run "
                                 "is bit-identical")
    preemption_notice: str = option("none", "poll this cloud's preemption notice (sortie sets "
                                    "it on cloud nodes)", choices=NOTICES,
                                    env="SORTIE_PREEMPTION_NOTICE")
    metadata_url: str = option("", "base URL of the metadata service (default: the cloud's own)",
                               env="SORTIE_METADATA_URL")

    @property
    def checkpoint_url(self) -> str:
        return self.ckpt_url or f"{self.out.rstrip('/')}/checkpoints"


class FlagsError(ValueError):
    """A flag the trainer would refuse (`check_flags`); the message is argparse's."""


class _OneLineErrorParser(argparse.ArgumentParser):
    """Bad flags end in one line on stderr and exit code 2, never a usage dump (or, for
    `check_flags`, in a FlagsError)."""

    raise_errors = False

    def error(self, message: str) -> None:  # type: ignore[override]
        if self.raise_errors:
            raise FlagsError(message)
        sys.stderr.write(f"trainer: error: {message}\n")
        sys.exit(2)


def _bounded(kind: type, minimum: float | None, above: float | None):
    def parse(text: str) -> Any:
        value = kind(text)
        if kind is float and not math.isfinite(value):
            raise argparse.ArgumentTypeError(f"must be a finite number, got {text}")
        if minimum is not None and value < minimum:
            raise argparse.ArgumentTypeError(f"must be >= {minimum}, got {value}")
        if above is not None and not value > above:
            raise argparse.ArgumentTypeError(f"must be > {above}, got {value}")
        return value
    parse.__name__ = kind.__name__  # argparse names the type in "invalid int value"
    return parse


def build_parser() -> _OneLineErrorParser:
    """The trainer's command line, one flag per `TrainConfig` field."""
    parser = _OneLineErrorParser(prog="python -m trainer",
                                 description="The bundled sortie trainer (run it under torchrun).")
    for spec in fields(TrainConfig):
        meta, flag = spec.metadata, "--" + spec.name.replace("_", "-")
        default = os.environ.get(meta["env"], spec.default) if meta["env"] else spec.default
        assert default is not MISSING
        help_text = meta["help"] + (f" (env {meta['env']})" if meta["env"] else "")
        kind = {"int": int, "float": float, "str": str, "bool": bool}[str(spec.type)]
        if kind is bool:
            parser.add_argument(flag, action="store_true", help=help_text)
        else:
            parser.add_argument(flag, default=default, help=help_text or None,
                                choices=meta["choices"] or None,
                                type=_bounded(kind, meta["minimum"], meta["above"]))
    return parser


def check_flags(argv: list[str]) -> None:
    """What the trainer's own parser would refuse of ``argv`` (an unknown flag, a bad value),
    found before a cluster is launched for it: a FlagsError. Only a node can check --data-dir."""
    if {"-h", "--help"} & set(argv):
        raise FlagsError("--help: see the trainer's flags with `python -m trainer --help`")
    parser = build_parser()
    parser.raise_errors = True
    args = parser.parse_args(argv)
    problem = _combination_problem(args)
    if problem:
        raise FlagsError(problem)


def _combination_problem(args: argparse.Namespace) -> str | None:
    """What no single flag says wrong but their combination is (the trainer's own check)."""
    if args.data_dir and args.model != "gpt":
        return "argument --data-dir: token shards need --model gpt"
    if args.model == "gpt" and args.d_model % args.n_heads:
        return (f"argument --d-model: {args.d_model} is not divisible by --n-heads "
                f"{args.n_heads}")
    return None


def parse_args(argv: list[str] | None = None) -> TrainConfig:
    parser = build_parser()
    args = parser.parse_args(argv)
    config = TrainConfig(**{f.name: getattr(args, f.name) for f in fields(TrainConfig)})
    if config.data_dir and not os.path.isdir(config.data_dir):
        parser.error(f"argument --data-dir: {config.data_dir} is not a directory")
    problem = _combination_problem(args)
    if problem:
        parser.error(problem)
    return config
