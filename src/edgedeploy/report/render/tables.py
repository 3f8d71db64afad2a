"""Turning records into what people and programs read: tables and versioned JSON."""

from __future__ import annotations

import json
from typing import Any, Iterable, Sequence

from ... import __version__
from edgedeploy.core.manifest import Manifest, StageRecord
from edgedeploy.core.units import fmt_bytes, fmt_count, fmt_number, fmt_pct
from edgedeploy.config.targets import Target

COMPILE_SCHEMA = "edgedeploy.compile"
COMPILE_SCHEMA_VERSION = 1


def compile_json(manifest: Manifest, records: Sequence[StageRecord], cached_ids: set[str]) -> dict[str, Any]:
    """The versioned JSON document ``edgedeploy compile --json`` prints for ``records`` of the run ``manifest``."""
    results = []
    for r in records:
        results.append(
            {
                "variant": r.variant,
                "target": r.target,
                "status": "cached" if r.id in cached_ids else r.status,
                "metrics": {k: m.to_dict() for k, m in r.metrics.items()},
                "cpu_operators": r.details.get("cpu_operators", []),
                "warnings": r.warnings,
                "outputs": {a.role: a.path for a in r.outputs},
                "model_sha256": r.inputs[0].sha256 if r.inputs else None,
                "vela_argv": r.tool.argv if r.tool else [],
            }
        )
    return {
        "schema": COMPILE_SCHEMA,
        "schema_version": COMPILE_SCHEMA_VERSION,
        "edgedeploy_version": __version__,
        "run_dir": str(manifest.run_dir),
        "manifest": str(manifest.path),
        "tools": manifest.tools,
        "targets": {r.target: manifest.targets.get(r.target) for r in records if r.target},
        "results": results,
    }


def dumps(obj: Any) -> str:
    return json.dumps(obj, indent=2, default=str)


COMPILE_COLUMNS = (
    ("variant", "Variant"),
    ("target", "Target"),
    ("accuracy", "Int8 acc (%)"),
    ("sram", "SRAM (B)"),
    ("flash", "Vela flash (B)"),  # Vela's estimate; the report's flash is the compiled model
    ("dram", "DRAM (B)"),
    ("weights", "NPU weights (B)"),
    ("npu_cycles", "NPU cycles"),
    ("total_cycles", "Total cycles"),
    ("latency", "Latency (ms)"),
    ("ips", "Inf/s"),
    ("util", "MAC util (%)"),
    ("cpu", "CPU ops"),
)


def _int8_quality(parent: StageRecord | None) -> tuple[str, str]:
    """(column header, cell) of a leaf's int8 quality: its accuracy, or the task metric its convert stage
    recorded for a regression or reconstruction model (``Int8 MSE``, ``Int8 PSNR (dB)``)."""
    spec = (parent.details or {}).get("metric") if parent else None
    if not isinstance(spec, dict) or not spec.get("key"):
        return "Int8 acc (%)", fmt_pct(parent.metric("int8_accuracy") if parent else None)
    from ..columns import metric_label

    unit = spec.get("unit") or ""
    value = parent.metric(f"int8_{spec['key']}") if parent else None
    return (f"Int8 {metric_label(str(spec.get('name') or spec['key']))}" + (f" ({unit})" if unit else ""),
            "n/a" if value is None else f"{float(value):.4g}")


def compile_columns(rows: Sequence[dict[str, str]]) -> tuple[tuple[str, str], ...]:
    """The compile table's columns: the int8 quality column only when a row has one, headed by what it is."""
    headers = {r["quality"] for r in rows if r["accuracy"] != "n/a"}
    if not headers:
        return tuple(c for c in COMPILE_COLUMNS if c[0] != "accuracy")
    header = headers.pop() if len(headers) == 1 else "Int8 quality"
    return tuple((k, header if k == "accuracy" else h) for k, h in COMPILE_COLUMNS)


def sweep_columns(rows: Sequence[dict[str, str]]) -> tuple[tuple[str, str], ...]:
    """The columns of a sweep's compile table: the model first, the int8 accuracy only when a row has one."""
    return (("model", "Model"),) + tuple(
        c for c in COMPILE_COLUMNS if c[0] != "accuracy" or any(r["accuracy"] != "n/a" for r in rows))


def compile_rows(manifest: Manifest, records: Iterable[StageRecord], cached_ids: set[str]) -> list[dict[str, str]]:
    """Table rows; the int8 accuracy (or task metric) comes from the variant's convert stage when there is one."""
    rows = []
    for r in records:
        m = r.metric
        parent = manifest.records.get(r.parent) if r.parent else None
        quality, shown = _int8_quality(parent)
        rows.append(
            {
                "variant": (r.variant or "") + (" (cached)" if r.id in cached_ids else ""),
                "target": r.target or "",
                "accuracy": shown,
                "quality": quality,
                "sram": fmt_bytes(m("sram_bytes"), unit=False),
                "flash": fmt_bytes(m("flash_bytes"), unit=False),
                "dram": fmt_bytes(m("dram_bytes"), unit=False),
                "weights": fmt_bytes(m("encoded_weights_bytes"), unit=False),
                "npu_cycles": fmt_count(m("npu_cycles")),
                "total_cycles": fmt_count(m("total_cycles")),
                "latency": fmt_number(m("latency_ms"), 3),
                "ips": fmt_number(m("inferences_per_second"), 1),
                "util": fmt_pct(m("mac_utilization"), 1),
                "cpu": fmt_count(m("cpu_operators")),
            }
        )
    return rows


def target_rows(targets: Sequence[Target]) -> list[dict[str, str]]:
    return [
        {
            "name": t.name,
            "kind": t.kind,
            "npu": t.accelerator_config,
            "system": t.vela.system_config,
            "memory_mode": t.vela.memory_mode,
            "clock": f"{t.npu_hz / 1e6:g} MHz",
            "sram": fmt_bytes(t.memory.sram_bytes, unit=False) if t.memory else "",
            "fvp": t.fvp.binary if t.fvp else "",
        }
        for t in targets
    ]
