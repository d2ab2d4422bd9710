"""What a recovery needs to know: which nodes were lost and why (machine gone, preempted, SSH
dead), and where training stands (`StepTracker` follows rank 0's steps in the streamed logs and
says when a pending recovery resumed training)."""

from __future__ import annotations

import re
import time

from sortie.bootstrap import ssh
from sortie.core.errors import SortieError
from sortie.core.inventory import Inventory, Node
from sortie.core.progress import Reporter
from sortie.rundir.result import Recovery, RunResult
from sortie.stacks.backend import Backend, Lost
from sortie.trainer.config import PREEMPTED_EXIT_CODE
from sortie.trainer.metrics import RESUMED_PATTERN, STEP_PATTERN

STEP_OF = re.compile(r"\bstep\s+(\d+)/(\d+)")  # rank 0's `step N/M`: N and M
# What the terminal is spared, kept in each node's log: torch's known-harmless line on every
# rendezvous of nodes whose address has no name (it says nothing about the job), and a C++
# stack's frames (their first line, the error, is shown; the frames are in the log).
HARMLESS = re.compile(r"\[c10d\] The hostname of the client socket cannot be retrieved")
FRAME = re.compile(r"^\s*(frame #\d+: |Exception raised from |<omitting python frames>)")


class StepTracker:
    """Follows rank 0's progress in the streamed logs: which node it runs on, the last step it
    reported, the step it resumed from; completes a pending recovery once training resumes."""

    def __init__(self, reporter: Reporter, recoveries: list[Recovery],
                 run_id: str = "RUN") -> None:
        self.reporter, self.recoveries, self.run_id = reporter, recoveries, run_id
        self.rank0_node: str | None = None
        self.last_step: int | None = None
        self.last_of: int | None = None  # the M of rank 0's last `step N/M`
        self.resumed_from: int | None = None
        self.pending: Recovery | None = None  # waiting for training to resume
        self.last_line_at = time.monotonic()  # any node's last log line: the job advances
        self.quiet = False  # the run is ending: what the job prints as it stops is in its logs
        self.framed: set[str] = set()  # nodes whose C++ frames were said to be in their log
        self.in_frames: set[str] = set()  # nodes whose last line was a frame (a blank one ends)

    def finished_line(self) -> str | None:
        """"step 8/8" once rank 0 printed its last step; else None."""
        done = self.last_step is not None and self.last_of and self.last_step >= self.last_of
        return f"step {self.last_step}/{self.last_of}" if done else None

    def started(self) -> None:
        """A new attempt: its own silence is counted from now."""
        self.resumed_from, self.last_line_at = None, time.monotonic()

    def stalled(self, timeout_s: float) -> str | None:
        """Why the job counts as hung (no log line from any node for ``timeout_s``: a
        collective blocked on a cut or dead link prints nothing), or None."""
        silent = time.monotonic() - self.last_line_at
        if timeout_s <= 0 or silent < timeout_s:
            return None
        at = f" after step {self.last_step}" if self.last_step is not None else ""
        return f"hung: no log line from any node for {silent:.0f}s{at}"

    def __call__(self, node: str, line: str) -> None:
        self.last_line_at = time.monotonic()
        if match := STEP_PATTERN.search(line):
            self.rank0_node, self.last_step = node, int(match.group(1))
            of = STEP_OF.search(line)
            self.last_of = int(of.group(2)) if of else None
        elif match := RESUMED_PATTERN.search(line):
            self.rank0_node, self.resumed_from = node, int(match.group(1))
            if self.pending:
                self.pending.resumed(self.resumed_from, time.perf_counter())
                self.reporter.note(f"recovery {len(self.recoveries)}: {self.pending.line()}")
                self.pending = None
        if self.quiet or HARMLESS.search(line):
            return
        if FRAME.search(line) or (node in self.in_frames and not line.strip()):
            self.in_frames.add(node)
            if node not in self.framed:
                self.framed.add(node)
                self.reporter.node_line(node, "[sortie] a C++ stack trace: its frames are in "
                                        f"this node's log (`sortie logs {self.run_id} {node}`)")
            return
        self.in_frames.discard(node)
        self.reporter.node_line(node, line)


def find_lost(backend: Backend, inventory: Inventory,
               result: RunResult) -> tuple[list[str] | None, str]:
    """After a failed attempt: (nodes to replace, why), or (None, "") when no node was lost and
    training was not preempted, i.e. the training itself failed."""
    # A job that stops for a preemption exits 75 (trainer/torchrun.py passes a rank's 75 on).
    preempted = PREEMPTED_EXIT_CODE in result.exit_codes.values()
    lost = backend.lost_nodes(inventory)  # refresh: machines gone
    if lost:
        # The cloud may take the machine before this looks (a loaded controller, a short
        # notice): the job's own word says why, where the backend's is only the default.
        return lost.nodes, "preempted" if preempted and lost.why == Lost.why else lost.why
    if preempted:
        deadline = time.monotonic() + backend.preemption_notice_s
        while not lost and time.monotonic() < deadline:  # the cloud takes the machine soon
            time.sleep(min(5.0, backend.preemption_notice_s))
            lost = backend.lost_nodes(inventory)
        return lost.nodes, "preempted"
    unreachable = [name for name, code in result.exit_codes.items()
                   if code is None and not reachable(inventory.node(name))]
    dead = "srun step failed" if inventory.head.srun else "SSH dead"
    return (unreachable, dead) if unreachable else (None, "")


def reachable(node: Node) -> bool:
    """Whether the node takes a connection (SSH); a Slurm node's, whether a step runs there."""
    try:
        conn = ssh.connect(node, timeout=10.0)
        try:
            return conn.run("true", timeout=30).ok if node.srun else True
        finally:
            conn.close()
    except (SortieError, *ssh.TRANSIENT_SSH_ERRORS):
        return False
    except Exception:  # noqa: BLE001 - a step that timed out
        return False
