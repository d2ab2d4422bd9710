"""Files the user hands sortie (a task, a hosts file, a stack's outputs): untrusted input, read
with a size cap; anything wrong with one is one line naming the file."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml

from bootstrap.errors import UsageError


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
