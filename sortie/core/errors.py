"""Errors that end a command with one clear line instead of a traceback."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:  # a type hint only: loading pydantic costs every command ~0.15 s
    from pydantic import ValidationError


class SortieError(Exception):
    """A failure the user can act on; the CLI prints its message and exits with ``exit_code``."""

    exit_code = 1


class UsageError(SortieError):
    """Bad input (flags, configs, profiles), found before anything is started."""

    exit_code = 2


class Terminated(KeyboardInterrupt):
    """SIGTERM, surfaced like Ctrl-C so that the same teardown runs (exit 143, not 130)."""


class Interrupted(KeyboardInterrupt):
    """Ctrl-C or SIGTERM once the run it stopped is recorded: the message says what became of
    it (the cluster, the report)."""

    def __init__(self, how: str, details: list[str]) -> None:
        """``how``: `interruption`'s word; ``details``: what became of the run, in order."""
        self.sigterm = how == "SIGTERM"
        super().__init__("; ".join(["stopped by SIGTERM" if self.sigterm else "interrupted",
                                    *details]))


def interruption(exc: KeyboardInterrupt) -> str:
    """How a run was interrupted, as its record says it."""
    sigterm = isinstance(exc, Terminated) or (isinstance(exc, Interrupted) and exc.sigterm)
    return "SIGTERM" if sigterm else "Ctrl-C"


def first_field_error(error: ValidationError) -> str:
    """"field.sub: what is wrong" for the first error pydantic found: one line naming the field
    (just what is wrong when it is about the whole document)."""
    first = error.errors()[0]
    field = ".".join(str(part) for part in first["loc"])
    message = first["msg"].removeprefix("Value error, ")
    if first["type"] in ("tuple_type", "list_type"):  # YAML has lists, not Python's tuples
        message = f"a list ([a, b], or a `- ` line each), not {_shown(first['input'])}"
    elif first["type"] in ("dict_type", "model_type"):
        message = f"a mapping (NAME: value, a line each), not {_shown(first['input'])}"
    return f"{field}: {message}" if field else message


def _shown(value: object) -> str:
    """What a user gave where another kind of value belongs, briefly."""
    if isinstance(value, str):
        return f"the text {value[:40]!r}"
    if isinstance(value, list | dict):
        return "a list" if isinstance(value, list) else "a mapping"
    return repr(value)[:40]


def first_line(exc: BaseException) -> str:
    """An error's first line (its type where it says nothing), to quote in a one-line message."""
    text = str(exc).strip()
    return text.splitlines()[0][:300] if text else type(exc).__name__


def last_line(output: str, otherwise: str, max_chars: int = 300) -> str:
    """A failed command's last line of output (where tools say why), else ``otherwise``: the
    one line a message quotes, capped since a node's output is untrusted."""
    lines = output.strip().splitlines()
    return (lines[-1] if lines else otherwise)[:max_chars]
