"""The command line's value types and flag bundles that more than one module of flags uses."""

from __future__ import annotations

import functools
import inspect
import re
from collections.abc import Callable
from typing import Any, TypeVar

import click

F = TypeVar("F", bound=Callable[..., Any])


class Duration(click.ParamType):
    """A duration in seconds: 90, 90s, 30m, 2h, 30d; at least ``min_s``."""

    name = "DURATION"

    MAX_S = 100 * 365 * 86400  # a century: past it, date arithmetic has nothing to mean

    def __init__(self, min_s: float = 1, max_s: float = MAX_S) -> None:
        self.min_s, self.max_s = min_s, max_s

    def convert(self, value: object, param: click.Parameter | None,
                ctx: click.Context | None) -> float:
        match = re.fullmatch(r"(\d{1,9})\s*([smhd]?)", str(value).strip().lower())
        if not match:
            self.fail(f"{value!r} is not a duration like 90s, 30m, 2h or 30d", param, ctx)
        seconds = float(match[1]) * {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400}[match[2]]
        if seconds < self.min_s:
            self.fail(f"{value!r} is under the least it may be, {self.min_s:g}s", param, ctx)
        if seconds > self.max_s:
            self.fail(f"{value!r} is over a century" if self.max_s == self.MAX_S else
                      f"{value!r} is over the most it may be, {self.max_s:g}s", param, ctx)
        return seconds


def bundled(into: str, build: Callable[..., Any], flags: tuple[Callable[[F], F], ...]
            ) -> Callable[[F], F]:
    """Declare ``flags`` on a command and hand it their values as one: ``build``'s answer,
    called with them, as the parameter ``into`` (a command takes a job, not six flags)."""
    def declare(command: F) -> F:
        names = tuple(inspect.signature(build).parameters)

        @functools.wraps(command)
        def with_bundle(*args: Any, **values: Any) -> Any:
            values[into] = build(**{name: values.pop(name) for name in names})
            return command(*args, **values)

        for flag in reversed(flags):
            with_bundle = flag(with_bundle)
        return with_bundle  # type: ignore[return-value]
    return declare
