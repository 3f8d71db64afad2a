"""Requirement checks on report rows: each limit the user gave against the row's value, the board's memory, and
the palette leaves' size budgets; requirements given as command-line options."""

from __future__ import annotations

from typing import Any, Mapping

from edgedeploy.config.requirements import REQUIREMENTS, check_requirements
from edgedeploy.core.manifest import Manifest
from edgedeploy.core.units import fmt_bytes, fmt_in_unit
from edgedeploy.errors import UsageError
from edgedeploy.report.levels import REFERENCE_LEAF
from ..columns import metric_label, value_of
from ..limits import Requirements

# Requirement -> (row value, sign applied to it, unit, label): a requirement holds when sign * value <= limit.
REQUIREMENT_VALUES = {name: (r.column, r.sign, r.symbol, r.label.format(reference=REFERENCE_LEAF))
                      for name, r in REQUIREMENTS.items()}
# Requirements a leaf's convert stage answers without a target: its int8 accuracy or task-metric drop.
TARGET_FREE = ("max_accuracy_drop", "max_metric_drop")
NOT_COMPILED = "not compiled for a target"


def requirements_from_options(**limits: Any) -> Requirements:
    """Requirements given as command-line options, by name (``max_flash="32KiB"``: sizes as text or bytes; None:
    not given), checked by :func:`edgedeploy.config.requirements.check_requirements` like those of a project
    file; a bad value or an unknown name raises :class:`~edgedeploy.errors.UsageError` naming its flag."""
    given = check_requirements(limits, "--{flag}", UsageError)
    return Requirements(**given, sources=("command line",) if given else ())


def check_row(row: dict[str, Any], req: Requirements) -> None:
    """Each requirement given, and the board's memory, checked on one compiled row: ``row["requirements"]``
    (name -> label, limit, value, unit, met, and how far it misses) and ``row["meets_requirements"]`` (None
    without any check)."""
    checks: dict[str, dict[str, Any]] = {}
    for name, limit in req.given().items():
        key, sign, unit, label = REQUIREMENT_VALUES[name]
        cell = row["values"].get(key) or {"value": None, "unavailable": "the leaf is judged by accuracy"}
        if name == "max_metric_drop" and cell.get("metric"):  # named after the leaf's metric, in its unit
            unit, label = cell.get("unit") or "", f"int8 {metric_label(cell['metric'])} drop vs {REFERENCE_LEAF}"
        value = None if value_of(cell) is None else sign * value_of(cell)
        check: dict[str, Any] = {"label": f"{label} ≤ {fmt_in_unit(limit, unit)}", "limit": limit, "value": value,
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


def judge_uncompiled(row: dict[str, Any], req: Requirements) -> None:
    """A leaf compiled for no target (``report`` after ``optimize`` alone): judge what needs no target (the
    accuracy or metric drop) and mark the rest not compiled. ``meets_requirements`` is False when a judged
    requirement is missed, None while one waits for a compile, True when every requirement given is met."""
    check_row(row, req)
    checks = row["requirements"]
    for name in [n for n in checks if n not in TARGET_FREE]:
        checks[name] = {k: checks[name][k] for k in ("label", "limit", "unit")} | {
            "value": None, "met": None, "why": NOT_COMPILED}
    mets = [c["met"] for c in checks.values()]
    row["meets_requirements"] = (None if not checks or (None in mets and False not in mets)
                                 else False not in mets)


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
        note = (f"{r['leaf']} on {r['target']}: {fmt_bytes(mine)} of NPU-encoded weights, {fmt_bytes(mine - limit)} "
                f"over its size budget ({size['size_budget']:g} x ptq's {fmt_bytes(size['reference_encoded_bytes'])}); "
                f"its plan had {fmt_bytes(size['encoded_bytes'])} as the sweep encoded them, and {why}")
        r["warnings"].append(note)
        notes.append(note)
    return notes
