"""Judging the collected rows: Pareto front, requirements, recommendation, size budgets."""

from __future__ import annotations

import math
from typing import Any, Mapping

from edgedeploy.core.manifest import Manifest
from edgedeploy.report.levels import REFERENCE_LEAF, leaf_level
from .columns import metric_label, quality_name, value_of
from .limits import Requirements


def _quality(r: Mapping[str, Any]) -> float | None:
    """How good a row's int8 model is, higher better: its accuracy, else minus its metric drop vs ptq."""
    acc = value_of(r["values"]["int8_accuracy_pct"])
    if acc is not None:
        return acc
    drop = value_of(r["values"].get("int8_metric_drop"))
    return None if drop is None else -drop


def pareto_front(points: Mapping[str, tuple[float, ...]]) -> set[str]:
    """Names of the points no other point dominates; every objective is to be minimised."""
    front = set()
    for name, p in points.items():
        dominated = any(
            all(a <= b for a, b in zip(q, p)) and any(a < b for a, b in zip(q, p))
            for other, q in points.items()
            if other != name
        )
        if not dominated:
            front.add(name)
    return front


def _pareto(rows: list[dict[str, Any]], target: str) -> dict[str, Any]:
    compiled = [r for r in rows if value_of(r["values"]["compiled_model_bytes"]) is not None
                and value_of(r["values"]["total_cycles"]) is not None]
    with_acc = [r for r in compiled if _quality(r) is not None]
    if with_acc:
        by_metric = all(value_of(r["values"]["int8_accuracy_pct"]) is None for r in with_acc)
        objectives = ["int8_metric_drop (min)" if by_metric else "int8_accuracy_pct (max)",
                      "compiled_model_bytes (min)", "total_cycles (min)"]
        pts = {r["leaf"]: (-_quality(r), value_of(r["values"]["compiled_model_bytes"]),
                           value_of(r["values"]["total_cycles"])) for r in with_acc}
        quality = "accuracy" if not by_metric else f"int8 {quality_name(with_acc)} drop vs {REFERENCE_LEAF}"
        note = f"{quality} against flash against total cycles"
        missing = [r for r in compiled if r not in with_acc]
        for r in missing:
            r["pareto"] = None
            r["pareto_note"] = f"unavailable: no {quality} for this leaf"
        if missing:
            note += f"; {len(missing)} leaf(s) without an {quality} left out"
    else:
        objectives = ["compiled_model_bytes (min)", "total_cycles (min)"]
        pts = {r["leaf"]: (value_of(r["values"]["compiled_model_bytes"]), value_of(r["values"]["total_cycles"]))
               for r in compiled}
        judged_by = ("a measured accuracy" if not any("int8_metric" in r["values"] for r in compiled)
                     else f"an int8 {quality_name(compiled)} drop vs {REFERENCE_LEAF}")
        note = f"flash against total cycles only: no leaf has {judged_by}"
    front = pareto_front(pts)
    for r in compiled:
        if r["leaf"] in pts:
            r["pareto"] = r["leaf"] in front
    return {"target": target, "objectives": objectives, "front": sorted(front, key=lambda n: _leaf_order(n)),
            "note": note}


def _leaf_order(name: str) -> tuple:
    level = leaf_level(name)
    return (level is None, level if level is not None else 0, name)


# Requirement -> (row value, sign applied to it, unit, label): a requirement holds when sign * value <= limit.
REQUIREMENT_VALUES = {
    "max_accuracy_drop": ("int8_accuracy_delta_pts", -1, "pts", f"int8 accuracy drop vs {REFERENCE_LEAF}"),
    "max_metric_drop": ("int8_metric_drop", 1, "", f"int8 metric drop vs {REFERENCE_LEAF}"),
    "max_flash": ("compiled_model_bytes", 1, "B", "flash (compiled model)"),
    "max_sram": ("sram_bytes", 1, "B", "SRAM"),
    "max_latency_ms": ("latency_ms", 1, "ms", "latency"),
    "max_npu_cycles": ("npu_cycles", 1, "cycles", "NPU cycles"),
}


