"""How each kind of number is written for people: bytes, counts (cycles, operators ...), percentages, times and
a value in its unit. Every table, message and report format writes numbers through these, so one value reads the
same wherever it is shown.

Bytes and counts are exact integers with thousands separators (``22,192 B``, ``1,234 cycles``); a table column
whose header already names the unit (``Flash (B)``) leaves it out of its cells. A missing value is ``n/a``.
"""

from __future__ import annotations

from typing import Any

NA = "n/a"


def fmt_bytes(value: Any, unit: bool = True) -> str:
    """``22,192 B``; ``22,192`` with ``unit=False`` (a column headed in bytes)."""
    if value is None:
        return NA
    return f"{int(round(float(value))):,}" + (" B" if unit else "")


def fmt_count(value: Any, unit: str = "") -> str:
    """A whole number of something (cycles, operators, cases): ``1,234`` or, with ``unit``, ``1,234 cycles``."""
    if value is None:
        return NA
    return f"{int(round(float(value))):,}" + (f" {unit}" if unit else "")


def fmt_number(value: Any, digits: int) -> str:
    """A measured quantity with a fixed number of decimals and thousands separators (``1,234.5``): rates,
    milliseconds and utilisations in a column that names their unit."""
    if value is None:
        return NA
    return f"{float(value):,.{digits}f}"


def fmt_pct(value: Any, digits: int = 2, sign: bool = False, unit: str = "") -> str:
    """A percentage or a difference in percentage points: ``75.73``, ``+0.12`` (``sign``), ``75.73%`` or
    ``0.50 pts`` (``unit``: ``%`` joins the number, any other unit follows a space)."""
    if value is None:
        return NA
    text = f"{float(value):{'+' if sign else ''}.{digits}f}"
    return text + ("%" if unit == "%" else f" {unit}" if unit else "")


def fmt_seconds(value: Any, digits: int = 0) -> str:
    """A duration in seconds: ``12 s``, ``3.25 s`` (``digits``)."""
    if value is None:
        return NA
    return f"{float(value):.{digits}f} s"


def fmt_in_unit(value: Any, unit: str) -> str:
    """A value in its unit as messages write it: bytes and cycles exact (``22,192 B``, ``1,234 cycles``),
    accuracy in % or percentage points with two decimals, milliseconds and other units (a task's metric: MSE,
    dB ...) to four significant digits."""
    if value is None:
        return NA
    if unit == "B":
        return fmt_bytes(value)
    if unit == "cycles":
        return fmt_count(value, "cycles")
    if unit in ("%", "pts"):
        return fmt_pct(value, unit=unit)
    return f"{float(value):.4g} {unit}".strip()
