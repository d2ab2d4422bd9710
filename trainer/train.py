"""The training loop: DDP over torchrun, checkpoints, exact resume, preemption.

CUDA with NCCL when GPUs are present (one process per GPU by LOCAL_RANK, bf16 autocast), CPU with
gloo otherwise. Global rank 0 writes ``metrics.jsonl``, ``summary.json`` and
``checkpoint-final.pt`` into ``--out``; resumable checkpoints go to ``--ckpt-url``.
"""

from __future__ import annotations

import contextlib
import gc
import math
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from .checkpoint import Checkpointer
from .config import PREEMPTED_EXIT_CODE, TrainConfig, parse_args
from .data import TokenShards, batch, samples_per_step, tokens_per_step
from .metrics import MetricsLog
from .model import build_model
from .preempt import PreemptionWatch


def per_parameter_allreduce(_state, bucket):  # unannotated: DDP inspects real annotations,
    # and `from __future__ import annotations` would turn them into strings it rejects.
    """DDP comm hook reducing each gradient on its own. The default hook reduces flattened
    buckets whose layout changes after DDP's first iteration, which changes gloo's summation
    order: a resumed run then differs in the last bits. This order never changes."""
    world = dist.get_world_size()
    grads = [g.div(world) for g in bucket.gradients()]
    for grad in grads:
        dist.all_reduce(grad)
    future: torch.futures.Future = torch.futures.Future()
    future.set_result(torch.cat([g.reshape(-1) for g in grads]))
    return future


def lr_factor(step: int, cfg: TrainConfig) -> float:
    """Linear warmup, then cosine decay to 10% at the last step."""
    if step < cfg.warmup_steps:
        return (step + 1) / cfg.warmup_steps
    progress = (step - cfg.warmup_steps) / max(1, cfg.steps - cfg.warmup_steps)
    return 0.1 + 0.45 * (1 + math.cos(math.pi * min(1.0, progress)))


def init_distributed() -> tuple[torch.device, int]:
    """Join torchrun's process group: NCCL on this process's GPU (by LOCAL_RANK) when there
    are GPUs, gloo on the CPU otherwise. Returns (device, local rank)."""
    use_cuda = torch.cuda.is_available()
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if use_cuda:
        torch.cuda.set_device(local_rank)
    if use_cuda:  # bound to its GPU: collectives (barrier too) never guess the device
        device = torch.device("cuda", local_rank)
        dist.init_process_group(backend="nccl", device_id=device)
    else:
        device = torch.device("cpu")
        dist.init_process_group(backend="gloo")
    return device, local_rank


def autocast_for(device: torch.device) -> contextlib.AbstractContextManager[Any]:
    """bf16 autocast on a GPU; full precision on the CPU."""
    if device.type == "cuda":
        return torch.autocast("cuda", dtype=torch.bfloat16)
    return contextlib.nullcontext()


def main(argv: list[str] | None = None) -> int:
    cfg = parse_args(argv)
    device, local_rank = init_distributed()
    code = train(cfg, device, local_rank)
    # DDP's reducer and gloo's pending work must be gone before the process group: work still
    # referenced at shutdown aborts the process ("terminate called without an active exception").
    # train() has returned, so its DDP objects are unreferenced; collect any cycles too. The
    # barrier avoids a teardown race when ranks finish apart.
    gc.collect()
    dist.barrier()
    dist.destroy_process_group()
    return code


@dataclass
class Run:
    """One rank's training: its config, model and optimizer, checkpointer, preemption watch and
    data."""

    cfg: TrainConfig
    device: torch.device
    rank: int
    world: int
    model: torch.nn.Module
    ddp: DDP
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LRScheduler
    checkpointer: Checkpointer
    watch: PreemptionWatch
    shards: TokenShards | None


def build(cfg: TrainConfig, device: torch.device, local_rank: int) -> Run:
    """The model (same initial weights on every rank), DDP, optimizer, LR schedule and
    checkpointer of one rank."""
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(cfg.seed)
    model = build_model(cfg).to(device)
    # All parameters are used every step, so the graph is static; gradients as bucket views save
    # a copy per step; 25 MB buckets (the default) suit these small models.
    ddp = DDP(model, device_ids=[local_rank] if device.type == "cuda" else None,
              gradient_as_bucket_view=True, static_graph=True)
    if cfg.deterministic:
        ddp.register_comm_hook(None, per_parameter_allreduce)
    optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=0.01)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: lr_factor(s, cfg))
    checkpointer = Checkpointer(
        cfg.checkpoint_url, rank, world,
        {"model": model, "optimizer": optimizer, "scheduler": scheduler},
        every=cfg.ckpt_every, last_step=cfg.steps, keep_last=cfg.keep_last,
        async_save=cfg.async_ckpt)
    return Run(cfg, device, rank, world, model, ddp, optimizer, scheduler, checkpointer,
               PreemptionWatch(cfg.preemption_notice, cfg.metadata_url),
               TokenShards(cfg.data_dir, cfg.seq_len) if cfg.data_dir else None)


