"""What of the user's workdir goes to the nodes (`plan_sync`), and what it holds (its content hash,
its git commit) for the run's record. `bootstrap/sync.py` sends it.

What is sent:
- `.sortieignore`, when the workdir has one, replaces every other rule (gitignore syntax);
- else, in a git repository, what git itself would consider (`git ls-files --cached --others
  --exclude-standard`: every `.gitignore`, `.git/info/exclude`);
- else the workdir's `.gitignore`;
- never `.git`, `.venv` or `__pycache__`, nor a Python environment of any name (a directory
  holding `pyvenv.cfg`, as every venv and virtualenv does, or `conda-meta/`, as a conda
  environment does: made for the controller's Python, it cannot run on a node, and a torch in
  it is a gigabyte), nor sortie's own runs directory or home when they lie inside the workdir
  (`cd proj; sortie exec dev --workdir .` writes `proj/runs/`).
"""

from __future__ import annotations

import ast
import hashlib
import os
import re
import shlex
import stat
import subprocess
import sys
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

import pathspec

from sortie.core.errors import UsageError
from sortie.core.sizes import readable_bytes
from sortie.core.userfile import read_capped

IGNORE_FILE = ".sortieignore"
ALWAYS_EXCLUDED = (".git", ".venv", "__pycache__")
DEFAULT_MAX_BYTES = 1 << 30
MAX_IGNORE_BYTES = 1 << 20
MAX_SYNC_FILES = 200_000


@dataclass(frozen=True)
class SyncPlan:
    """The files of a workdir that go to the nodes (paths relative to it, sorted)."""

    root: Path
    files: tuple[str, ...]
    bytes: int
    rules: str  # which ignore rules chose them, for the terminal
    skipped: tuple[str, ...] = ()  # "data (a symlinked directory)", "lib (a git submodule)"

    def describe(self) -> str:
        count = f"{len(self.files):,} file{'' if len(self.files) == 1 else 's'}"
        skipped = f"; not sent: {', '.join(self.skipped[:5])}" + (
            f" and {len(self.skipped) - 5} more" if len(self.skipped) > 5 else "") \
            if self.skipped else ""
        return f"{count}, {readable_bytes(self.bytes)} ({self.rules}{skipped})"



def always_excluded(relative: str) -> bool:
    return any(part in ALWAYS_EXCLUDED for part in relative.split("/"))


# What marks a directory as a Python environment: PEP 405's `pyvenv.cfg` (venv, virtualenv,
# uv, poetry's in-project `.venv`), or a conda environment's `conda-meta/`.
ENVIRONMENT_MARKS = ("pyvenv.cfg", "conda-meta")
ENVIRONMENT = "a Python environment"


def _is_environment(directory: Path) -> bool:
    return any(os.path.lexists(directory / mark) for mark in ENVIRONMENT_MARKS)


def _listed_environments(names: Iterable[str]) -> list[str]:
    """The Python environments among listed file names (git's), by the files that mark them."""
    found = set()
    for name in names:
        parts = name.split("/")
        for mark in ENVIRONMENT_MARKS:
            if mark in parts[1:]:
                found.add("/".join(parts[:parts.index(mark, 1)]))
    return sorted(found)


def _walk(root: Path, skipped: list[str], pruned: Iterable[str] = ()) -> Iterable[str]:
    """Every regular file and symlink under ``root``, relative, skipping the excluded trees and
    the ``pruned`` directories (relative names); symlinked directories (not followed: not
    sent) go to ``skipped``."""
    pruned = set(pruned)
    for directory, subdirs, files in os.walk(root):
        base = Path(directory).relative_to(root)
        linked = [d for d in subdirs if (Path(directory) / d).is_symlink()]
        skipped += [f"{(base / d).as_posix()} (a symlinked directory)" for d in sorted(linked)
                    if d not in ALWAYS_EXCLUDED]
        subdirs[:] = sorted(d for d in subdirs if d not in ALWAYS_EXCLUDED and d not in linked
                            and (base / d).as_posix() not in pruned)
        environments = [d for d in subdirs if _is_environment(Path(directory) / d)]
        skipped += [f"{(base / d).as_posix()} ({ENVIRONMENT})" for d in environments]
        subdirs[:] = [d for d in subdirs if d not in environments]
        for name in sorted(files):
            yield (base / name).as_posix()


