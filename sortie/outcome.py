"""What a sortie did: its recoveries, exit codes, phase times, artifacts and teardown."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from bootstrap.collect import Artifact
from stacks.backend import Teardown


@dataclass
class Recovery:
    """One replacement of lost nodes, and what it cost."""

    lost: list[str]
    reason: str
    failed_at_step: int | None  # the last step rank 0 reported before the loss
    step_s: float  # mean step time before the loss
    failed_at: float  # time.perf_counter() when the loss was found
    downtime_s: float = 0.0  # from the loss to the trainer running again (resumed)
    redone_s: float = 0.0  # time of the steps trained again (failed_at - resumed_from)
    resumed_from_step: int | None = None  # the checkpoint step training resumed from

    def resumed(self, step: int, at: float) -> None:
        self.resumed_from_step = step
        self.downtime_s = at - self.failed_at
        self.redone_s = max(0, (self.failed_at_step or 0) - step) * self.step_s

    @property
    def cost_s(self) -> float:
        return self.downtime_s + self.redone_s

    def line(self) -> str:
        replaced = f"replaced {', '.join(self.lost)}" if self.lost else "relaunched"
        lost = (f"lost at step {self.failed_at_step}" if self.failed_at_step is not None else
                "lost before the first step report")
        if self.resumed_from_step is None:
            return f"{replaced} ({self.reason}); {lost}; training did not resume"
        return (f"{replaced} ({self.reason}); {lost}, resumed from step "
                f"{self.resumed_from_step}; cost {self.cost_s:.1f}s of training "
                f"({self.downtime_s:.1f}s down, {self.redone_s:.1f}s redone)")

    def to_json(self) -> dict:
        return {"lost": self.lost, "reason": self.reason, "failed_at_step": self.failed_at_step,
                "resumed_from_step": self.resumed_from_step,
                "downtime_s": round(self.downtime_s, 3), "redone_s": round(self.redone_s, 3),
                "cost_s": round(self.cost_s, 3)}


@dataclass
class RunResult:
    run_id: str
    nodes: int
    ranks: int
    artifacts: Path
    exit_codes: dict[str, int | None] = field(default_factory=dict)
    phase_s: dict[str, float] = field(default_factory=dict)
    wall_s: float = 0.0
    summary: dict | None = None  # the trainer's summary.json
    teardown: Teardown | None = None
    # Files copied from the nodes, each checked against the node's SHA-256 (manifest.json).
    collected: list[Artifact] = field(default_factory=list)
    collect_error: str | None = None  # why collecting or verifying failed, if it did
    launch_failures: list[str] = field(default_factory=list)  # why each failed attempt failed
    recoveries: list[Recovery] = field(default_factory=list)
    recovery_error: str | None = None  # why the sortie stopped recovering, if it did

    @property
    def trained(self) -> bool:
        return bool(self.exit_codes) and all(code == 0 for code in self.exit_codes.values())

    def failure(self) -> str | None:
        """What went wrong, in one line, the most fundamental first; None for a clean run."""
        if self.teardown and not self.teardown.clean:
            return self.teardown.summary()
        if self.recovery_error:
            return f"{self.recovery_error}; logs in {self.artifacts / 'logs'}"
        preempted = self.artifacts / "preempted.json"
        if not self.trained and preempted.is_file():
            marker = json.loads(preempted.read_text())
            return (f"training was preempted ({marker['reason']}) at step {marker['step']}; "
                    f"its checkpoint is in {self.artifacts}")
        if not self.trained:
            failed = ", ".join(f"{node} (exit {code if code is not None else 'unknown'})"
                               for node, code in self.exit_codes.items() if code != 0)
            return f"training failed on {failed or 'every node'}; logs in " \
                f"{self.artifacts / 'logs'}"
        if self.collect_error:
            kept = "; ".join(self.teardown.kept) if self.teardown else ""
            return (f"training finished but its artifacts are not verified: "
                    f"{self.collect_error}" + (f"; kept: {kept}" if kept else ""))
        return None

    def to_json(self) -> dict:
        return {
            "run_id": self.run_id, "ok": self.trained, "nodes": self.nodes, "ranks": self.ranks,
            "artifacts": str(self.artifacts), "exit_codes": self.exit_codes,
            "wall_s": round(self.wall_s, 3),
            "phase_s": {k: round(v, 3) for k, v in self.phase_s.items()},
            "summary": self.summary,
            "teardown_clean": self.teardown.clean if self.teardown else None,
            "artifacts_verified": self.collect_error is None and bool(self.collected),
            "collect_error": self.collect_error,
            "launch_failures": self.launch_failures,
            "recoveries": [r.to_json() for r in self.recoveries],
            "recovery_error": self.recovery_error,
            "teardown": self.teardown.to_json() if self.teardown else None,
        }
