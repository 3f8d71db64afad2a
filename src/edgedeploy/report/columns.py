"""The report's columns and its value cells (a value with unit and mode, or unavailable with a reason)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

from edgedeploy.core.manifest import StageRecord


SCHEMA = "edgedeploy.report"
SCHEMA_VERSION = 1
SWEEP_REPORT_SCHEMA = "edgedeploy.sweep_report"  # several models' reports side by side (.sweep)


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
# Leaves judged by another metric than accuracy (regression, reconstruction; edgedeploy.config.task): shown only in a
# report with such a leaf, so classifier reports keep their columns and keys.
METRIC_COLUMNS: tuple[Column, ...] = (
    Column("float_metric", "Float metric", "", "metric"),
    Column("int8_metric", "Int8 metric", "", "metric"),
    Column("int8_metric_drop", "Metric drop vs ptq", "", "metric"),
    Column("int8_other_metrics", "Other int8 metrics", "", "text"),
)


ACCURACY_COLUMN_KEYS = ("float_accuracy_pct", "int8_accuracy_pct", "int8_accuracy_delta_pts")


def metric_label(name: str) -> str:
    """A task metric's name as a column shows it: ``MSE``, ``PSNR``, ``AUC``; a longer name as it is."""
    return name.upper() if name.isalnum() and len(name) <= 5 else name


def task_metric(rows) -> tuple[str, str] | None:
    """(label, unit) of the one task metric the rows' leaves are judged by (``("MSE", "")``, ``("PSNR", "dB")``);
    None when no leaf is judged by a task metric or leaves use different ones."""
    seen = {(c.get("metric") or "metric", c.get("unit") or "")
            for r in rows for c in [(r.get("values") or {}).get("int8_metric")] if c}
    if len(seen) != 1:
        return None
    name, unit = seen.pop()
    return metric_label(name), unit


def metric_only(rows) -> bool:
    """Every leaf is judged by a task metric (a regression or reconstruction run): no accuracy to show."""
    rows = [r for r in rows if r.get("values")]
    return bool(rows) and all("int8_metric" in r["values"] for r in rows) and not any(
        value_of(r["values"].get(k)) is not None for r in rows for k in ACCURACY_COLUMN_KEYS)


def value_columns(rows) -> tuple[Column, ...]:
    if not any("int8_metric" in r.get("values", {}) for r in rows):
        # a classifier with other outputs shows their metrics beside its accuracy
        others = any("int8_other_metrics" in r.get("values", {}) for r in rows)
        return VALUE_COLUMNS + ((METRIC_COLUMNS[3],) if others else ())
    named = task_metric(rows)
    if named is None:
        return VALUE_COLUMNS + METRIC_COLUMNS
    label, unit = named
    u = f" ({unit})" if unit else ""
    return VALUE_COLUMNS + (Column("float_metric", f"Float {label}{u}", unit, "named_metric"),
                            Column("int8_metric", f"Int8 {label}{u}", unit, "named_metric"),
                            Column("int8_metric_drop", f"{label} drop vs ptq{u}", unit, "named_metric"),
                            METRIC_COLUMNS[3])


def columns_of(doc: Mapping[str, Any]) -> tuple[Column, ...]:
    """The columns of a report document (every value a row holds), in the order they are shown."""
    return KEY_COLUMNS + value_columns(doc.get("rows", [])) + JUDGMENT_COLUMNS


def shown_columns(doc: Mapping[str, Any]) -> tuple[Column, ...]:
    """The columns a results table shows: without the accuracy columns when every leaf is judged by a task metric."""
    cols = columns_of(doc)
    if metric_only(doc.get("rows", [])):
        cols = tuple(c for c in cols if c.key not in ACCURACY_COLUMN_KEYS)
    return cols


def quality_name(rows) -> str:
    """What the leaves' int8 quality is called in words: ``accuracy``, or their task metric (``MSE``)."""
    if not any("int8_metric" in (r.get("values") or {}) for r in rows):
        return "accuracy"
    named = task_metric(rows)
    return named[0] if named else "task metric"

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
