"""A leaf judged on every target at once, as a walk through the tree judges it.

A walk stops at the first level with a leaf that meets every requirement on every target. From the report of the
leaves walked so far: each leaf's verdict per target (:func:`judge_leaves`), whether it meets everywhere, the leaf
to recommend among those that do (:func:`pick`: the least-optimized one that no other meeting leaf beats on
quality, flash and cycles on every target at once), and, when none does, the leaf that comes closest to each
requirement no leaf meets on every target (:func:`shortfalls`, measured on its worst target).
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

from edgedeploy.report.levels import leaf_level
from .pareto import least_optimized, objectives
from .shortfall import closest_misses, miss_entry, shortfall

# what a verdict keeps of each requirement check
_KEPT = ("met", "value", "limit", "unit", "excess", "excess_pct", "why")


def _check_cell(check: Mapping[str, Any]) -> dict[str, Any]:
    return {k: check[k] for k in _KEPT if k in check and check[k] is not None or k == "met"}


def judge_leaves(doc: Mapping[str, Any], leaves: Sequence[str], targets: Sequence[str]) -> dict[str, dict[str, Any]]:
    """Each leaf's verdict per target: meets (True/False; None without requirements) and each requirement."""
    rows = {(r["leaf"], r["target"]): r for r in doc["rows"]}
    out: dict[str, dict[str, Any]] = {}
    for leaf in leaves:
        per_target = {}
        for t in targets:
            row = rows.get((leaf, t))
            if row is None:
                per_target[t] = {"meets": False, "why": f"{leaf} was not compiled for {t}", "requirements": {}}
                continue
            checks = row.get("requirements") or {}
            per_target[t] = {"meets": row.get("meets_requirements"),
                             "requirements": {n: _check_cell(c) for n, c in checks.items()}}
            if row.get("over_reference"):  # costs more than ptq there (cycles or flash), with the layers why
                per_target[t]["over_reference"] = row["over_reference"]["text"]
        out[leaf] = per_target
    return out


def meets_everywhere(verdict: Mapping[str, Any]) -> bool:
    """Whether a leaf's verdict (:func:`judge_leaves`) meets, or has nothing to meet, on every target."""
    return all(v["meets"] in (True, None) for v in verdict.values())


def pick(doc: Mapping[str, Any], meeting: Sequence[str], targets: Sequence[str]) -> tuple[str, dict[str, str]]:
    """The least-optimized meeting leaf that no other meeting leaf beats on quality, flash and cycles on every
    target at once (within a level the better quality on the first target, then the walk's order); and the
    leaves passed over, each with a leaf that beats it."""
    rows = {(r["leaf"], r["target"]): r for r in doc["rows"]}
    points = {leaf: tuple(x for t in targets for x in objectives(rows[(leaf, t)])) for leaf in meeting}
    order = {leaf: (leaf_level(leaf), points[leaf][0], i) for i, leaf in enumerate(meeting)}
    best, passed = least_optimized(meeting, points.__getitem__, order.__getitem__)
    return best, dict(passed)


def shortfalls(verdicts: Mapping[str, Mapping[str, Any]]) -> list[dict[str, Any]]:
    """For each requirement no walked leaf meets on every target: the leaf that comes closest, and by how much
    it misses (its worst target)."""
    names = sorted({n for v in verdicts.values() for t in v.values() for n in t["requirements"]})
    worst: dict[tuple[str, str], tuple[str | None, Mapping[str, Any]]] = {}
    for leaf, per_target in verdicts.items():
        for name in names:
            checks = [(t, v["requirements"].get(name)) for t, v in per_target.items()]
            if not checks:  # judged on no target: nothing to miss
                worst[(leaf, name)] = (None, {"met": True})
            elif all(c is not None for _, c in checks):  # the first of its worst targets
                worst[(leaf, name)] = max(checks, key=lambda tc: shortfall(tc[1]))

    def check_of(leaf: str, name: str) -> Mapping[str, Any] | None:
        return worst[(leaf, name)][1] if (leaf, name) in worst else None

    position = {leaf: i for i, leaf in enumerate(verdicts)}
    return [miss_entry(name, check, leaf, worst[(leaf, name)][0]) for name, leaf, check in
            closest_misses(names, list(verdicts), check_of, position.__getitem__)]
