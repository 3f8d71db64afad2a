"""Quality, the objectives to minimise, dominance, the Pareto front, and the orders that rank leaves.

A row is a report row: ``{"leaf", "level", "values": {key: {"value": ...}}, ...}``. Its objectives are its int8
quality (negated: every objective is minimised), the compiled model's bytes (flash) and its NPU cycles (latency on
one target); a missing one counts as the worst. One leaf dominates another when it is no worse on every objective
and better on one. Among items no other item dominates, :func:`least_optimized` takes the one an order ranks
first: the lowest tree level, then the best quality, then the smaller flash.
"""

from __future__ import annotations

import math
from typing import Any, Callable, Mapping, Sequence, TypeVar

from edgedeploy.report.levels import REFERENCE_LEAF, leaf_level
from ..columns import quality_name, value_of

ACCURACY = "int8_accuracy_pct"
METRIC = "int8_metric"
METRIC_DROP = "int8_metric_drop"
FLASH = "compiled_model_bytes"
CYCLES = "total_cycles"

T = TypeVar("T")


def _value(row: Mapping[str, Any], key: str) -> Any:
    cell = row["values"].get(key)
    return None if cell is None else cell.get("value")


def quality(row: Mapping[str, Any]) -> float | None:
    """How good the leaf's int8 model is within its run, higher better: its accuracy, else minus its metric's drop
    against ``ptq`` (a regression or reconstruction task, whatever the metric's direction)."""
    acc = _value(row, ACCURACY)
    if acc is not None:
        return float(acc)
    drop = _value(row, METRIC_DROP)
    return None if drop is None else -float(drop)


def quality_across_models(row: Mapping[str, Any]) -> float | None:
    """How good the leaf's int8 model is against other models' leaves, higher better: its accuracy, else its
    metric signed by the metric's direction (models have no common ``ptq`` to measure a drop against)."""
    acc = _value(row, ACCURACY)
    if acc is not None:
        return float(acc)
    cell = row["values"].get(METRIC) or {}
    if cell.get("value") is None:
        return None
    return float(cell["value"]) if cell.get("higher_is_better", True) else -float(cell["value"])


def objectives(row: Mapping[str, Any],
               of: Callable[[Mapping[str, Any]], float | None] = quality) -> tuple[float, float, float]:
    """(-quality, flash, cycles), each to be minimised, quality measured by ``of``; a missing one counts as the
    worst."""
    q = of(row)
    flash, cycles = _value(row, FLASH), _value(row, CYCLES)
    return (math.inf if q is None else -float(q),
            math.inf if flash is None else float(flash),
            math.inf if cycles is None else float(cycles))


def dominates(a: Sequence[float], b: Sequence[float]) -> bool:
    """``a`` is no worse than ``b`` on every objective and better on at least one."""
    return all(x <= y for x, y in zip(a, b)) and any(x < y for x, y in zip(a, b))


def undominated(items: Sequence[T], point: Callable[[T], Sequence[float]]) -> list[T]:
    """The items whose point no other item's point dominates (equal points both stay), in their order."""
    points = [point(x) for x in items]
    return [x for i, x in enumerate(items)
            if not any(dominates(q, points[i]) for j, q in enumerate(points) if j != i)]


def pareto_front(points: Mapping[str, tuple[float, ...]]) -> set[str]:
    """Names of the points no other point dominates; every objective is to be minimised."""
    return set(undominated(list(points), points.__getitem__))


def least_optimized(items: Sequence[T], point: Callable[[T], Sequence[float]],
                    order: Callable[[T], Any]) -> tuple[T, list[tuple[T, T]]]:
    """The item ``order`` ranks first among those no other item dominates; and the items passed over for it,
    those another item dominates that ``order`` ranks before the chosen one, each with the first-ranked item
    that dominates it."""
    points = [point(x) for x in items]
    front: list[T] = []
    beaten: list[tuple[T, T]] = []
    for i, x in enumerate(items):
        better = [o for j, o in enumerate(items) if j != i and dominates(points[j], points[i])]
        if better:
            beaten.append((x, min(better, key=order)))
        else:
            front.append(x)
    best = min(front, key=order)
    return best, [(x, by) for x, by in beaten if order(x) < order(best)]


def level_key(level: int | None) -> tuple[bool, int]:
    """Tree leaves by level, least optimized first; a variant that is not a tree leaf (an import) after them."""
    return (level is None, level if level is not None else 0)


def leaf_rank(name: str) -> tuple:
    """A leaf name's place: its tree level, then its name."""
    return (*level_key(leaf_level(name)), name)


def rank(row: Mapping[str, Any], cycles_first: bool = False) -> tuple:
    """Least-optimized level first, then the best quality, then the smaller flash (or, with ``cycles_first``, a
    latency requirement given, the fewer NPU cycles before the smaller flash)."""
    q, flash, cycles = objectives(row)
    return (*level_key(row.get("level")), q, *((cycles, flash) if cycles_first else (flash,)), row["leaf"])


def pair_rank(row: Mapping[str, Any]) -> tuple:
    """A (model, leaf) row of a sweep: least-optimized level first, then the best quality across models, the
    smaller flash, the fewer cycles."""
    q, flash, cycles = objectives(row, quality_across_models)
    return (*level_key(row.get("level")), q, flash, cycles, row["model"], row["leaf"])


def pareto_of_target(rows: list[dict[str, Any]], target: str) -> dict[str, Any]:
    """The report's Pareto front of one target's compiled rows (quality against flash against total cycles;
    flash against cycles alone when no leaf has a quality); marks each row's ``pareto``."""
    compiled = [r for r in rows
                if value_of(r["values"][FLASH]) is not None and value_of(r["values"][CYCLES]) is not None]
    with_acc = [r for r in compiled if quality(r) is not None]
    if with_acc:
        by_metric = all(value_of(r["values"][ACCURACY]) is None for r in with_acc)
        axes = ["int8_metric_drop (min)" if by_metric else "int8_accuracy_pct (max)",
                "compiled_model_bytes (min)", "total_cycles (min)"]
        pts: dict[str, tuple[float, ...]] = {r["leaf"]: objectives(r) for r in with_acc}
        what = "accuracy" if not by_metric else f"int8 {quality_name(with_acc)} drop vs {REFERENCE_LEAF}"
        note = f"{what} against flash against total cycles"
        missing = [r for r in compiled if r not in with_acc]
        for r in missing:
            r["pareto"] = None
            r["pareto_note"] = f"unavailable: no {what} for this leaf"
        if missing:
            note += f"; {len(missing)} leaf(s) without an {what} left out"
    else:
        axes = ["compiled_model_bytes (min)", "total_cycles (min)"]
        pts = {r["leaf"]: (value_of(r["values"][FLASH]), value_of(r["values"][CYCLES])) for r in compiled}
        judged_by = ("a measured accuracy" if not any(METRIC in r["values"] for r in compiled)
                     else f"an int8 {quality_name(compiled)} drop vs {REFERENCE_LEAF}")
        note = f"flash against total cycles only: no leaf has {judged_by}"
    front = pareto_front(pts)
    for r in compiled:
        if r["leaf"] in pts:
            r["pareto"] = r["leaf"] in front
    return {"target": target, "objectives": axes, "front": sorted(front, key=leaf_rank), "note": note}
