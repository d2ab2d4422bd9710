"""Why a launch failed, as the cloud said it: only a lack of capacity moves a launch on to its
next placement (another zone, on-demand); a quota, a permission or an image stays the same in
every zone, so the launch stops at once and says how to fix it. Each cloud lists its own error
codes (`infra/<cloud>/facts.py`, `LAUNCH_ERRORS`; sources in docs/clouds.md)."""

from __future__ import annotations

import re
from dataclasses import dataclass

# The kinds of launch error; only CAPACITY moves on.
CAPACITY, QUOTA, PERMISSION, IMAGE, OTHER = "capacity", "quota", "permission", "image", "other"


@dataclass(frozen=True)
class LaunchErrorRule:
    """An error code (a regular expression over the provider's message) and what it means."""

    kind: str
    code: re.Pattern[str]
    fix: str = ""  # what the user does about it, in a few words


def rule(kind: str, code: str, fix: str = "") -> LaunchErrorRule:
    return LaunchErrorRule(kind, re.compile(code), fix)


@dataclass(frozen=True)
class LaunchProblem:
    kind: str  # one of the kinds above
    code: str  # the code found ("" for OTHER)
    fix: str

    @property
    def moves_on(self) -> bool:
        """Whether another placement may succeed where this one failed."""
        return self.kind == CAPACITY

    def describe(self) -> str:
        """One line: the kind, the code, and the fix."""
        if self.kind == OTHER:
            return "not a capacity error: another zone would fail the same way"
        return f"{self.kind} ({self.code}){': ' + self.fix if self.fix else ''}"


def classify(rules: tuple[LaunchErrorRule, ...], message: str) -> LaunchProblem:
    """The first rule whose code the message holds; capacity is asked last, so that a message
    naming both (a quota refusal that mentions capacity) stops."""
    ordered = sorted(rules, key=lambda r: r.kind == CAPACITY)
    for each in ordered:
        found = each.code.search(message)
        if found:
            return LaunchProblem(each.kind, found.group(0), each.fix)
    return LaunchProblem(OTHER, "", "")
