"""Leaves that cost more than the reference leaf (``ptq``) on a target: more NPU cycles, a larger compiled model, or
more operators left to the CPU (their time is in no NPU cycle count: a fake quantization that the int8 converter
keeps as a float DEQUANTIZE/QUANTIZE pair).

Every leaf of the tree starts from the same float model as ``ptq`` and only removes work (zeros, fewer distinct
weights, fewer channels) or trains ranges, so where nothing else changed no leaf should cost more than ``ptq``. One
that does is flagged on its row (``over_reference``) with the layers that account for it: its Vela per-layer
estimate is aligned with ``ptq``'s by operator, and the operators ``ptq`` has no match for (e.g. an input scaling
left as a MUL) and those that take more cycles than their match are named, largest first, until they cover the
excess; the CPU operators ``ptq`` does not have are named (the JSON has Vela's reason). A leaf over on cycles or flash
cannot beat ``ptq``, so where ``ptq`` meets the requirements it is never recommended over it; where a flagged
leaf is recommended, its recommendation says what it costs.
Pure functions of report rows and recorded per-layer facts.
"""

from __future__ import annotations

import difflib
from typing import Any, Mapping, Sequence

from edgedeploy.core.units import fmt_count

from edgedeploy.report.levels import REFERENCE_LEAF
from ..columns import value_of
from .pareto import FLASH

NPU_CYCLES = "npu_cycles"
CPU_OPERATORS = "cpu_operators"
WHAT = {NPU_CYCLES: "NPU cycles", FLASH: "compiled model bytes", CPU_OPERATORS: "operators on the CPU"}
MAX_NAMED = 5  # layers named for one excess; the rest are counted


def _name(layer: Mapping[str, Any]) -> str:
    return str(layer.get("name") or "?").split(";")[-1]


def excess_layers(layers: Sequence[Mapping[str, Any]], reference: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The layers of ``layers`` (:func:`edgedeploy.vela.compute.layer_bounds` entries) that cost more NPU cycles
    than ``reference``'s: each with its cycles, its match's (None: no match) and the difference, largest first."""
    ops = [str(layer.get("operator")) for layer in layers]
    ref_ops = [str(layer.get("operator")) for layer in reference]
    matched: dict[int, int] = {}
    for block in difflib.SequenceMatcher(a=ops, b=ref_ops, autojunk=False).get_matching_blocks():
        for k in range(block.size):
            matched[block.a + k] = block.b + k
    out = []
    for i, layer in enumerate(layers):
        mine = int(layer.get("npu_cycles") or 0)
        theirs = int(reference[matched[i]].get("npu_cycles") or 0) if i in matched else None
        extra = mine - (theirs or 0)
        if extra > 0:
            out.append({"layer": _name(layer), "operator": layer.get("operator"), "npu_cycles": mine,
                        "reference_npu_cycles": theirs, "extra_cycles": extra})
    return sorted(out, key=lambda e: -e["extra_cycles"])


def _accounting(extra: list[dict[str, Any]], excess: float) -> list[dict[str, Any]]:
    """The fewest layers of ``extra`` (largest first) whose extra cycles cover ``excess``, at most MAX_NAMED."""
    named, total = [], 0
    for entry in extra[:MAX_NAMED]:
        named.append(entry)
        total += entry["extra_cycles"]
        if total >= excess:
            break
    return named


def describe_layers(named: Sequence[Mapping[str, Any]], reference: str = REFERENCE_LEAF) -> str:
    return ", ".join(f"{e['operator']} {e['layer']} (+{fmt_count(e['extra_cycles'], 'cycles')}"
                     + (f", not in {reference})" if e["reference_npu_cycles"] is None else ")") for e in named)


def flag_over_reference(rows: list[dict[str, Any]], layers: Mapping[tuple[str, str], Sequence[Mapping[str, Any]]],
                        reference: str = REFERENCE_LEAF) -> list[str]:
    """Set each compiled row's ``over_reference``: None, or what of its NPU cycles, compiled bytes and CPU
    operators exceeds ``reference``'s on the same target and the layers that account for the cycles (``layers``:
    per (leaf, target) the per-layer facts). Returns one note per flagged row."""
    notes = []
    refs = {r["target"]: r for r in rows if r["leaf"] == reference and r["target"]}
    for r in rows:
        ref = refs.get(r["target"])
        if not r["target"] or r["leaf"] == reference or ref is None:
            r.setdefault("over_reference", None)
            continue
        over: dict[str, Any] = {}
        for key in (NPU_CYCLES, FLASH):
            mine, theirs = value_of(r["values"].get(key) or {}), value_of(ref["values"].get(key) or {})
            if mine is not None and theirs and mine > theirs:
                over[key] = {"value": mine, "reference": theirs, "ratio": round(mine / theirs, 4)}
        cpu = _cpu_over(r, ref)
        if cpu:
            over[CPU_OPERATORS] = cpu
        if not over:
            r["over_reference"] = None
            continue
        extra = excess_layers(layers.get((r["leaf"], r["target"])) or [], layers.get((reference, r["target"])) or [])
        excess = over[NPU_CYCLES]["value"] - over[NPU_CYCLES]["reference"] if NPU_CYCLES in over else 0
        named = _accounting(extra, excess) if excess else [e for e in extra if e["reference_npu_cycles"] is None]
        r["over_reference"] = {"reference": reference, **over, "layers": named, "text": _text(r, over, named, reference)}
        notes.append(r["over_reference"]["text"])
    return notes


def _cpu_over(row: Mapping[str, Any], ref: Mapping[str, Any]) -> dict[str, Any] | None:
    """More operators of ``row`` than of ``ref`` run on the CPU: the counts and those ``ref`` has no match for
    (op, name and Vela's reason); None when it has no more."""
    mine = value_of(row["values"].get(CPU_OPERATORS) or {})
    theirs = value_of(ref["values"].get(CPU_OPERATORS) or {})
    if mine is None or theirs is None or mine <= theirs:
        return None
    known = {(o.get("op"), o.get("name")) for o in ref.get("cpu_operator_list") or []}
    extra = [o for o in row.get("cpu_operator_list") or [] if (o.get("op"), o.get("name")) not in known]
    return {"value": mine, "reference": theirs, "operators": extra[:MAX_NAMED]}


def _text(row: Mapping[str, Any], over: Mapping[str, Any], named: Sequence[Mapping[str, Any]], reference: str) -> str:
    parts = [f"{WHAT[k]} {fmt_count(v['value'])}, {v['ratio']:.3f}x {reference}'s {fmt_count(v['reference'])}"
             for k, v in over.items() if k != CPU_OPERATORS]
    if CPU_OPERATORS in over:
        cpu = over[CPU_OPERATORS]
        parts.append(f"{fmt_count(cpu['value'])} operators on the CPU ({reference} {fmt_count(cpu['reference'])})"
                     + "".join(f", {o.get('op')} '{o.get('name')}'" for o in cpu["operators"]))
    text = f"{row['leaf']} costs more than {reference} on {row['target']}: " + "; ".join(parts)
    if named:
        text += "; layers: " + describe_layers(named, reference)
    elif NPU_CYCLES in over:
        text += "; no per-layer Vela estimate of both leaves names the layers"
    return text
