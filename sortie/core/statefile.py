"""The controller's small JSON state files (inventory.json, sortie.json, controller.json).

Written atomically (a temp file in the same directory, then a rename), so a controller killed
mid-write leaves the old file or the new one, never half of one; read back with one clear line
when a file is damaged anyway (edited by hand, a full disk), never a traceback.
"""

from __future__ import annotations

import contextlib
import errno
import io
import json
import math
import os
import stat
import tempfile
from pathlib import Path
from typing import Annotated, Any, TypeVar

from pydantic import BaseModel, Field, ValidationError

from sortie.core.errors import SortieError, first_field_error, first_line

M = TypeVar("M", bound=BaseModel)


class CorruptStateError(SortieError):
    """A state file that cannot be read back; the message names it and why."""


RUN_FILE_MODE = 0o644  # a run directory's files are the user's to share; state files are not
MAX_STATE_BYTES = 1 << 20  # no state file of ours is near this: a larger one is not ours
# Times in state files (epoch seconds): finite, and no later than 2100 (a damaged or forged file
# with -1e300 or 1e308 must not reach a date computation).
MAX_EPOCH_S = 4_102_444_800.0
EpochSeconds = Annotated[float, Field(ge=0, le=MAX_EPOCH_S, allow_inf_nan=False)]
# Dollars and dollars an hour in state files: finite and bounded.
Usd = Annotated[float, Field(ge=0, le=1e9, allow_inf_nan=False)]


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
        try:
            os.replace(temp, path)
        except IsADirectoryError:  # a directory where a state file belongs: never removed
            raise SortieError(f"{path} is a directory, not the file sortie keeps there: move "
                              "it aside") from None
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temp)
        raise


def write_new(path: Path, text: str, mode: int = 0o644) -> None:
    """Write ``text`` to a file made here and now: never over one that exists, never through a
    symlink (FileExistsError; another OSError when it cannot be made)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, mode)
    with os.fdopen(fd, "w") as handle:
        handle.write(text)


def first_existing(path: Path) -> Path:
    """``path`` made absolute, or its nearest ancestor that exists: where making it would
    begin, and what decides whether it can be made."""
    path = Path(os.path.abspath(path))
    return next(p for p in (path, *path.parents) if os.path.lexists(p))


def not_private(path: Path) -> str:
    """Why ``path`` may not be trusted with what runs from it (a cache of compiled code, an
    image booted as root): not this user's own, writable by others, or a link; "" when it may
    be."""
    try:
        info = path.lstat()
    except OSError as exc:
        return f"{path}: {exc.strerror}"
    if stat.S_ISLNK(info.st_mode):
        return f"{path} is a link"
    if info.st_uid != os.geteuid():
        return f"{path} is not this user's own (owner uid {info.st_uid})"
    if info.st_mode & 0o022:
        return f"{path} can be written by others (mode {stat.S_IMODE(info.st_mode):o})"
    return ""


def write_json(path: Path, data: Any) -> None:
    write_text(path, json.dumps(data, indent=2) + "\n")


def _finite(text: str) -> float:
    number = float(text)
    if not math.isfinite(number):  # 1e400 reads as infinity
        raise ValueError(f"{text[:30]} is not a finite number")
    return number


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a number strict JSON has")


def strict_json(data: str | bytes) -> Any:
    """JSON as the standard has it: no NaN, Infinity, or numbers too large to be finite
    (Python's json reads all three); ValueError otherwise."""
    return json.loads(data, parse_float=_finite, parse_constant=_no_constant)


def loads(data: str | bytes, where: str, strict: bool = True) -> Any:
    """Parsed JSON, strict unless told (then NaN and infinities are read, for a validator to
    refuse value by value); CorruptStateError (one line) when it is not JSON."""
    try:
        return strict_json(data) if strict else json.loads(data)
    except (ValueError, RecursionError) as exc:  # not UTF-8, not JSON, nested past the stack
        raise CorruptStateError(f"{where}: damaged, not JSON ({first_line(exc)})") from None


class NotRegularFile(OSError):
    """A path where sortie reads a file holds something else (a FIFO, a device, a directory,
    a symlink where none is followed), or a file larger than sortie reads."""


def _open_checked(path: Path, follow_symlinks: bool = False) -> io.BufferedReader:
    """``path`` opened for reading, checked to be a regular file before anything is read (a
    FIFO would hang the command, /dev/zero never end); never through a symlink unless told.
    FileNotFoundError when there is none; NotRegularFile for anything else there."""
    flags = os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK | (0 if follow_symlinks else os.O_NOFOLLOW)
    try:
        fd = os.open(path, flags)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise NotRegularFile("not a regular file (a symlink)") from None
        raise
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise NotRegularFile("not a regular file")
    return os.fdopen(fd, "rb")


def read_regular(path: Path, max_bytes: int, follow_symlinks: bool = False) -> bytes:
    """A regular file's bytes (`_open_checked`), never read past ``max_bytes``: a larger file
    is NotRegularFile too."""
    with _open_checked(path, follow_symlinks) as handle:
        data = handle.read(max_bytes + 1)
    if len(data) > max_bytes:
        raise NotRegularFile(f"larger than {readable_cap(max_bytes)}")
    return data


def readable_cap(max_bytes: int) -> str:
    return f"{max_bytes >> 20} MiB" if max_bytes >= 1 << 20 else f"{max_bytes >> 10} KiB" \
        if max_bytes >= 1 << 10 else f"{max_bytes} bytes"


def read_json(path: Path, max_bytes: int = MAX_STATE_BYTES) -> Any:
    """The parsed file; CorruptStateError (one line) when it is unreadable, not a regular file,
    too large or not (strict) JSON."""
    try:
        data = read_regular(path, max_bytes)
    except FileNotFoundError:
        raise
    except OSError as exc:
        raise CorruptStateError(f"{path}: cannot read it ({exc.strerror or exc})") from None
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
    return parse_model(model, read_json(path, max_bytes), str(path))


def open_regular(path: Path) -> io.BufferedReader | None:
    """``path`` opened for reading if it is a regular file, else None: never through a symlink
    (a shared run directory's ``logs/node-0.log -> /proc/self/environ`` is not read)."""
    try:
        return _open_checked(path)
    except OSError:
        return None


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
