"""Which compiled leaf to recommend for one target: never one that another leaf beats on every axis.

The axes are the leaf's int8 quality (:func:`.pareto.quality`), the compiled model's bytes (flash) and its NPU
cycles (latency on one target). Among the leaves that meet the requirements, the ones no other meeting leaf
dominates form the candidates, and the least-optimized of them (lowest tree level, then the best quality, then
the smaller flash) is recommended. A leaf that meets the requirements is never passed over for one that does
not: a leaf beaten only by leaves that miss a requirement (e.g. SRAM) stays a candidate. When no leaf meets them
all, the recommendation names, for each requirement no leaf meets, the leaf that misses it least, and the leaf
closest to meeting them all.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

from ..columns import quality_name, value_of
from ..limits import Requirements
from .pareto import CYCLES, FLASH, least_optimized, objectives, quality, rank
from .shortfall import closest_misses, describe_miss, miss_entry, shortfall


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
    see :func:`.pareto.rank`); only the leaves ranked before it are named as passed over."""
    if not meeting:
        return Choice(None)
    best, passed = least_optimized(meeting, objectives, lambda row: rank(row, cycles_first))
    return Choice(best, {row["leaf"]: by["leaf"] for row, by in passed})


def recommend(rows: list[dict[str, Any]], target: str, req: Requirements) -> dict[str, Any]:
    """The recommendation for ``target`` among its judged rows (:func:`.checks.check_row`): the least-optimized
    leaf meeting the requirements that no other meeting leaf beats on quality, flash and latency at once; in a
    level the best quality, then (with a latency requirement, the fewest cycles, then) the smallest flash.
    Marks the chosen row ``recommended``."""
    candidates = [r for r in rows if value_of(r["values"][CYCLES]) is not None]
    base = {"target": target, "requirements": req.given()}
    if not candidates:
        return {**base, "leaf": None, "met": False, "judged": False,
                "message": f"no leaf was compiled for {target}; nothing to recommend",
                "unmet": []}
    meeting = [r for r in candidates if r["meets_requirements"] in (True, None)]
    if not meeting:
        return {**base, **_nothing_meets(candidates, target, req)}
    groups: dict[Any, list[dict[str, Any]]] = {}
    for r in candidates:
        groups.setdefault(r["level"], []).append(r)
    choice = choose(meeting, cycles_first=req.max_latency_ms is not None)
    what_quality = quality_name(candidates)  # "accuracy", or the task metric the leaves are judged by ("MSE")
    best = choice.row
    assert best is not None  # (there are meeting leaves)
    level = best["level"]
    best["recommended"] = True
    names = ", ".join(sorted(r["leaf"] for r in groups[level]))
    what = ", ".join(c["label"] for c in best["requirements"].values()) or "no requirements set"
    if level is None:
        why = f"not a leaf of the deployment tree (an imported model); meets: {what}"
    else:
        why = (f"level {level} ({names}) is the least-optimized level with a leaf meeting every "
               f"requirement ({what}) that no other such leaf beats on {what_quality}, flash and latency at once")
    if len(groups[level]) > 1:
        why += (f"; chosen within the level for the best int8 {what_quality}, then "
                + ("the fewest cycles, then " if req.max_latency_ms is not None else "") + "the smallest flash")
    why += choice.why(what_quality)
    if best.get("over_reference"):
        why += f"; but {best['over_reference']['text']}"
    return {**base, "leaf": best["leaf"], "level": level, "met": True, "judged": True,
            "passed_over": choice.beaten,
            "message": f"{target}: recommend {best['leaf']} — {why}", "unmet": []}


def _nothing_meets(candidates: list[dict[str, Any]], target: str, req: Requirements) -> dict[str, Any]:
    """No leaf meets everything: which requirement no leaf meets and by how much, and the closest leaf."""

    def preference(r: Mapping[str, Any]) -> tuple:
        acc = quality(r)
        # with a latency requirement, fewer cycles come before a smaller flash
        cycles = value_of(r["values"][CYCLES]) if req.max_latency_ms is not None else 0
        return (-(acc if acc is not None else -math.inf), cycles or 0, value_of(r["values"][FLASH]), r["leaf"])

    names = sorted({n for r in candidates for n in r["requirements"]})
    unmet = [miss_entry(name, check, r["leaf"]) for name, r, check in
             closest_misses(names, candidates, lambda r, n: r["requirements"].get(n), preference)]
    closest = min(candidates, key=lambda r: (sum(shortfall(c) for c in r["requirements"].values()), preference(r)))
    misses = [describe_miss(n, c, closest["leaf"]) for n, c in closest["requirements"].items() if c["met"] is not True]
    if unmet:
        message = f"{target}: no leaf meets " + "; ".join(u["text"] for u in unmet)
    else:
        message = (f"{target}: each requirement is met by some leaf but no leaf meets all of them; closest is "
                   f"{closest['leaf']}, which misses " + "; ".join(misses))
    return {"leaf": None, "met": False, "judged": True, "closest_leaf": closest["leaf"],
            "closest_misses": misses, "message": message, "unmet": unmet}


def unmet_targets(doc: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Recommendations where leaves were judged and none met the requirements."""
    return [r for r in doc["recommendations"].values() if r.get("judged") and not r.get("met")]
