"""A user's job's own Python environment, on nodes whose Python is the controller's own (local
and booted nodes: `Inventory.shared_python`). Without it, a task's `setup` (`$SORTIE_PYTHON -m
pip install -r requirements.txt`) would install into sortie's own environment and could change
or break sortie itself.

The environment (``env/`` beside the node's workdir, `node_layout.job_env_dir`) is a venv made
once per node from the controller's Python, seeing the controller's packages (torch) after its
own: a `.pth` file names the controller's site-packages, so what setup installs there comes
first and nothing is installed into sortie's. `python -m pip` is the controller's pip, run in
the environment (it installs into it, and never removes a package outside it); ``env/bin/pip``
runs it. Setup and the job run with it activated (``VIRTUAL_ENV``, ``PATH``), and
``$SORTIE_PYTHON`` is its Python. Elsewhere (a cloud's image, an attached host, a Slurm site) the
node's Python is the node's own, and is used as it is."""

from __future__ import annotations

import shlex

from sortie.bootstrap.node_layout import job_env_dir
from sortie.bootstrap.ssh import NodeError, on_all
from sortie.bootstrap.transport import NodeTransport
from sortie.core.errors import last_line
from sortie.core.inventory import Inventory, Node

READY = ".sortie-ready"  # written last: an environment without it is made again
MADE = "made"
MAKE_TIMEOUT_S = 120

# Run by the controller's Python on the node: the venv, the .pth naming its own packages, a pip.
_MAKE = r"""
import os, shutil, subprocess, sys, sysconfig
env = sys.argv[1]
if os.path.exists(os.path.join(env, ".sortie-ready")):
    sys.exit(0)
shutil.rmtree(env, ignore_errors=True)  # one a failed attempt left half made
subprocess.run([sys.executable, "-m", "venv", "--without-pip", env], check=True)
inner = subprocess.run(
    [os.path.join(env, "bin", "python"), "-c",
     "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
    capture_output=True, text=True, check=True).stdout.strip()
paths = sysconfig.get_paths()
with open(os.path.join(inner, "_sortie_controller.pth"), "w") as f:
    f.write("".join(sorted({paths["purelib"] + "\n", paths["platlib"] + "\n"})))
pip = os.path.join(env, "bin", "pip")
with open(pip, "w") as f:
    f.write('#!/bin/sh\nexec "%s" -m pip "$@"\n' % os.path.join(env, "bin", "python"))
os.chmod(pip, 0o755)
open(os.path.join(env, ".sortie-ready"), "w").close()
print("made")
"""


def uses_own_env(inventory: Inventory) -> bool:
    """Whether a user's job on ``inventory`` runs in an environment of the cluster's own."""
    return inventory.shared_python


def job_python(node: Node, inventory: Inventory) -> str:
    """The Python a user's setup and job run with on ``node`` ($SORTIE_PYTHON)."""
    return f"{job_env_dir(node)}/bin/python" if uses_own_env(inventory) else node.python


def activation(node: Node, inventory: Inventory) -> str:
    """Shell assignments that put a command in the job's environment (nothing where the node's
    Python is its own); ``$PATH`` is the node's, expanded there."""
    if not uses_own_env(inventory):
        return ""
    env = job_env_dir(node)
    return f'VIRTUAL_ENV={shlex.quote(env)} PATH={shlex.quote(env + "/bin")}:"$PATH"'


def ensure(node: Node, inventory: Inventory, cleanup: str = "") -> str:
    """A shell line that makes the job's environment where it is missing (a relaunch on a
    replaced node, a takeover), before a setup or a job that runs in it, running ``cleanup``
    before it fails; "" where there is none to make."""
    if not uses_own_env(inventory):
        return ""
    ready = shlex.quote(f"{job_env_dir(node)}/{READY}")
    return (f"test -e {ready} || {_make_command(node)} > /dev/null || "
            f"{{ {cleanup or ':'}; exit 1; }}\n")


def _make_command(node: Node) -> str:
    """The command that makes the job's environment on ``node`` unless it is there."""
    return shlex.join([node.python, "-c", _MAKE, job_env_dir(node)])


def make(conn: NodeTransport, node: Node) -> bool:
    """The job's environment on ``node``, made unless it is there; True when it was made."""
    result = conn.run(_make_command(node), timeout=MAKE_TIMEOUT_S)
    if not result.ok:
        why = last_line(result.stderr, "?")
        raise NodeError(f"{node.name}: making the job's Python environment "
                        f"{job_env_dir(node)} failed: {why}")
    return MADE in result.stdout.split()


def make_all(conns: dict[str, NodeTransport], inventory: Inventory,
             nodes: list[Node]) -> list[str]:
    """The job's environment on each of ``nodes`` where the cluster gives jobs one; the names
    of the nodes where it was made now."""
    if not uses_own_env(inventory):
        return []
    made = on_all(nodes, lambda n: make(conns[n.name], n))
    return [node.name for node, did in zip(nodes, made, strict=True) if did]
