"""Which compiled leaf to recommend for one target: never one that another leaf beats on every axis.

The axes are the leaf's int8 quality (its accuracy; for other tasks minus its metric's drop against ``ptq``), the compiled model's bytes (flash) and
its NPU cycles (latency on one target). Among the leaves that meet the requirements, the ones no other
meeting leaf dominates form the candidates, and the least-optimized of them (lowest tree level, then the
best metric, then the smaller flash) is recommended. A leaf that meets the requirements is never passed
over for one that does not: a leaf beaten only by leaves that miss a requirement (e.g. SRAM) stays a
candidate.

Rows are the report's rows: ``{"leaf", "level", "values": {key: {"value": ...}}, "meets_requirements"}``.
This module judges rows only; it reads no run folder and imports nothing from the report.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

ACCURACY = "int8_accuracy_pct"
METRIC_DROP = "int8_metric_drop"
FLASH = "compiled_model_bytes"
CYCLES = "total_cycles"
AXES = ("accuracy", "flash", "latency")


def _value(row: Mapping[str, Any], key: str) -> Any:
    cell = row["values"].get(key)
    return None if cell is None else cell.get("value")


def quality(row: Mapping[str, Any]) -> float | None:
    """How good the leaf's int8 model is, higher better: its accuracy, else minus its metric's drop vs ptq (a
    regression or reconstruction task, whatever the metric's direction)."""
    acc = _value(row, ACCURACY)
    if acc is not None:
        return float(acc)
    drop = _value(row, METRIC_DROP)
    return None if drop is None else -float(drop)


def objectives(row: Mapping[str, Any]) -> tuple[float, float, float]:
    """(-quality, flash, cycles), each to be minimised; a missing quality counts as the worst."""
    acc = quality(row)
    flash, cycles = _value(row, FLASH), _value(row, CYCLES)
    return (math.inf if acc is None else -float(acc),
            math.inf if flash is None else float(flash),
            math.inf if cycles is None else float(cycles))


def dominates(a: Sequence[float], b: Sequence[float]) -> bool:
    """``a`` is no worse than ``b`` on every objective and better on at least one."""
    return all(x <= y for x, y in zip(a, b)) and any(x < y for x, y in zip(a, b))


def _order(row: Mapping[str, Any], cycles_first: bool = False) -> tuple:
    """Least-optimized level first, then the best quality, then the smaller flash (or, with ``cycles_first``, a
    latency requirement given, the fewer NPU cycles before the smaller flash)."""
    level = row.get("level")
    acc, flash, cycles = objectives(row)
    return (level is None, level if level is not None else 0, acc, *((cycles, flash) if cycles_first else (flash,)),
            row["leaf"])


@dataclass
class Choice:
    """The recommended row, and which meeting leaves were passed over because another beats them."""

    row: dict[str, Any] | None
    beaten: dict[str, str] = field(default_factory=dict)  # leaf -> the leaf that beats it on every axis

    def why(self, quality: str = "accuracy") -> str:
        if not self.beaten:
            return ""
        shown = [f"{leaf} (beaten by {by})" for leaf, by in sorted(self.beaten.items(), key=lambda kv: kv[0])]
        return (f"; passed over as another meeting leaf has at least its {quality}, flash and latency and is "
                "better on one: " + ", ".join(shown))


def choose(meeting: Sequence[dict[str, Any]], *, cycles_first: bool = False) -> Choice:
    """The least-optimized leaf among ``meeting`` that no other leaf of ``meeting`` dominates (ties within a level:
    see :func:`_order`)."""
    if not meeting:
        return Choice(None)
    points = {id(r): objectives(r) for r in meeting}
    beaten: dict[str, str] = {}
    front = []
    for r in meeting:
        better = [o for o in meeting if o is not r and dominates(points[id(o)], points[id(r)])]
        if better:
            beaten[r["leaf"]] = min(better, key=lambda o: _order(o, cycles_first))["leaf"]
        else:
            front.append(r)
    def order(row: Mapping[str, Any]) -> tuple:
        return _order(row, cycles_first)

    best = min(front, key=order)
    # only leaves the walk would have taken before the chosen one are worth naming
    passed = {leaf: by for leaf, by in beaten.items()
              if order(next(r for r in meeting if r["leaf"] == leaf)) < order(best)}
    return Choice(best, passed)
