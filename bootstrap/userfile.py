"""Files the user hands sortie (a task, a hosts file, a stack's outputs): untrusted input, read
with a size cap; anything wrong with one is one line naming the file."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import yaml

from bootstrap.errors import UsageError

ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
# What sortie tells every node (`bootstrap/contract.py`); no file of the user's may set these.
RESERVED_ENV = ("MASTER_ADDR", "MASTER_PORT", "NODE_RANK")
RESERVED_PREFIX = "SORTIE_"


def env_name(name: str) -> str:
    """``name``, if a user's file (a task's ``env``, a hosts file's) may set that variable on
    the nodes; else a ValueError for the file's validator to name."""
    if not ENV_NAME.fullmatch(name):
        raise ValueError(f"{name!r} is not an environment variable name")
    if name.startswith(RESERVED_PREFIX) or name in RESERVED_ENV:
        raise ValueError(f"{name} is set by sortie on every node (see the README's contract)")
    return name


def _read_capped(path: Path, max_bytes: int, too_big: str) -> bytes:
    try:
        with path.open("rb") as file:
            raw = file.read(max_bytes + 1)
    except OSError as exc:
        raise UsageError(f"{path}: cannot read it ({exc.strerror})") from None
    if len(raw) > max_bytes:
        raise UsageError(f"{path}: over {max_bytes >> 10} KiB{too_big}")
    return raw


def read_yaml(path: Path, max_bytes: int, kind: str, too_big: str = "") -> Any:
    """The YAML document in ``path`` ({} when empty). ``kind`` names it in errors ("task");
    ``too_big`` adds why the cap is what it is."""
    raw = _read_capped(path, max_bytes, too_big)
    try:
        return yaml.safe_load(raw.decode("utf-8")) or {}
    except (yaml.YAMLError, UnicodeDecodeError) as exc:
        raise UsageError(f"{path}: not a YAML {kind} ({' '.join(str(exc).split())[:200]})"
                         ) from None


def read_json(path: Path, max_bytes: int, kind: str) -> Any:
    """The JSON document in ``path``, read like `read_yaml`."""
    raw = _read_capped(path, max_bytes, "")
    try:
        return json.loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        raise UsageError(f"{path}: not a JSON {kind} ({' '.join(str(exc).split())[:200]})"
                         ) from None
