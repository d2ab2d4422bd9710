"""Checkpoints on a local path or any fsspec URL (s3://, gs://, az://).

`Checkpointer` is what the training loop talks to: it decides when to save (every
``--ckpt-every`` steps, the last step, a preemption) and owns what is saved (the model, optimizer
and LR schedule, each rank's RNG); `CheckpointStore` writes and reads them.

One directory per step, written by every rank::

    step-00000120/meta.json         rank 0, first: step and world size
    step-00000120/state.pt          rank 0: model, optimizer, LR schedule, step
    step-00000120/rng-rank00003.pt  each rank: its RNG state
    step-00000120/done-rank00003    each rank, last (local files are fsynced before it)

A checkpoint is complete when meta.json and every rank's done marker exist. A crash or kill in the
middle of a write leaves it incomplete, and incomplete checkpoints are never loaded: the same rule
holds on object stores, where there is no atomic rename, and needs no collective, so a background
(async) save uses it too.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import time
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import torch
import torch.distributed as dist
from fsspec.implementations.local import LocalFileSystem

from .checkpoint_layout import CheckpointLayout


def rng_state() -> dict[str, Any]:
    state: dict[str, Any] = {"torch": torch.get_rng_state(), "python": random.getstate()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    random.setstate(state["python"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def _without_crc32() -> contextlib.AbstractContextManager:
    """torch.save's zip writer checksums every byte (CRC32), which more than doubled save time for
    a GB of state here. Completion markers already guard a checkpoint's integrity; where this
    torch has no switch for it, keep the default."""
    try:
        from torch.utils.serialization import config
    except ImportError:
        return contextlib.nullcontext()
    # (torch installs `patch` on its config modules at import: the checker cannot see it)
    return config.patch({"save.compute_crc32": False})  # type: ignore[attr-defined]


class StagingBuffers:
    """CPU copies of the training state for async saves, reused from one save to the next: fresh
    memory for every save costs page faults (seconds for a GB of state), a reused buffer only the
    copy. A buffer is overwritten only once the previous write has finished."""

    def __init__(self) -> None:
        self._buffers: dict[tuple, torch.Tensor] = {}

    def copy(self, obj: Any, path: tuple = ()) -> Any:
        if isinstance(obj, torch.Tensor):
            buffer = self._buffers.get(path)
            if buffer is None or buffer.shape != obj.shape or buffer.dtype != obj.dtype:
                buffer = torch.empty(obj.shape, dtype=obj.dtype, device="cpu",
                                     pin_memory=torch.cuda.is_available())
                self._buffers[path] = buffer
            return buffer.copy_(obj.detach())
        if isinstance(obj, dict):
            return {key: self.copy(value, (*path, key)) for key, value in obj.items()}
        if isinstance(obj, list | tuple):
            return type(obj)(self.copy(value, (*path, i)) for i, value in enumerate(obj))
        return obj


class CheckpointStore(CheckpointLayout):
    """Complete checkpoints on a path or URL: written by every rank, found, loaded, pruned."""

    def __init__(self, url: str, rank: int, world_size: int, keep_last: int = 2,
                 async_save: bool = False) -> None:
        super().__init__(url)
        self.rank, self.world_size, self.keep_last = rank, world_size, keep_last
        self._writer = ThreadPoolExecutor(max_workers=1) if async_save else None
        self._staging = StagingBuffers()
        self._in_flight: Future | None = None

    # -- save -------------------------------------------------------------------------------

    def save(self, step: int, state: dict[str, Any] | None) -> None:
        """Save ``state`` (rank 0's training state; None on other ranks) and this rank's RNG.

        Async: the state is copied to the CPU now and written in the background; at most one save
        is in flight, so the next save (or ``wait``) first finishes the previous one."""
        self.wait()
        snapshot = (self._staging.copy(state) if self._writer else state), rng_state()
        if self._writer:
            self._in_flight = self._writer.submit(self._write, step, *snapshot)
        else:
            self._write(step, *snapshot)

    def wait(self) -> None:
        if self._in_flight is not None:
            future, self._in_flight = self._in_flight, None
            future.result()  # re-raises a failed background write

    def _write(self, step: int, state: dict[str, Any] | None, rng: dict[str, Any]) -> None:
        directory = self.step_dir(step)
        self.fs.makedirs(directory, exist_ok=True)
        if self.rank == 0:
            meta = {"step": step, "world_size": self.world_size}
            self.fs.pipe_file(f"{directory}/meta.json", json.dumps(meta).encode())
            self._save(state, f"{directory}/state.pt")
        self._save(rng, f"{directory}/rng-rank{self.rank:05d}.pt")
        self.fs.pipe_file(f"{directory}/done-rank{self.rank:05d}", b"")
        if self.rank == 0:
            self.prune()

    def _save(self, obj: Any, path: str) -> None:
        with self.fs.open(path, "wb") as f, _without_crc32():
            torch.save(obj, f)
            if isinstance(self.fs, LocalFileSystem):
                # On disk before the done marker says so: a VM stopped hard loses the page cache.
                # (Object stores hold an object once its upload completes, on close.)
                f.flush()
                os.fsync(f.fileno())

    def prune(self) -> None:
        """Keep the newest ``keep_last`` complete checkpoints; drop older and abandoned ones.

        Rank 0 prunes once its part of a checkpoint is done, when that checkpoint may still lack
        other ranks' parts; the last one is pruned again once every rank is done."""
        steps = self._steps()
        complete = [s for s in steps if self._is_complete(s)]
        keep = set(complete[-self.keep_last:])
        newest_complete = complete[-1] if complete else -1
        for step in steps:
            if step not in keep and step < newest_complete:
                self.fs.rm(self.step_dir(step), recursive=True)

    # -- load -------------------------------------------------------------------------------

    def load(self, step: int) -> tuple[dict[str, Any], dict[str, Any] | None]:
        """(training state, this rank's RNG state or None if the world size changed)."""
        directory = self.step_dir(step)
        with self.fs.open(f"{directory}/state.pt", "rb") as f:
            state = torch.load(f, map_location="cpu", weights_only=True)
        meta = json.loads(self.fs.cat_file(f"{directory}/meta.json"))
        if meta["world_size"] != self.world_size:
            return state, None
        with self.fs.open(f"{directory}/rng-rank{self.rank:05d}.pt", "rb") as f:
            return state, torch.load(f, map_location="cpu", weights_only=True)


class Checkpointer:
    """When the trainer saves, and what: ``states`` (rank 0's model, optimizer and LR schedule,
    each with ``state_dict``/``load_state_dict``) and each rank's RNG."""

    def __init__(self, url: str, rank: int, world_size: int, states: dict[str, Any],
                 every: int = 0, last_step: int = 0, keep_last: int = 2,
                 async_save: bool = False) -> None:
        self.store = CheckpointStore(url, rank, world_size, keep_last, async_save)
        self.states, self.every, self.last_step = states, every, last_step
        self.is_main = rank == 0
        self.resumed_from: int | None = None
        self.seconds = 0.0  # time the training loop spent in saves

    def load(self) -> int:
        """Restore the newest complete checkpoint into ``states`` and the RNG; the step it was
        taken at, or 0 when there is none."""
        step = self.store.latest()
        if step is None:
            return 0
        state, rng = self.store.load(step)
        for name, stateful in self.states.items():
            stateful.load_state_dict(state[name])
        if rng is not None:  # None: the world size changed, and each rank starts a new stream
            set_rng_state(rng)
        self.resumed_from = step
        return step

    def save(self, step: int, last_step: bool = False, preempted: bool = False) -> bool:
        """Called after every step: saves every ``every`` steps; at the last step (once every
        rank is done, pruned again) and on a preemption, saves and waits for the write.
        Whether it saved."""
        periodic = self.every and step % self.every == 0 and step != self.last_step
        if not (periodic or last_step or preempted) or step == self.resumed_from:
            return False
        started = time.perf_counter()
        state = {"step": step, **{name: s.state_dict() for name, s in self.states.items()}} \
            if self.is_main else None
        self.store.save(step, state)
        if last_step or preempted:
            self.store.wait()
            # Every rank's part is written before rank 0 says so (or a preempted machine goes).
            dist.barrier()
        if last_step and self.is_main:
            self.store.prune()
        self.seconds += time.perf_counter() - started
        return True
