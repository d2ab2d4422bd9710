"""Preemption: SIGTERM (what clouds send at shutdown) or the cloud's metadata notice sets a flag;
every rank all-reduces it each step so that all stop at the same step and save together."""

from __future__ import annotations

import os
import signal
import sys
import threading

import torch
import torch.distributed as dist

from .notices import DEFAULT_METADATA, NoticeReader, next_wait

# Why a rank was asked to stop, as the number `agreed` all-reduces (MAX: a notice outranks a
# SIGTERM); 0: it was not.
SIGTERM_CODE, NOTICE_CODE = 1, 2


class PreemptionWatch:
    """Sets ``requested`` on SIGTERM or on the cloud's notice (polled in a daemon thread)."""

    def __init__(self, cloud: str = "none", metadata_url: str = "", poll_s: float = 1.0) -> None:
        self.requested = threading.Event()
        self.asked = 0  # why this rank was asked to stop (its first reason's code), set first
        self.cloud = cloud
        self.agreed_reason = ""  # why the job stops, in words, once `agreed` says it does
        signal.signal(signal.SIGTERM, self._on_sigterm)
        # One rank per node asks (the first of its node): the notice is the machine's, and
        # `agreed` spreads it to every rank; eight ranks each polling once a second came close
        # to Azure's 5 requests a second per VM.
        self.polls = cloud != "none" and os.environ.get("LOCAL_RANK", "0") == "0"
        if self.polls:
            base = (metadata_url or DEFAULT_METADATA[cloud]).rstrip("/")
            threading.Thread(target=self._poll, args=(cloud, base, poll_s), daemon=True,
                             name="preemption-notice").start()

    def _on_sigterm(self, _signum: int, _frame: object) -> None:
        self._ask(SIGTERM_CODE)

    def _ask(self, code: int) -> None:
        self.asked = self.asked or code
        self.requested.set()

    def _poll(self, cloud: str, base: str, poll_s: float) -> None:
        reader, warned, wait_s = NoticeReader(cloud, base), False, poll_s
        while not self.requested.wait(wait_s):
            try:
                posted, wait_s = reader.posted(), poll_s  # (answered: back to its pace)
                if posted:
                    # (rank 0 says where the job stopped; this says which node was told)
                    print(f"trainer: {cloud} preemption notice read from {base}: stopping at "
                          "the next step", file=sys.stderr, flush=True)
                    self._ask(NOTICE_CODE)
            except (OSError, ValueError) as exc:  # metadata unreachable: keep training, say so once
                wait_s = next_wait(wait_s, poll_s, getattr(exc, "code", None) == 429)
                if not warned:
                    print(f"trainer: cannot read the {cloud} preemption notice at {base}: {exc}",
                          file=sys.stderr, flush=True)
                    warned = True

    def agreed(self, device: torch.device) -> bool:
        """Whether any rank has been asked to stop (a collective: every rank calls it each step).
        When one was, ``agreed_reason`` says why on every rank, even one whose own SIGTERM had
        not yet come (a signal reaches the nodes one after another)."""
        flag = torch.tensor([float(self.asked)], device=device)
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        code = int(flag.item())
        if code:
            self.agreed_reason = job_reason(code, self.asked, self.cloud)
        return bool(code)


def job_reason(code: int, asked: int, cloud: str) -> str:
    """Why the job stopped (the reduced ``code``), said as this rank's own reason or as another
    rank's (``SIGTERM (another rank)``) when this rank was ``asked`` for another or not at all."""
    why = f"{cloud} preemption notice" if code == NOTICE_CODE else "SIGTERM"
    return why if code == asked else f"{why} (another rank)"
