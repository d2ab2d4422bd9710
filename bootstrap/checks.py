"""Node checks: python present, torch installed (and which version), GPU count as expected."""

from __future__ import annotations

import json
import shlex

from fabric import Connection
from pydantic import BaseModel

from bootstrap.ssh import NodeError
from stacks.inventory import Node

# Runs on the node. It finds torch without importing it (an import costs seconds of CPU per node)
# and counts the GPUs the trainer will see: CUDA_VISIBLE_DEVICES if set, else nvidia-smi.
_PROBE = r"""
import importlib.metadata as md, importlib.util as iu, json, os, platform, shutil, subprocess
torch = md.version("torch") if iu.find_spec("torch") else None
visible = os.environ.get("CUDA_VISIBLE_DEVICES")
if visible is not None:
    gpus = len([d for d in visible.split(",") if d.strip()])
elif shutil.which("nvidia-smi"):
    out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True).stdout
    gpus = sum(1 for line in out.splitlines() if line.startswith("GPU "))
else:
    gpus = 0
print(json.dumps({"python": platform.python_version(), "torch": torch, "gpus": gpus}))
"""


class NodeFacts(BaseModel):
    python: str
    torch: str | None
    gpus: int


def check_node(conn: Connection, node: Node, env: dict[str, str]) -> NodeFacts:
    """Probe one node and fail, naming it, if it cannot run the trainer."""
    exports = " ".join(f"{k}={shlex.quote(v)}" for k, v in env.items())
    result = conn.run(f"env {exports} {shlex.quote(node.python)} -c {shlex.quote(_PROBE)}")
    if not result.ok:
        detail = (result.stderr.strip().splitlines() or ["no output"])[-1]
        raise NodeError(f"{node.name}: {node.python} could not run the node check: {detail}")
    facts = NodeFacts.model_validate(json.loads(result.stdout.strip().splitlines()[-1]))
    if facts.torch is None:
        raise NodeError(f"{node.name}: torch is not installed for {node.python}")
    if facts.gpus != node.gpus:
        raise NodeError(f"{node.name}: expected {node.gpus} GPUs, the node has {facts.gpus}")
    return facts