def _git_files(root: Path) -> list[str] | None:
    """What git would consider in ``root``, or None when it is not in a git work tree."""
    try:
        inside = subprocess.run(["git", "-C", str(root), "rev-parse", "--is-inside-work-tree"],
                                capture_output=True, text=True, timeout=30)
        if inside.returncode != 0 or inside.stdout.strip() != "true":
            return None
        listed = subprocess.run(
            ["git", "-C", str(root), "ls-files", "-z", "--cached", "--others",
             "--exclude-standard"], capture_output=True, timeout=120, check=True)
    except (OSError, subprocess.SubprocessError):
        return None
    return sorted({name for name in listed.stdout.decode("utf-8", "surrogateescape").split("\0")
                   if name})


def _ignore_lines(path: Path) -> list[str]:
    """An ignore file's rules, as bytes on disk (a pattern that is not UTF-8 matches the names
    that are not either, which are decoded the same way); capped like a task file."""
    data = read_capped(path, MAX_IGNORE_BYTES, " of ignore rules")
    return data.decode("utf-8", "surrogateescape").splitlines()


def _own_inside(root: Path, own: Mapping[str, Path]) -> dict[str, str]:
    """sortie's own directories (``own``: what each is -> where) that lie inside the workdir,
    as relative names: never synced (a run's report, logs and checkpoints would go to every
    node with the next exec, and grow toward the cap; a home's keys would leave the machine)."""
    inside = {}
    for what, path in own.items():
        path = path.expanduser().resolve()
        if path == root:
            raise UsageError(f"--workdir {root}: it is sortie's {what}; sortie writes there, "
                             "so it cannot be synced: choose another workdir or move the "
                             f"{what}")
        if path.is_relative_to(root):
            inside[path.relative_to(root).as_posix()] = what
    return inside


def plan_sync(root: Path, max_bytes: int = DEFAULT_MAX_BYTES,
              own: Mapping[str, Path] | None = None) -> SyncPlan:
    """Choose the files to send; a UsageError when the workdir is missing or over the cap.
    ``own``: sortie's directories (its runs directory, its home) by what they are; those
    inside the workdir are left out and said to be."""
    root = root.expanduser().resolve()
    if not root.is_dir():
        raise UsageError(f"--workdir {root}: not a directory")
    if not str(root).isprintable():  # records name it as UTF-8 (a surrogate is not printable)
        raise UsageError(f"--workdir {ascii(str(root))}: its path is not printable UTF-8; "
                         "rename it")
    mine = _own_inside(root, own or {})
    left_out = list(mine)  # with the Python environments git lists
    ignore = root / IGNORE_FILE
    skipped: list[str] = []
    names: Iterable[str]
    if ignore.is_file():
        spec = pathspec.GitIgnoreSpec.from_lines(_ignore_lines(ignore))
        names = (n for n in _walk(root, skipped, mine) if not spec.match_file(n))
        rules = IGNORE_FILE
    elif (listed := _git_files(root)) is not None:
        environments = [name for name in _listed_environments(listed)
                        if not always_excluded(name)]
        skipped += [f"{name} ({ENVIRONMENT})" for name in environments]
        left_out += environments
        names, rules = listed, "git's ignore rules"
    else:
        gitignore = root / ".gitignore"
        lines = _ignore_lines(gitignore) if gitignore.is_file() else []
        spec = pathspec.GitIgnoreSpec.from_lines(lines)
        names = (n for n in _walk(root, skipped, mine) if not spec.match_file(n))
        rules = ".gitignore" if lines else "no ignore file"
    files, total = [], 0
    sizes: dict[str, int] = {}  # by first path part: what to name when the cap is passed
    for name in names:  # counted as they come: a workdir of `/` stops at the cap, not the end
        if always_excluded(name) or any(
                name == part or name.startswith(f"{part}/") for part in left_out):
            continue
        try:
            found = os.lstat(root / name)
        except OSError as exc:  # gone since git listed it, or not ours to read
            if not isinstance(exc, FileNotFoundError):
                skipped.append(f"{name} (unreadable: {exc.strerror})")
            continue
        if stat.S_ISDIR(found.st_mode):  # git lists a submodule so
            skipped.append(f"{name} (a git submodule)")
        elif stat.S_ISREG(found.st_mode) or stat.S_ISLNK(found.st_mode):
            files.append(name)
            total += found.st_size
            top = name.split("/")[0] + ("/" if "/" in name else "")
            sizes[top] = sizes.get(top, 0) + found.st_size
        if total > max_bytes or len(files) > MAX_SYNC_FILES:
            over = (f"more than the {readable_bytes(max_bytes)} cap (--max-sync-bytes raises "
                    "it)" if total > max_bytes else f"more than {MAX_SYNC_FILES:,} files")
            largest = ", ".join(f"{top} {readable_bytes(size)}" for top, size in sorted(
                sizes.items(), key=lambda item: -item[1])[:3])
            raise UsageError(f"--workdir {root}: {over} to sync (the largest: {largest}); "
                             f"leave what the job need not read out with {IGNORE_FILE} or "
                             ".gitignore, and put datasets in the cluster's bucket "
                             "($SORTIE_CHECKPOINT_URL's bucket)")
    excluded = ", ".join([*ALWAYS_EXCLUDED, "Python environments",
                          *(f"{part}/ (sortie's {what})" for part, what in mine.items())])
    return SyncPlan(root, tuple(sorted(files)), total, f"{rules}; {excluded} excluded",
                    tuple(skipped))


