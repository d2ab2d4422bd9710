"""Sizes in bytes and counts of things, as flags take them and as people read them."""

from __future__ import annotations

SIZE_UNITS = {"T": 2**40, "G": 2**30, "M": 2**20, "K": 2**10}  # as --max-artifacts takes them


def human_bytes(count: int) -> str:
    """Exactly, as a flag takes it: 1073741824 -> 1G."""
    for unit, size in SIZE_UNITS.items():
        if count >= size and count % size == 0:
            return f"{count // size}{unit}"
    return f"{count}B"


def readable_bytes(count: int) -> str:
    """Roughly, for people: 64305983488 -> 59.9 GiB."""
    value = float(count)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024:
            return f"{value:,.0f} {unit}" if unit == "B" else f"{value:,.1f} {unit}"
        value /= 1024
    return f"{value:,.1f} TiB"


def counted(count: int, noun: str) -> str:
    """"1 sortie", "2 sorties", "1,024 files"."""
    return f"{count:,} {noun}{'' if count == 1 else 's'}"