def train(cfg: TrainConfig, device: torch.device, local_rank: int) -> int:
    """Train to ``cfg.steps`` (resuming if a checkpoint exists); 0, or PREEMPTED_EXIT_CODE."""
    run = build(cfg, device, local_rank)
    start_step = run.checkpointer.load()
    log = MetricsLog(Path(cfg.out), enabled=run.rank == 0, resuming=start_step > 0)
    log.started(cfg.model, run.world, device.type, cfg.steps, run.checkpointer.resumed_from)
    started = time.perf_counter()
    loss = train_steps(run, start_step, log)
    train_time = time.perf_counter() - started
    if loss is None:  # preempted: every rank saved the same step
        log.close()
        return PREEMPTED_EXIT_CODE
    if run.checkpointer.save(cfg.steps, last_step=True):
        log.checkpoint(cfg.steps)
    log.close()
    if run.rank == 0:
        out = Path(cfg.out)
        torch.save({"step": cfg.steps, "model": run.model.state_dict()},
                   out / "checkpoint-final.pt.tmp")
        os.replace(out / "checkpoint-final.pt.tmp", out / "checkpoint-final.pt")
    trained = cfg.steps - start_step
    # Resumed at the last step (a node lost after it): nothing trained here, so no loss or rate
    # of this attempt to report (null, not NaN and 0); the earlier attempt's metrics have them.
    log.write_json("summary.json", {
        "steps": cfg.steps, "resumed_from": start_step, "world_size": run.world,
        "model": cfg.model, "final_loss": loss if trained else None, "device": device.type,
        "samples_per_s": samples_per_step(cfg, run.world) * trained / train_time
        if trained else None,
        "tokens_per_s": tokens_per_step(cfg, run.world) * trained / train_time
        if trained else None,
        "train_time_s": train_time, "checkpoint_time_s": run.checkpointer.seconds})
    log.say(f"done in {train_time:.2f}s, final loss {loss:.5f}" if trained else
            f"done: resumed at the last step ({start_step}), nothing left to train")
    return 0


def train_steps(run: Run, start_step: int, log: MetricsLog) -> float | None:
    """The training loop from ``start_step``: the job's last logged loss, or None when it was
    preempted (every rank stops, saves and leaves a marker at the same step)."""
    cfg, device = run.cfg, run.device
    autocast = autocast_for(device)
    window_start, window_steps, loss_value = time.perf_counter(), 0, float("nan")
    for step in range(start_step + 1, cfg.steps + 1):
        step_started = time.perf_counter()
        inputs, targets = batch(cfg, step, run.rank, device, run.shards)
        run.optimizer.zero_grad(set_to_none=True)
        with autocast:
            loss = run.ddp(inputs, targets)
        loss.backward()
        run.optimizer.step()
        run.scheduler.step()
        window_steps += 1
        if run.watch.agreed(device):  # every rank stops at this same step
            if run.checkpointer.save(step, preempted=True):
                log.checkpoint(step)
            # torchrun's own exit status hides ours when it was signalled too: leave a marker.
            reason = run.watch.agreed_reason
            log.write_json("preempted.json", {"step": step, "reason": reason})
            log.say(f"preempted ({reason}) at step {step}; checkpoint saved")
            return None
        if run.checkpointer.save(step):
            log.checkpoint(step)
        if cfg.min_step_s:  # a rehearsal on shared CPUs waits out a GPU step's time
            time.sleep(max(0.0, step_started + cfg.min_step_s - time.perf_counter()))
        if step % cfg.log_every == 0 or step == cfg.steps:
            reduced = loss.detach().float().clone()
            dist.all_reduce(reduced)  # the job's loss, not one rank's
            loss_value = reduced.item() / run.world
            now = time.perf_counter()
            step_time = (now - window_start) / window_steps
            window_start, window_steps = now, 0
            log.record(step, cfg.steps, loss=loss_value, lr=float(run.scheduler.get_last_lr()[0]),
                       samples_per_s=samples_per_step(cfg, run.world) / step_time,
                       tokens_per_s=tokens_per_step(cfg, run.world) / step_time,
                       step_time_s=step_time, checkpoint_time_s=run.checkpointer.seconds)
    return loss_value
