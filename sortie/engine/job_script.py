"""The script a job names (`--script`, a task's `script:`): a path of the workdir, and a file
torchrun can run with Python, checked before anything starts."""

from __future__ import annotations

import os
from pathlib import Path

from sortie.core.errors import UsageError


def script_in_workdir(script: str, workdir: Path) -> str:
    """`--script` as a path in the workdir: a shell's absolute one (`~/proj/train.py`, as tab
    completion writes it) made relative where it is inside; one outside named with the
    workdir, which is all that goes to the nodes."""
    if not script.startswith(("/", "~")):
        return script
    path, root = Path(os.path.abspath(os.path.expanduser(script))), Path(workdir).expanduser()
    for inside, top in ((path, Path(os.path.abspath(root))),
                        (path.parent.resolve() / path.name, root.resolve())):
        if inside.is_relative_to(top) and inside != top:
            return inside.relative_to(top).as_posix()
    top = next((d for d in path.parents if (d / ".git").exists()), path.parent)  # its project
    raise UsageError(f"--script: {script} is not in the workdir ({os.path.abspath(root)}), "
                     "which is what goes to the nodes: give the project's directory as "
                     f"--workdir and the script's path in it (`--workdir {top} --script "
                     f"{path.relative_to(top).as_posix()}`)")


SHELL_SUFFIXES = (".sh", ".bash", ".zsh")


def not_python(path: Path, name: str) -> str:
    """Why ``path`` (the workdir's ``name``), plainly not Python, cannot be torchrun's script,
    and the way that runs it; "" for a Python file (or one that may be)."""
    if path.suffix == ".ipynb":  # JSON, which Python would read as an expression, or fail on
        return (f"{name} is a Jupyter notebook, and torchrun runs a Python file: `jupyter "
                f"nbconvert --to script {name}` writes {path.stem}.py from it")
    try:
        with path.open("rb") as source:
            first = source.readline(256)
    except OSError:
        return ""
    if first.startswith(b"#!") and b"python" not in first:
        what = f"a script for {first[2:].decode(errors='replace').strip()[:60]!r}"
    elif path.suffix in SHELL_SUFFIXES and b"python" not in first:
        what = "a shell script"
    else:
        return ""
    return (f"{name} is {what}, and torchrun runs a script with Python: run it with `--run "
            f"'bash {name}'` (once on every node, with MASTER_ADDR, NODE_RANK and the rest set)")