def _check_requirements(row: dict[str, Any], req: Requirements) -> None:
    checks: dict[str, dict[str, Any]] = {}
    for name, limit in req.given().items():
        key, sign, unit, label = REQUIREMENT_VALUES[name]
        cell = row["values"].get(key) or {"value": None, "unavailable": "the leaf is judged by accuracy"}
        if name == "max_metric_drop" and cell.get("metric"):  # named after the leaf's metric, in its unit
            unit, label = cell.get("unit") or "", f"int8 {metric_label(cell['metric'])} drop vs {REFERENCE_LEAF}"
        value = None if value_of(cell) is None else sign * value_of(cell)
        check: dict[str, Any] = {"label": f"{label} ≤ {fmt_limit(limit, unit)}", "limit": limit, "value": value,
                                 "unit": unit}
        if value is None:
            check.update(met=None, why=f"cannot be judged: {cell.get('unavailable', 'unavailable')}")
        else:
            met = value <= limit
            check["met"] = met
            if not met:
                check["excess"] = value - limit
                check["excess_pct"] = 100.0 * (value - limit) / limit if limit else None
        checks[name] = check
    fit = row["fit"]
    if fit["applies"]:
        checks["fits_board"] = {"label": f"fits {row['target']}", "met": fit["fits"], "why": fit["note"],
                                "unit": "", "limit": None, "value": None}
        if fit["fits"] is False:
            over = [
                (fit["sram_needed_bytes"] or 0) - fit["board_sram_bytes"],
                (fit["flash_needed_bytes"] or 0) - fit["board_flash_bytes"],
            ]
            checks["fits_board"]["excess"] = max(o for o in over if o > 0)
            checks["fits_board"]["unit"] = "B"
    row["requirements"] = checks
    row["meets_requirements"] = all(c["met"] is True for c in checks.values()) if checks else None


# Requirements a leaf's convert stage answers without a target: its int8 accuracy or task-metric drop.
TARGET_FREE = ("max_accuracy_drop", "max_metric_drop")
NOT_COMPILED = "not compiled for a target"


def judge_uncompiled(row: dict[str, Any], req: Requirements) -> None:
    """A leaf compiled for no target (``report`` after ``optimize`` alone): judge what needs no target (the
    accuracy or metric drop) and mark the rest not compiled. ``meets_requirements`` is False when a judged
    requirement is missed, None while one waits for a compile, True when every requirement given is met."""
    _check_requirements(row, req)
    checks = row["requirements"]
    for name in [n for n in checks if n not in TARGET_FREE]:
        checks[name] = {k: checks[name][k] for k in ("label", "limit", "unit")} | {
            "value": None, "met": None, "why": NOT_COMPILED}
    mets = [c["met"] for c in checks.values()]
    row["meets_requirements"] = (None if not checks or (None in mets and False not in mets)
                                 else False not in mets)


def _shortfall(check: Mapping[str, Any]) -> float:
    """How far a requirement is missed, relative to its limit (inf when it cannot be judged)."""
    if check["met"] is True:
        return 0.0
    if check["met"] is None:
        return math.inf
    limit = check.get("limit")
    excess = check.get("excess") or 0.0
    return excess / limit if limit else excess


def _describe_miss(name: str, check: Mapping[str, Any], leaf: str) -> str:
    if check["met"] is None:
        return f"{name}: {leaf} {check.get('why', 'cannot be judged')}"
    if name == "fits_board":
        return f"{name}: {leaf} does not fit ({check['why']})"
    unit = check["unit"]
    pct = check.get("excess_pct")
    return (
        f"{name} {fmt_limit(check['limit'], unit)}: closest is {leaf} with {fmt_limit(check['value'], unit)}, "
        f"over by {fmt_limit(check['excess'], unit)}" + (f" ({pct:.1f}%)" if pct is not None else "")
    )


def fmt_limit(v: Any, unit: str) -> str:
    if v is None:
        return "n/a"
    if unit == "B":
        return f"{int(round(v)):,} B"
    if unit == "ms":
        return f"{v:.4g} ms"
    if unit == "pts":
        return f"{v:.2f} pts"
    if unit == "cycles":
        return f"{int(round(v)):,} cycles"
    return f"{v:g} {unit}".strip()


