"""How sortie writes an amount of money and a rate, everywhere it says one: "$1,234.50",
"$32.77/h". A rate the user gave is echoed as given instead ("notional: $3600/h a node")."""

from __future__ import annotations


def usd(amount: float) -> str:
    return f"${amount:,.2f}"


def usd_per_hour(rate: float) -> str:
    return f"{usd(rate)}/h"