def file_digest(plan: SyncPlan, name: str) -> str:
    """SHA-256 of one file of the plan (a symlink: of its target's name)."""
    path = plan.root / name
    try:
        if path.is_symlink():
            return hashlib.sha256(os.readlink(path).encode("utf-8", "surrogateescape")).hexdigest()
        return hashlib.sha256(path.read_bytes()).hexdigest()
    except OSError as exc:
        raise UsageError(f"--workdir: {name}: cannot read it ({exc.strerror})") from None


def file_digests(plan: SyncPlan) -> dict[str, str]:
    """Every file of the plan's SHA-256 (`file_digest`), each file read once: the run's code
    record and the workdir's content hash (`content_digest`) are both made from them."""
    return {name: file_digest(plan, name) for name in plan.files}


def content_digest(plan: SyncPlan, names: Iterable[str],
                   digests: Mapping[str, str] | None = None) -> str:
    """SHA-256 over ``names`` (files of the plan) and what each holds (a symlink: its target);
    ``digests``: the files' own, already read (`file_digests`)."""
    digest = hashlib.sha256()
    for name in names:
        path = plan.root / name
        digest.update(f"{name}\0".encode("utf-8", "surrogateescape"))
        try:
            digest.update(os.readlink(path).encode("utf-8", "surrogateescape")
                          if path.is_symlink() else
                          bytes.fromhex(digests[name] if digests else file_digest(plan, name)))
        except OSError as exc:
            raise UsageError(f"--workdir: {name}: cannot read it ({exc.strerror})") from None
    return digest.hexdigest()


def files_under(plan: SyncPlan, name: str) -> list[str]:
    """The plan's files ``name`` stands for: itself, or every file below it (a directory;
    ``.`` the whole workdir)."""
    wanted = PurePosixPath(name).as_posix()
    if wanted == ".":
        return list(plan.files)
    return [f for f in plan.files if f == wanted or f.startswith(f"{wanted}/")]


def workdir_facts(plan: SyncPlan, digests: Mapping[str, str] | None = None) -> dict[str, Any]:
    """What code ran: the synced files' content hash (from their ``digests``, when read
    already) and, in a git repository, its commit and whether the work tree differed from it."""
    facts: dict[str, Any] = {"path": str(plan.root), "files": len(plan.files),
                             "bytes": plan.bytes,
                             "sha256": content_digest(plan, plan.files, digests)}
    try:
        head = subprocess.run(["git", "-C", str(plan.root), "rev-parse", "HEAD"],
                              capture_output=True, text=True, timeout=30)
        changes = subprocess.run(["git", "-C", str(plan.root), "status", "--porcelain"],
                                 capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.SubprocessError):
        return facts
    if head.returncode == 0:
        facts |= {"git_commit": head.stdout.strip(), "git_dirty": bool(changes.stdout.strip())}
    return facts


# A script that sets the rendezvous itself, as the PyTorch tutorials' single-node examples do
# (`os.environ["MASTER_ADDR"] = "localhost"`, `os.environ.update(MASTER_PORT=...)`,
# `init_process_group(..., init_method="tcp://localhost:23456")`): on several nodes each rank
# then looks for the store on its own node and waits, silent, until the hang timeout (30
# minutes by default). `setdefault` and `init_method="env://"` take torchrun's: not found.
SETS_RENDEZVOUS = re.compile(
    r"""os\.environ\[\s*["'](?P<item>MASTER_ADDR|MASTER_PORT)["']\s*\]\s*=[^=]"""
    r"""|os\.environ\.update\(.*?\b(?P<update>MASTER_ADDR|MASTER_PORT)\b"""
    r"""|\binit_method\s*=\s*f?["'](?P<address>tcp://[^"']*)""")
