"""The controller's small JSON state files (inventory.json, sortie.json, controller.json).

Written atomically (a temp file in the same directory, then a rename), so a controller killed
mid-write leaves the old file or the new one, never half of one; read back with one clear line
when a file is damaged anyway (edited by hand, a full disk), never a traceback.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import stat
import tempfile
from pathlib import Path
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

from sortie.core.errors import SortieError, first_field_error, first_line

M = TypeVar("M", bound=BaseModel)


class CorruptStateError(SortieError):
    """A state file that cannot be read back; the message names it and why."""


RUN_FILE_MODE = 0o644  # a run directory's files are the user's to share; state files are not


def write_text(path: Path, text: str, mode: int = 0o600) -> None:
    """Replace ``path`` with ``text`` in one step (and with ``mode``): a symlink at ``path`` is
    replaced, never written through."""
    fd, temp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(temp, mode)
        os.replace(temp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temp)
        raise


def first_existing(path: Path) -> Path:
    """``path`` made absolute, or its nearest ancestor that exists: where making it would
    begin, and what decides whether it can be made."""
    path = Path(os.path.abspath(path))
    return next(p for p in (path, *path.parents) if os.path.lexists(p))


def write_json(path: Path, data: Any) -> None:
    write_text(path, json.dumps(data, indent=2) + "\n")


def loads(data: str | bytes, where: str) -> Any:
    """Parsed JSON; CorruptStateError (one line) when it is not JSON."""
    try:
        return json.loads(data)
    except (ValueError, RecursionError) as exc:  # not UTF-8, not JSON, nested past the stack
        raise CorruptStateError(f"{where}: damaged, not JSON ({first_line(exc)})") from None


def read_json(path: Path) -> Any:
    """The parsed file; CorruptStateError (one line) when it is unreadable or not JSON."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise
    except OSError as exc:
        raise CorruptStateError(f"{path}: cannot read it ({exc})") from None
    return loads(data, str(path))


def parse_model(model: type[M], data: Any, where: str) -> M:
    """``data`` (parsed JSON) as a ``model``; CorruptStateError naming the first bad field."""
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise CorruptStateError(f"{where}: damaged ({first_field_error(exc)})") from None


def read_model(model: type[M], path: Path) -> M:
    """A state file read back as a ``model``; CorruptStateError (one line) when damaged."""
    return parse_model(model, read_json(path), str(path))


def read_untrusted_model(model: type[M], path: Path, max_bytes: int = 1 << 20) -> M:
    """A small JSON file someone else wrote (a node's ``summary.json``): never through a
    symlink, at most ``max_bytes``, validated; FileNotFoundError when there is none,
    CorruptStateError (one line) otherwise."""
    handle = open_regular(path)
    if handle is None:
        if not os.path.lexists(path):
            raise FileNotFoundError(path)
        raise CorruptStateError(f"{path}: not a regular file")
    with handle:
        data = handle.read(max_bytes + 1)
    if len(data) > max_bytes:
        raise CorruptStateError(f"{path}: larger than {max_bytes} bytes")
    return parse_model(model, loads(data, str(path)), str(path))


def open_regular(path: Path) -> io.BufferedReader | None:
    """``path`` opened for reading if it is a regular file, else None: never through a symlink
    (a shared run directory's ``logs/node-0.log -> /proc/self/environ`` is not read)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
    except OSError:
        return None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        return None
    return os.fdopen(fd, "rb")


def read_tail(path: Path, max_bytes: int) -> tuple[bytes, int] | None:
    """The last ``max_bytes`` of a regular file (never through a symlink) and how many bytes
    came before them; None when it is not a regular file."""
    handle = open_regular(path)
    if handle is None:
        return None
    with handle:
        size = os.fstat(handle.fileno()).st_size
        handle.seek(max(0, size - max_bytes))
        return handle.read(max_bytes), max(0, size - max_bytes)
