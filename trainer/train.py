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
from pathlib import Path

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from trainer.checkpoint import Checkpointer, set_rng_state
from trainer.config import PREEMPTED_EXIT_CODE, TrainConfig, parse_args
from trainer.data import TokenShards, batch, samples_per_step, tokens_per_step
from trainer.metrics import MetricsLog
from trainer.model import build_model
from trainer.preempt import PreemptionWatch


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


def main(argv: list[str] | None = None) -> int:
    cfg = parse_args(argv)
    use_cuda = torch.cuda.is_available()
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if use_cuda:
        torch.cuda.set_device(local_rank)
    device = torch.device("cuda", local_rank) if use_cuda else torch.device("cpu")
    dist.init_process_group(backend="nccl" if use_cuda else "gloo")
    code = train(cfg, device, local_rank)
    # DDP's reducer and gloo's pending work must be gone before the process group: work still
    # referenced at shutdown aborts the process ("terminate called without an active exception").
    # train() has returned, so its DDP objects are unreferenced; collect any cycles too. The
    # barrier avoids a teardown race when ranks finish apart.
    gc.collect()
    dist.barrier()
    dist.destroy_process_group()
    return code


def train(cfg: TrainConfig, device: torch.device, local_rank: int) -> int:
    """Train to ``cfg.steps`` (resuming if a checkpoint exists); 0, or PREEMPTED_EXIT_CODE."""
    use_cuda = device.type == "cuda"
    rank, world = dist.get_rank(), dist.get_world_size()
    is_main = rank == 0
    watch = PreemptionWatch(cfg.preemption_notice, cfg.metadata_url)
    shards = TokenShards(cfg.data_dir, cfg.seq_len) if cfg.data_dir else None

    torch.manual_seed(cfg.seed)  # same initial weights on every rank
    model = build_model(cfg).to(device)
    # All parameters are used every step, so the graph is static; gradients as bucket views save
    # a copy per step; 25 MB buckets (the default) suit these small models.
    ddp = DDP(model, device_ids=[local_rank] if use_cuda else None,
              gradient_as_bucket_view=True, static_graph=True)
    if cfg.deterministic:
        ddp.register_comm_hook(None, per_parameter_allreduce)
    optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=0.01)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: lr_factor(s, cfg))
    ckpt = Checkpointer(cfg.checkpoint_url, rank, world, cfg.keep_last, cfg.async_ckpt)

    start_step = 0
    resume_from = ckpt.latest()
    if resume_from is not None:
        state, rng = ckpt.load(resume_from)
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        scheduler.load_state_dict(state["scheduler"])
        start_step = state["step"]
        if rng is not None:
            set_rng_state(rng)

    def training_state(step: int) -> dict | None:
        if not is_main:
            return None
        return {"step": step, "model": model.state_dict(), "optimizer": optimizer.state_dict(),
                "scheduler": scheduler.state_dict()}

    def save(step: int) -> float:
        started = time.perf_counter()
        ckpt.save(step, training_state(step))
        return time.perf_counter() - started

    out = Path(cfg.out)
    log = MetricsLog(out, enabled=is_main, resuming=start_step > 0)
    resumed = f", resumed from step {start_step}" if resume_from is not None else ""
    log.say(f"{cfg.model} world_size={world} device={device.type} steps={cfg.steps}{resumed}")
    autocast = (torch.autocast("cuda", dtype=torch.bfloat16) if use_cuda
                else contextlib.nullcontext())

    started = time.perf_counter()
    window_start, window_steps, ckpt_time = started, 0, 0.0
    loss_value, last_step = float("nan"), start_step
    for step in range(start_step + 1, cfg.steps + 1):
        inputs, targets = batch(cfg, step, rank, device, shards)
        optimizer.zero_grad(set_to_none=True)
        with autocast:
            loss = ddp(inputs, targets)
        loss.backward()
        optimizer.step()
        scheduler.step()
        last_step, window_steps = step, window_steps + 1
        if watch.agreed(device):  # every rank stops at this same step
            save(step)
            ckpt.wait()
            # torchrun's own exit status hides ours when it was signalled too: leave a marker.
            reason = watch.reason or "another rank"
            log.write_json("preempted.json", {"step": step, "reason": reason})
            log.say(f"preempted ({reason}) at step {step}; checkpoint saved")
            log.close()
            return PREEMPTED_EXIT_CODE
        if cfg.ckpt_every and step % cfg.ckpt_every == 0 and step != cfg.steps:
            ckpt_time += save(step)
        if step % cfg.log_every == 0 or step == cfg.steps:
            reduced = loss.detach().float().clone()
            dist.all_reduce(reduced)  # the job's loss, not one rank's
            loss_value = reduced.item() / world
            now = time.perf_counter()
            step_time = (now - window_start) / window_steps
            window_start, window_steps = now, 0
            log.record(step, cfg.steps, loss=loss_value, lr=scheduler.get_last_lr()[0],
                       samples_per_s=samples_per_step(cfg, world) / step_time,
                       tokens_per_s=tokens_per_step(cfg, world) / step_time,
                       step_time_s=step_time, checkpoint_time_s=ckpt_time)
    train_time = time.perf_counter() - started

    if last_step > start_step or resume_from is None:
        ckpt_time += save(cfg.steps)
    ckpt.wait()
    dist.barrier()  # every rank's part of the final checkpoint is written
    if is_main:
        ckpt.prune()
    log.close()
    if is_main:
        torch.save({"step": cfg.steps, "model": model.state_dict()},
                   out / "checkpoint-final.pt.tmp")
        os.replace(out / "checkpoint-final.pt.tmp", out / "checkpoint-final.pt")
    trained = cfg.steps - start_step
    log.write_json("summary.json", {
        "steps": cfg.steps, "resumed_from": start_step, "world_size": world, "model": cfg.model,
        "final_loss": loss_value, "device": device.type,
        "samples_per_s": samples_per_step(cfg, world) * trained / train_time,
        "tokens_per_s": tokens_per_step(cfg, world) * trained / train_time,
        "train_time_s": train_time, "checkpoint_time_s": ckpt_time})
    log.say(f"done in {train_time:.2f}s, final loss {loss_value:.5f}")
    return 0
