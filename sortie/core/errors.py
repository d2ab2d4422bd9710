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


def first_field_error(error: ValidationError) -> str:
    """"field.sub: what is wrong" for the first error pydantic found: one line naming the field
    (just what is wrong when it is about the whole document)."""
    first = error.errors()[0]
    field = ".".join(str(part) for part in first["loc"])
    message = first["msg"].removeprefix("Value error, ")
    return f"{field}: {message}" if field else message


def first_line(exc: BaseException) -> str:
    """An error's first line (its type where it says nothing), to quote in a one-line message."""
    text = str(exc).strip()
    return text.splitlines()[0][:300] if text else type(exc).__name__
