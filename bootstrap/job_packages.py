"""Which Python packages a user's job runs with on each node: read with the job's own Python
once its setup is done, kept with the run (``packages.txt``: the head's list) and compared,
between the nodes (a setup that resolved another version on one of them) and with the run a
re-run repeats (`sortie run runs/<id>/task.yaml` runs that run's code; its packages are
today's). Not for a job in an image: the image's digest pins them already."""

from __future__ import annotations

import re
import shlex

from sortie.bootstrap.job_env import activation, job_python
from sortie.bootstrap.transport import NodeTransport
from sortie.core.inventory import Inventory, Node

PACKAGES_FILE = "packages.txt"  # in runs/<id>/
MAX_PACKAGES = 5000
PACKAGE_LINE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}==[A-Za-z0-9][A-Za-z0-9.+!_-]{0,63}")
# The first distribution of each name on the job's path: the one `import` finds.
_LIST = """
import importlib.metadata as m
seen = {}
for d in m.distributions():
    name = (d.metadata["Name"] or "").strip()
    seen.setdefault(name.lower().replace("_", "-"), name + "==" + d.version)
print("\\n".join(line for key, line in seen.items() if key))
"""


def read_packages(conn: NodeTransport, node: Node, inventory: Inventory) -> list[str] | None:
    """``name==version`` of each distribution the job's Python sees on ``node``, sorted (what
    the node says, checked line by line); None when it could not be read."""
    python = shlex.quote(job_python(node, inventory))
    try:  # a record, not a step: a node that does not answer here fails no run
        result = conn.run(f"env -u PYTHONPATH -u PYTHONHOME {activation(node, inventory)} "
                          f"{python} -c {shlex.quote(_LIST)}", hide=True, warn=True, timeout=60)
    except Exception:  # noqa: BLE001 - the job's own steps say what became of the node
        return None
    return parse_packages(result.stdout) if result.ok else None


def parse_packages(text: str) -> list[str]:
    """The ``name==version`` lines of ``text`` (a node's answer, a kept list), sorted, capped."""
    found = [line for line in text.splitlines() if PACKAGE_LINE.fullmatch(line)]
    return sorted(found, key=str.lower)[:MAX_PACKAGES]


def changes(before: list[str], after: list[str]) -> list[str]:
    """What differs from ``before`` to ``after``, by name: "numpy 1.26.4 -> 2.1.0", "+tqdm
    4.66.1" (new), "-rich 13.7.1" (gone)."""
    old, new = _by_name(before), _by_name(after)
    said = []
    for key in sorted(old.keys() | new.keys()):
        if key not in new:
            said.append(f"-{old[key][0]} {old[key][1]}")
        elif key not in old:
            said.append(f"+{new[key][0]} {new[key][1]}")
        elif old[key][1] != new[key][1]:
            said.append(f"{new[key][0]} {old[key][1]} -> {new[key][1]}")
    return said


def _by_name(lines: list[str]) -> dict[str, tuple[str, str]]:
    named = {}
    for line in lines:
        name, _, version = line.partition("==")
        named[name.lower().replace("_", "-")] = (name, version)
    return named