MAX_SCANNED = (500, 1 << 20)  # Python files looked in, and the bytes of each


def _source(plan: SyncPlan, name: str) -> str | None:
    """A Python file of the workdir as text, its first MAX_SCANNED bytes (None: unreadable)."""
    try:
        with (plan.root / name).open("rb") as source:
            return source.read(MAX_SCANNED[1]).decode("utf-8", "replace")
    except OSError:
        return None


def sets_rendezvous(plan: SyncPlan) -> list[str]:
    """Where the workdir's Python files set MASTER_ADDR or MASTER_PORT themselves, or a
    tcp:// `init_method` ("train.py:14 sets MASTER_ADDR", "train.py:9 sets init_method
    tcp://localhost:23456"), over what torchrun set: the first few found."""
    found: list[str] = []
    for name in [f for f in plan.files if f.endswith(".py")][:MAX_SCANNED[0]]:
        if (text := _source(plan, name)) is None:
            continue
        for number, line in enumerate(text.splitlines(), 1):
            if (hit := SETS_RENDEZVOUS.search(line)) and not line.lstrip().startswith("#"):
                what = hit["item"] or hit["update"] or f"init_method {hit['address'][:60]}"
                found.append(f"{name}:{number} sets {what}")
        if len(found) >= 3:
            break
    return found[:3]


def module_home(files: Iterable[str], top: str) -> tuple[str, str] | None:
    """Where in the workdir ``import top`` finds a package (``top/…/*.py``) or a module
    (``top.py``): (the directory to put on the path, "." for the top; the package or file
    found), the shallowest; None when the workdir has none."""
    homes = []
    for name in files:
        parts = name.split("/")
        for depth, part in enumerate(parts):
            if (part == top and depth < len(parts) - 1 and name.endswith(".py")
                    or depth == len(parts) - 1 and part == f"{top}.py"):
                package = "/" if part == top else ""
                homes.append((depth, "/".join(parts[:depth]) or ".",
                              "/".join(parts[:depth + 1]) + package))
                break
    return min(homes)[1:] if homes else None


def imports_out_of_reach(plan: SyncPlan, script: str) -> list[tuple[str, str]]:
    """The modules of the workdir's top that ``script`` imports where Python will not find
    them: from a subdirectory's script, Python looks in that directory, not the top. (module,
    the package or file), for a script that does not change its `sys.path` itself; at home the
    user's shell found them (its PYTHONPATH, `python -m`)."""
    here = PurePosixPath(script).parent.as_posix()
    if here == "." or script not in plan.files:
        return []
    if (text := _source(plan, script)) is None or "sys.path" in text:
        return []
    try:
        tree = ast.parse(text)
    except (SyntaxError, ValueError):
        return []
    names = {alias.name.split(".")[0] for node in ast.walk(tree) if isinstance(node, ast.Import)
             for alias in node.names}
    names |= {node.module.split(".")[0] for node in ast.walk(tree)
              if isinstance(node, ast.ImportFrom) and node.module and not node.level}
    found = []
    for name in sorted(names - set(sys.stdlib_module_names)):
        home = module_home(plan.files, name)
        beside = module_home((f.removeprefix(f"{here}/") for f in plan.files
                              if f.startswith(f"{here}/")), name)
        if home is not None and home[0] == "." and (beside is None or beside[0] != "."):
            found.append((name, home[1]))
    return found[:3]


PYTHON_WORD = re.compile(r"^(?:\S*/)?python(?:3(?:\.\d+)?)?$")  # python, python3.11, env/bin/python


def started_without_torchrun(plan: SyncPlan, run: str) -> str | None:
    """The workdir's script a `run` line starts with plain Python (`python train.py`, the
    line's first command) where the script joins a process group, which needs the variables
    torchrun sets in each process; None otherwise (torchrun in the line, `mp.spawn`)."""
    try:
        words = shlex.split(run.split("\n", 1)[0].split("&&", 1)[0])
    except ValueError:
        return None
    if len(words) < 2 or not PYTHON_WORD.match(words[0]) or "torchrun" in run:
        return None
    script = words[1]
    if script not in plan.files or not script.endswith(".py"):
        return None
    if (text := _source(plan, script)) is None:
        return None
    joins = "init_process_group" in text
    own = re.search(r"\bspawn\(|torchrun|elastic_launch|NODE_RANK|init_process_group\([^)]{0,500}"
                    r"\brank\s*=", text)  # its own processes, or ranks of its own
    return script if joins and not own else None