def _recommend(rows: list[dict[str, Any]], target: str, req: Requirements) -> dict[str, Any]:
    """The least-optimized leaf meeting the requirements that no other meeting leaf beats on accuracy, flash and
    latency at once (:mod:`edgedeploy.recommend`); in a level prefer accuracy, then smaller flash."""
    candidates = [r for r in rows if value_of(r["values"]["total_cycles"]) is not None]
    base = {"target": target, "requirements": req.given()}
    if not candidates:
        return {**base, "leaf": None, "met": False, "judged": False,
                "message": f"no leaf was compiled for {target}; nothing to recommend",
                "unmet": []}
    groups: dict[Any, list[dict[str, Any]]] = {}
    for r in candidates:
        groups.setdefault(r["level"], []).append(r)

    def preference(r: dict[str, Any]) -> tuple:
        acc = _quality(r)
        # with a latency requirement, fewer cycles come before a smaller flash
        cycles = value_of(r["values"]["total_cycles"]) if req.max_latency_ms is not None else 0
        return (-(acc if acc is not None else -math.inf), cycles or 0, value_of(r["values"]["compiled_model_bytes"]),
                r["leaf"])

    meeting = [r for r in candidates if r["meets_requirements"] in (True, None)]
    if meeting:  # the least-optimized meeting leaf that no other meeting leaf beats on every axis
        from .recommend import choose

        choice = choose(meeting, cycles_first=req.max_latency_ms is not None)
        quality = quality_name(candidates)  # "accuracy", or the task metric the leaves are judged by ("MSE")
        best, level = choice.row, choice.row["level"]
        best["recommended"] = True
        names = ", ".join(sorted(r["leaf"] for r in groups[level]))
        what = ", ".join(c["label"] for c in best["requirements"].values()) or "no requirements set"
        if level is None:
            why = f"not a leaf of the deployment tree (an imported model); meets: {what}"
        else:
            why = (f"level {level} ({names}) is the least-optimized level with a leaf meeting every "
                   f"requirement ({what}) that no other such leaf beats on {quality}, flash and latency at once")
        if len(groups[level]) > 1:
            why += (f"; chosen within the level for the best int8 {quality}, then "
                    + ("the fewest cycles, then " if req.max_latency_ms is not None else "") + "the smallest flash")
        why += choice.why(quality)
        return {**base, "leaf": best["leaf"], "level": level, "met": True, "judged": True,
                "passed_over": choice.beaten,
                "message": f"{target}: recommend {best['leaf']} — {why}", "unmet": []}
    # Nothing meets everything: say which requirement nothing meets, and by how much.
    names = sorted({n for r in candidates for n in r["requirements"]})
    unmet = []
    for name in names:
        checks = [(r, r["requirements"][name]) for r in candidates if name in r["requirements"]]
        if any(c["met"] is True for _, c in checks):
            continue
        r, c = min(checks, key=lambda rc: (_shortfall(rc[1]), preference(rc[0])))
        unmet.append({"requirement": name, "closest_leaf": r["leaf"], "limit": c.get("limit"),
                      "value": c.get("value"), "excess": c.get("excess"), "excess_pct": c.get("excess_pct"),
                      "unit": c.get("unit"), "text": _describe_miss(name, c, r["leaf"])})
    closest = min(candidates, key=lambda r: (sum(_shortfall(c) for c in r["requirements"].values()), preference(r)))
    misses = [_describe_miss(n, c, closest["leaf"]) for n, c in closest["requirements"].items() if c["met"] is not True]
    if unmet:
        message = f"{target}: no leaf meets " + "; ".join(u["text"] for u in unmet)
    else:
        message = (f"{target}: each requirement is met by some leaf but no leaf meets all of them; closest is "
                   f"{closest['leaf']}, which misses " + "; ".join(misses))
    return {**base, "leaf": None, "met": False, "judged": True, "closest_leaf": closest["leaf"],
            "closest_misses": misses, "message": message, "unmet": unmet}


def size_budget_misses(manifest: Manifest, rows: list[dict[str, Any]]) -> list[str]:
    """Palette leaves whose compiled weights exceed the ``[palette] size_budget`` their sweep planned for.

    The sweep plans bytes before palette QAT, which moves them a little (it changes how often each palette
    value occurs: -128 to +64 bytes of 9,568 over nine DS-CNN runs). Each miss is added to its row's warnings
    and returned as a note.
    """
    from edgedeploy.config.recipe import LEAVES, nodes_for

    sweeps = {rec.variant: rec.details["sweep"] for rec in manifest.records.values()
              if rec.stage == "optimize" and rec.variant and isinstance(rec.details.get("sweep"), Mapping)
              and rec.details["sweep"].get("size")}
    notes = []
    for r in rows:
        leaf_node = LEAVES.get(r["leaf"])
        node = next((n for n in reversed(nodes_for([r["leaf"]])) if n in sweeps), None) if leaf_node else None
        if node is None or r["target"] != sweeps[node].get("target") or not sweeps[node]["size"].get("fits", True):
            continue  # (a plan that could not fit was reported by its optimize stage)
        size, mine = sweeps[node]["size"], value_of(r["values"].get("encoded_weights_bytes"))
        limit = int(float(size["size_budget"]) * int(size["reference_encoded_bytes"]))
        if mine is None or mine <= limit:
            continue
        why = ("palette QAT then moved them; lower [palette] size_budget a little, or take the plan's PTQ leaf "
               f"{node}, which keeps them" if leaf_node != node else "this compile's Vela settings encode them "
               "differently from the sweep's")
        note = (f"{r['leaf']} on {r['target']}: {mine:,} B of NPU-encoded weights, {mine - limit:,} B over its size "
                f"budget ({size['size_budget']:g} x ptq's {int(size['reference_encoded_bytes']):,} B); its plan "
                f"had {int(size['encoded_bytes']):,} B as the sweep encoded them, and {why}")
        r["warnings"].append(note)
        notes.append(note)
    return notes


def unmet_targets(doc: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Recommendations where leaves were judged and none met the requirements."""
    return [r for r in doc["recommendations"].values() if r.get("judged") and not r.get("met")]
