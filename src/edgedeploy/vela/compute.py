"""What the NPU computes, from Vela's own estimate: MACs, and which layers are compute- or memory-bound.

Vela's per-layer CSV (``--verbose-performance``) gives for each operator its ``Op Cycles`` (the estimate it
sums), the cycles of the NPU's compute (``NPU``) and the cycles of each memory's accesses (``SRAM AC``,
``DRAM AC``, ``OnFlash AC``, ``OffFlash AC``); an operator takes the longest of them. A layer is
compute-bound when its NPU cycles are that longest (fewer MACs, e.g. Ethos-U85's 2:4 sparsity, then make it
faster) and memory-bound when one memory's accesses are (only fewer bytes make it faster). Pure functions
over parsed CSV rows, so they are tested on recorded Vela output.
"""

from __future__ import annotations

from typing import Any

MEMORIES = {"SRAM AC": "SRAM", "DRAM AC": "DRAM", "OnFlash AC": "on-chip flash", "OffFlash AC": "off-chip flash"}


def _num(row: dict[str, Any], key: str) -> float:
    v = row.get(key)
    return float(v) if isinstance(v, (int, float)) else 0.0


def layer_bounds(layers: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One entry per NPU operator with cycles: its cycles, MACs and what bounds it."""
    out = []
    for row in layers:
        op_cycles = _num(row, "Op Cycles")
        if row.get("Target") not in (None, "NPU") or op_cycles <= 0:
            continue
        npu = _num(row, "NPU")
        memory, mem_cycles = max(((MEMORIES[k], _num(row, k)) for k in MEMORIES), key=lambda kv: kv[1])
        bound = "compute" if npu >= mem_cycles else "memory"
        out.append({
            "name": str(row.get("Name", "")).split(";")[-1],
            "operator": row.get("NNG Operator") or row.get("Original Operator"),
            "op_cycles": int(op_cycles), "npu_cycles": int(npu), "memory_cycles": int(mem_cycles),
            "macs": int(_num(row, "MAC Count")),
            "bound": bound, **({"memory": memory} if bound == "memory" else {}),
        })
    return out


def compute_facts(layers: list[dict[str, Any]]) -> dict[str, Any]:
    """Totals over :func:`layer_bounds`: cycles and MACs of compute- and memory-bound layers."""
    rows = layer_bounds(layers)
    facts: dict[str, Any] = {"layers": rows}
    for bound in ("compute", "memory"):
        part = [r for r in rows if r["bound"] == bound]
        facts[f"{bound}_bound_layers"] = len(part)
        facts[f"{bound}_bound_cycles"] = sum(r["op_cycles"] for r in part)
        facts[f"{bound}_bound_macs"] = sum(r["macs"] for r in part)
    total = facts["compute_bound_cycles"] + facts["memory_bound_cycles"]
    facts["compute_bound_fraction"] = round(facts["compute_bound_cycles"] / total, 4) if total else None
    return facts


def leaf_npu_rows(records: list[Any], baseline: str = "ptq") -> list[dict[str, Any]]:
    """Per (leaf, target): NPU MACs and cycles (Vela), their ratios to ``baseline``'s on the same target, and the
    cycles spent in compute-bound layers. ``records`` are compile stage records (``variant``, ``target``,
    ``metrics``, ``details``) read from manifests."""
    def metric(rec, key):
        m = rec.metrics.get(key)
        return None if m is None else getattr(m, "value", m.get("value") if isinstance(m, dict) else None)

    base = {r.target: r for r in records if r.variant == baseline}
    out = []
    for r in records:
        macs, cycles = metric(r, "macs"), metric(r, "npu_cycles")
        b = base.get(r.target)
        b_macs, b_cycles = (metric(b, "macs"), metric(b, "npu_cycles")) if b is not None else (None, None)
        facts = (r.details or {}).get("npu_compute") or {}
        out.append({
            "leaf": r.variant, "target": r.target, "macs": macs, "npu_cycles": cycles,
            "macs_vs_ptq": round(macs / b_macs, 3) if macs and b_macs else None,
            "cycles_vs_ptq": round(cycles / b_cycles, 3) if cycles and b_cycles else None,
            "compute_bound_fraction": facts.get("compute_bound_fraction"),
            "compute_bound_layers": facts.get("compute_bound_layers"),
            "memory_bound_layers": facts.get("memory_bound_layers"),
        })
    return out


def npu_compute_values(row: dict[str, Any], rows: list[dict[str, Any]], reference: str = "ptq") -> None:
    """Fill a report row's ``npu_cycles_ratio``, ``npu_macs_ratio`` (to ``reference`` on the same target) and
    ``compute_bound_pct`` from the Vela values already in ``row["values"]`` (report cells: value/unit/mode)."""
    values = row["values"]

    def value(cell):
        return cell.get("value") if isinstance(cell, dict) else None

    def cell(v, unit, why):
        return ({"value": v, "unit": unit, "mode": "computed"} if v is not None
                else {"value": None, "unit": unit, "mode": "computed", "unavailable": why})

    ref = next((r for r in rows if r["leaf"] == reference and r["target"] == row["target"]), None)
    for key, ratio in (("npu_cycles", "npu_cycles_ratio"), ("npu_macs", "npu_macs_ratio")):
        mine = value(values.get(key))
        theirs = value(ref["values"].get(key)) if ref is not None else None
        if mine is None:
            values[ratio] = cell(None, "ratio", f"no {key} for this leaf")
        elif not theirs:
            values[ratio] = cell(None, "ratio", f"no {reference} leaf with {key} on {row['target']} to compare against")
        else:
            values[ratio] = cell(mine / theirs, "ratio", "")
    compute, memory = value(values.get("compute_bound_cycles")), value(values.get("memory_bound_cycles"))
    total = (compute or 0) + (memory or 0)
    values["compute_bound_pct"] = cell(100.0 * compute / total if compute is not None and total else None, "%",
                                       "no per-layer Vela estimate recorded (compiled before edgedeploy recorded it)")



def _layer(name: str) -> str:
    """``model/quant_conv2d_1/BiasAdd/ReadVariableOp1`` -> ``conv2d_1`` (the Keras layer of a Vela row)."""
    parts = [p for p in name.split("/") if p]
    layer = parts[1] if len(parts) > 1 else (parts[0] if parts else name)
    return layer.removeprefix("quant_")


def bound_layers_note(target: str, leaves: list[tuple[str, dict[str, Any] | None]]) -> str | None:
    """One line naming, per leaf, which of the layers that multiply (MACs > 0) Vela estimates compute-bound
    on ``target`` (fewer MACs, e.g. 2:4 sparsity, make only those faster) and which memory-bound.
    ``leaves`` are (leaf, compile ``details["npu_compute"]``)."""
    parts = []
    for leaf, facts in leaves:
        bound: dict[str, str] = {}
        for r in (facts or {}).get("layers") or []:
            if r.get("macs"):
                name = _layer(r["name"])
                bound[name] = "compute" if r["bound"] == "compute" or bound.get(name) == "compute" else "memory"
        if bound:
            compute = [n for n, b in bound.items() if b == "compute"]
            memory = [n for n, b in bound.items() if b == "memory"]
            parts.append(f"{leaf}: compute {', '.join(compute) or 'none'}; memory {', '.join(memory) or 'none'}")
    return f"{target}: compute- and memory-bound layers (Vela's per-layer estimate): " + " | ".join(parts) if parts else None
