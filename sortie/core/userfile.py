"""Files the user hands sortie (a task, a hosts file, a stack's outputs): untrusted input, read
with a size cap; anything wrong with one is one line naming the file."""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import yaml

from sortie.core import statefile
from sortie.core.errors import UsageError, first_line

ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
# What sortie tells every node (`bootstrap/contract.py`); no file of the user's may set these.
RESERVED_ENV = ("MASTER_ADDR", "MASTER_PORT", "NODE_RANK")
RESERVED_PREFIX = "SORTIE_"
# No task, hosts file or outputs nests deeper or holds more; such a one attacks the parser.
MAX_DEPTH = 16
MAX_VALUES = 100_000
# What a user's file may put on a node's command line: one variable's value, and all of them
# (or one `run`/`setup` command) together; Linux takes at most 128 KiB in one argument.
MAX_ENV_VALUE = 4096
MAX_COMMAND_TEXT = 32 << 10


def env_name(name: str) -> str:
    """``name``, if a user's file (a task's ``env``, a hosts file's) may set that variable on
    the nodes; else a ValueError for the file's validator to name."""
    if not ENV_NAME.fullmatch(name):
        raise ValueError(f"{name!r} is not an environment variable name")
    if name.startswith(RESERVED_PREFIX) or name in RESERVED_ENV:
        raise ValueError(f"{name} is set by sortie on every node (docs/your-job.md)")
    return name


def check_env(env: Mapping[str, str | None]) -> None:
    """A job's variables from a user's file: names `env_name` allows, and values that fit on
    the node's command line they are set on (a single argument is at most 128 KiB on Linux);
    else a ValueError for the file's validator to name. (None: read from the caller's
    environment and passed over stdin, as a secret.)"""
    for name, value in env.items():
        env_name(name)
        if value is not None and len(value) > MAX_ENV_VALUE:
            raise ValueError(f"{name}: over {MAX_ENV_VALUE} characters (put it in a file in the "
                             "workdir)")
    if sum(len(name) + len(value or "") for name, value in env.items()) > MAX_COMMAND_TEXT:
        raise ValueError(f"over {MAX_COMMAND_TEXT >> 10} KiB of variables together (put them in "
                         "a file in the workdir)")


def command_text(text: str | None, field: str) -> str | None:
    """A command a user's file gives (`run`, `setup`): not empty, and short enough for the node's
    command line; else a ValueError naming ``field``."""
    if text is not None and not text.strip():
        raise ValueError(f"empty; leave `{field}` out instead")
    if text is not None and len(text) > MAX_COMMAND_TEXT:
        raise ValueError(f"over {MAX_COMMAND_TEXT >> 10} KiB; put it in a script in the workdir")
    return text


# Where no directory of a user's belongs: the kernel's own file systems.
KERNEL_TREES = (Path("/proc"), Path("/sys"), Path("/dev"))
MAX_PATH = 4095  # bytes: Linux's PATH_MAX less its NUL
MAX_NAME = 255  # bytes of one path component


def user_path(given: str | os.PathLike[str], field: str, absolute_wanted: bool = True
              ) -> Path:
    """A path the user gave for sortie to read or write (--runs-dir, SORTIE_HOME, `init` DIR,
    a task's `workdir`): made absolute (``~`` expanded); a UsageError naming ``field`` when it
    is empty, holds a NUL or unprintable character, names an unknown user's ``~``, is longer
    than Linux takes, leads through a symlink loop, or lies in /proc, /sys or /dev. With
    ``absolute_wanted`` False, a relative path stays as given (it is shown as the user wrote it)."""
    text = os.fspath(given)
    if not text.strip():
        raise UsageError(f"{field}: an empty path; give a directory")
    if not text.isprintable():
        raise UsageError(f"{field}: {text[:100]!r} holds characters no path of ours has")
    try:
        expanded = os.path.expanduser(text)
    except (RuntimeError, KeyError):
        expanded = text
    if expanded.startswith("~"):
        raise UsageError(f"{field}: {text[:100]!r}: no such user's home")
    absolute = Path(os.path.abspath(expanded))
    encoded = os.fsencode(absolute)
    if len(encoded) > MAX_PATH or any(len(part) > MAX_NAME for part in encoded.split(b"/")):
        raise UsageError(f"{field}: {text[:60]!r}...: longer than a path may be "
                         f"({MAX_NAME} bytes a name, {MAX_PATH} in all)")
    try:
        real = absolute.resolve()
    except (RuntimeError, OSError) as exc:  # a symlink loop (RuntimeError before 3.13)
        raise UsageError(f"{field}: {text[:100]!r}: cannot be resolved ({first_line(exc)})"
                         ) from None
    if any(real == tree or tree in real.parents for tree in KERNEL_TREES):
        raise UsageError(f"{field}: {text[:100]!r} is in {real.parts[1] and '/' + real.parts[1]}"
                         ", the kernel's: give a directory of your own")
    return absolute if absolute_wanted else Path(expanded)


