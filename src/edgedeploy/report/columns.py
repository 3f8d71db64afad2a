"""The report's columns and its value cells (a value with unit and mode, or unavailable with a reason)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

from ..manifest import StageRecord


SCHEMA = "edgedeploy.report"
SCHEMA_VERSION = 1


def val(value: Any, unit: str, mode: str) -> dict[str, Any]:
    return {"value": value, "unit": unit, "mode": mode}


def na(unit: str, mode: str, reason: str) -> dict[str, Any]:
    return {"value": None, "unit": unit, "mode": mode, "unavailable": reason}


def value_of(cell: Mapping[str, Any] | None) -> Any:
    return None if cell is None else cell.get("value")


@dataclass(frozen=True)
class Column:
    key: str
    header: str  # with the unit
    unit: str
    kind: str  # how it is shown: text, pct, pts, bytes, count, ratio, ms, rate, mhz


# Row values in the order they are shown. Keys carry their unit, so CSV headers do too.
VALUE_COLUMNS: tuple[Column, ...] = (
    Column("float_accuracy_pct", "Float acc (%)", "%", "pct"),
    Column("int8_accuracy_pct", "Int8 acc (%)", "%", "pct"),
    Column("int8_accuracy_delta_pts", "Δ int8 vs ptq (pts)", "pts", "pts"),
    Column("tflite_bytes", "TFLite (B)", "B", "bytes"),
    Column("gzip_bytes", "gzip (B)", "B", "bytes"),
    Column("encoded_weights_bytes", "NPU-encoded weights (B)", "B", "bytes"),
    Column("encoded_weights_ratio", "Weights vs ptq (×)", "ratio", "ratio"),
    Column("compiled_model_bytes", "Flash: compiled model (B)", "B", "bytes"),
    Column("vela_flash_bytes", "Vela flash estimate (B)", "B", "bytes"),
    Column("sram_bytes", "SRAM (B)", "B", "bytes"),
    Column("dram_bytes", "DRAM (B)", "B", "bytes"),
    Column("npu_cycles", "NPU cycles", "cycles", "count"),
    Column("npu_cycles_ratio", "NPU cycles vs ptq (×)", "ratio", "ratio"),
    Column("npu_macs", "NPU MACs", "MAC", "count"),
    Column("npu_macs_ratio", "MACs vs ptq (×)", "ratio", "ratio"),
    Column("compute_bound_pct", "Compute-bound cycles (%)", "%", "pct"),
    Column("total_cycles", "Total cycles", "cycles", "count"),
    Column("npu_clock_mhz", "NPU clock (MHz)", "MHz", "mhz"),
    Column("latency_ms", "Latency (ms)", "ms", "ms"),
    Column("inferences_per_s", "Inferences/s (1/s)", "1/s", "rate"),
    Column("mac_utilization_pct", "MAC util (%)", "%", "rate"),
    Column("cpu_operators", "CPU ops", "count", "count"),
)
KEY_COLUMNS: tuple[Column, ...] = (
    Column("leaf", "Leaf", "", "text"),
    Column("target", "Target", "", "text"),
    Column("level", "Level", "", "text"),
)
JUDGMENT_COLUMNS: tuple[Column, ...] = (
    Column("fits_board", "Fits board", "", "text"),
    Column("pareto", "Pareto front", "", "text"),
    Column("meets_requirements", "Meets requirements", "", "text"),
    Column("recommended", "Recommended", "", "text"),
)
ALL_COLUMNS = KEY_COLUMNS + VALUE_COLUMNS + JUDGMENT_COLUMNS
# Leaves judged by another metric than accuracy (regression, reconstruction; edgedeploy.task): shown only in a
# report with such a leaf, so classifier reports keep their columns and keys.
METRIC_COLUMNS: tuple[Column, ...] = (
    Column("float_metric", "Float metric", "", "metric"),
    Column("int8_metric", "Int8 metric", "", "metric"),
    Column("int8_metric_drop", "Metric drop vs ptq", "", "metric"),
    Column("int8_other_metrics", "Other int8 metrics", "", "text"),
)


def value_columns(rows) -> tuple[Column, ...]:
    return VALUE_COLUMNS + (METRIC_COLUMNS if any("int8_metric" in r.get("values", {}) for r in rows) else ())


def columns_of(doc: Mapping[str, Any]) -> tuple[Column, ...]:
    """The columns of a report document, in the order they are shown."""
    return KEY_COLUMNS + value_columns(doc.get("rows", [])) + JUDGMENT_COLUMNS

# Vela metrics copied from compile records: row key -> (manifest metric, unit).
VELA_METRICS = {
    "encoded_weights_bytes": ("encoded_weights_bytes", "B"),
    "vela_flash_bytes": ("flash_bytes", "B"),
    "sram_bytes": ("sram_bytes", "B"),
    "dram_bytes": ("dram_bytes", "B"),
    "npu_cycles": ("npu_cycles", "cycles"),
    "npu_macs": ("macs", "MAC"),
    "compute_bound_cycles": ("compute_bound_cycles", "cycles"),  # (for compute_bound_pct)
    "memory_bound_cycles": ("memory_bound_cycles", "cycles"),
    "total_cycles": ("total_cycles", "cycles"),
    "latency_ms": ("latency_ms", "ms"),
    "inferences_per_s": ("inferences_per_second", "1/s"),
    "mac_utilization_pct": ("mac_utilization", "%"),
    "cpu_operators": ("cpu_operators", "count"),
}


def from_metric(rec: StageRecord, name: str, unit: str, mode: str, missing: str) -> dict[str, Any]:
    m = rec.metrics.get(name)
    if m is None:
        return na(unit, mode, missing)
    if m.value is None:
        return na(m.unit or unit, m.mode or mode, m.unavailable or missing)
    return val(m.value, m.unit or unit, m.mode or mode)
