"""Invoke's runners for a command whose output streams for hours (`ssh.StreamingRemote`, and
`StreamingLocal` for a Slurm login node that is this machine). Invoke alone: `status` and other
light commands import the transport without Fabric or paramiko."""

from __future__ import annotations

from typing import Any

from invoke.runners import Local

# What Invoke's runners keep of a streamed command's output (its sink has all of it), in reads.
STREAMED_KEPT_READS = 256


class Streaming:
    """Invoke's runner, less two costs of a command streamed for hours (a job's log, `watch`):
    on every read it joined everything read so far for its watchers, which sortie never gives
    (quadratic: 800k lines of a chatty job took the controller 63 s to show, the job 3), and it
    kept all of it. Without watchers nothing is joined, and a command whose output goes to a
    stream of the caller's keeps only its last reads."""

    read_chunk_size = 1 << 16  # bytes a read (Invoke's 1000: a Python loop per KB)
    watchers: list[Any]
    opts: dict[str, Any]

    def respond(self, buffer_: list[str]) -> None:
        if self.watchers:
            super().respond(buffer_)  # type: ignore[misc]
        elif len(buffer_) > 2 * STREAMED_KEPT_READS and (
                self.opts.get("out_stream") is not None or self.opts.get("err_stream") is not None):
            del buffer_[:-STREAMED_KEPT_READS]  # in steps: linear


class StreamingLocal(Streaming, Local):
    """Invoke's runner of a command here (a Slurm login node that is this machine)."""