def read_capped(path: Path, max_bytes: int, too_big: str = "") -> bytes:
    """A user's file, at most ``max_bytes`` of it; a UsageError naming it when it cannot be read,
    is no regular file (a FIFO would hang the command), or is larger (``too_big`` says why the
    cap is what it is)."""
    try:
        return statefile.read_regular(Path(path), max_bytes, follow_symlinks=True)
    except statefile.NotRegularFile as exc:
        if str(exc).startswith("larger"):
            raise UsageError(f"{path}: over {max_bytes >> 10} KiB{too_big}") from None
        raise UsageError(f"{path}: {exc}") from None
    except OSError as exc:
        raise UsageError(f"{path}: cannot read it ({exc.strerror or exc})") from None


def read_yaml(path: Path, max_bytes: int, kind: str, too_big: str = "") -> Any:
    """The YAML document in ``path`` ({} when empty: no document at all; `[]`, `0`, `false` or
    `""` is a document, and its reader says it is none of ours). ``kind`` names it in errors
    ("task"); ``too_big`` adds why the cap is what it is."""
    data = parse_yaml(read_capped(path, max_bytes, too_big), str(path), kind)
    return {} if data is None else data


def read_json(path: Path, max_bytes: int, kind: str) -> Any:
    """The JSON document in ``path``, read like `read_yaml`."""
    return _parse(statefile.strict_json, read_capped(path, max_bytes, ""), str(path),
                  f"JSON {kind}")


def parse_yaml(text: str | bytes, where: str, kind: str) -> Any:
    """YAML text the user gave (a file's bytes, a `--set` value); one UsageError when it is not
    UTF-8 YAML, or is nested deeper than any of our documents is."""
    return _parse(_safe_load, text, where, f"YAML {kind}")


def _parse(parse: Callable[[str], Any], text: str | bytes, where: str, kind: str) -> Any:
    problem: str | None
    try:
        if isinstance(text, bytes):
            text = text.decode("utf-8")
        text.encode("utf-8")  # a command line's undecodable bytes arrive as surrogates
        data = parse(text)
    except UnicodeError as exc:
        at = f" (byte {exc.start}: {exc.reason})" if isinstance(exc, UnicodeDecodeError) else ""
        raise UsageError(f"{where}: not UTF-8 text{at}") from None
    except (ValueError, yaml.YAMLError) as exc:  # JSONDecodeError included
        raise UsageError(f"{where}: not a {kind} ({' '.join(str(exc).split())[:200]})"
                         ) from None
    except RecursionError:  # deeper than the parser's stack, so far deeper than MAX_DEPTH
        data, problem = None, f"nested more than {MAX_DEPTH} levels deep"
    else:
        problem = _shape_problem(data)
    if problem:
        raise UsageError(f"{where}: {problem}: not a {kind} sortie reads")
    return data


def _shape_problem(data: Any) -> str | None:
    """Why ``data`` is no document of ours: nested too deep, or (YAML aliases repeat a value
    without repeating its text: a few lines can stand for a billion) too many values. Walked
    without recursing, and never further than the caps."""
    todo, seen = [(data, 1)], 0
    while todo:
        item, level = todo.pop()
        seen += 1
        if seen > MAX_VALUES:
            return f"more than {MAX_VALUES} values"
        if isinstance(item, str) and "\x00" in item:  # cut short by every C string it meets
            return f"a NUL character in {item.split(chr(0))[0][:40]!r}..."
        if isinstance(item, dict | list):
            if level > MAX_DEPTH:
                return f"nested more than {MAX_DEPTH} levels deep"
            children = [*item.keys(), *item.values()] if isinstance(item, dict) else item
            todo.extend((child, level + 1) for child in children)
    return None


class _UniqueKeyLoader(yaml.SafeLoader):
    """YAML's safe loader, except that a key given twice in one mapping is an error: a task's
    `nodes: 1` then `nodes: 8` would otherwise quietly mean 8."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict:
        seen = set()
        for key_node, _value in node.value:
            key = self.construct_object(key_node, deep=deep)
            if isinstance(key, str | int | float | bool) and key in seen:
                raise yaml.constructor.ConstructorError(
                    None, None, f"{key!r} is given twice", key_node.start_mark)
            seen.add(key) if isinstance(key, str | int | float | bool) else None
        return super().construct_mapping(node, deep)


def _safe_load(text: str) -> Any:
    return yaml.load(text, Loader=_UniqueKeyLoader)  # noqa: S506 - a safe loader's subclass
