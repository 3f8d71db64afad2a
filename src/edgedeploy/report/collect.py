"""Gathering facts from a run's manifest: one row of values per (leaf, target). Runs no tool."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

from edgedeploy.core.manifest import Manifest, StageRecord, checked_artifact
from edgedeploy.core.units import fmt_bytes as B
from edgedeploy.report.levels import REFERENCE_LEAF, leaf_level
from .columns import VELA_METRICS, from_metric, na, val, value_of


@dataclass
class _Variant:
    name: str
    accuracy: StageRecord | None = None  # convert/<leaf>
    imported: StageRecord | None = None  # import/<variant>
    compiles: list[StageRecord] = field(default_factory=list)

    @property
    def level(self) -> int | None:
        return leaf_level(self.name) if self.imported is None or self.accuracy is not None else None

    @property
    def source(self) -> StageRecord | None:
        return self.accuracy or self.imported


def _variants(manifest: Manifest) -> list[_Variant]:
    found: dict[str, _Variant] = {}
    for rec in manifest.records.values():
        if not rec.variant or rec.stage not in ("convert", "import", "compile"):
            continue
        v = found.setdefault(rec.variant, _Variant(rec.variant))
        if rec.stage == "convert":
            v.accuracy = rec
        elif rec.stage == "import":
            v.imported = rec
        else:
            v.compiles.append(rec)

    def order(v: _Variant) -> tuple:
        level = v.level
        return (level is None, level if level is not None else 0, v.name)

    return sorted(found.values(), key=order)


def int8_model_path(manifest: Manifest, rec: StageRecord | None) -> Path | None:
    """The int8 .tflite a convert or import record wrote, refused when it was changed since (a missing one is
    returned as it is, for the report to say so)."""
    if rec is None or rec.status == "failed":
        return None
    art = rec.output("int8_model") or next((a for a in rec.outputs if a.path.endswith(".tflite")), None)
    if art is not None:
        path = manifest.resolve(art)
        return checked_artifact(manifest, rec, art, f"the int8 model of {rec.variant}") if path.exists() else path
    guess = manifest.run_dir / rec.id / "model_int8.tflite"
    return guess if guess.is_file() else None


def _accuracy_values(v: _Variant, ref: _Variant | None) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    acc = v.accuracy
    if acc is None:
        why = (
            f"no accuracy: {v.name} was imported from a .tflite (no convert/{v.name} record)"
            if v.imported is not None
            else f"no accuracy: no convert/{v.name} record"
        )
        out["float_accuracy_pct"] = na("%", "measured", why)
        out["int8_accuracy_pct"] = na("%", "measured", why)
        out["tflite_bytes"] = (
            from_metric(v.imported, "tflite_bytes", "B", "measured", "not recorded")
            if v.imported is not None
            else na("B", "measured", why)
        )
        out["gzip_bytes"] = na("B", "measured", f"no gzip size: no convert/{v.name} record")
    elif acc.status == "failed":
        why = f"convert/{v.name} failed: {acc.error}"
        for key, unit in (("float_accuracy_pct", "%"), ("int8_accuracy_pct", "%"), ("tflite_bytes", "B"),
                          ("gzip_bytes", "B")):
            out[key] = na(unit, "measured", why)
    else:
        why = f"convert/{v.name} recorded no value"
        out["float_accuracy_pct"] = from_metric(acc, "float_accuracy", "%", "measured", why)
        out["int8_accuracy_pct"] = from_metric(acc, "int8_accuracy", "%", "measured", why)
        out["tflite_bytes"] = from_metric(acc, "tflite_bytes", "B", "measured", why)
        out["gzip_bytes"] = from_metric(acc, "gzip_bytes", "B", "measured", why)
    if acc is not None and isinstance(acc.details.get("metric"), Mapping):
        return _task_metric_values(v, ref, out)
    # The difference against the ptq leaf (negative: this leaf lost accuracy).
    mine = value_of(out["int8_accuracy_pct"])
    if ref is None or ref.accuracy is None:
        out["int8_accuracy_delta_pts"] = na("pts", "computed", f"no {REFERENCE_LEAF} leaf with an accuracy in this run")
        return _with_other_outputs(acc, out)
    ref_int8 = mine if ref is v else value_of(_accuracy_values(ref, None)["int8_accuracy_pct"])
    if mine is None:
        out["int8_accuracy_delta_pts"] = na("pts", "computed", out["int8_accuracy_pct"]["unavailable"])
    elif ref_int8 is None:
        out["int8_accuracy_delta_pts"] = na("pts", "computed", f"the {REFERENCE_LEAF} leaf has no int8 accuracy")
    else:
        out["int8_accuracy_delta_pts"] = val(mine - ref_int8, "pts", "computed")
    return _with_other_outputs(acc, out)


def _with_other_outputs(acc: StageRecord | None, out: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """A classifier with other outputs (a detection head's box regressor): their int8 metrics beside its accuracy."""
    others = _other_metrics(acc, "accuracy") if acc is not None and acc.status != "failed" else ""
    if others:
        out["int8_other_metrics"] = val(others, "", "measured")
    return out


def _task_metric_values(v: _Variant, ref: _Variant | None, out: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """A leaf judged by its task's metric (``details["metric"]`` of its convert record): the metric columns, and
    the accuracy columns unavailable with the reason."""
    acc = v.accuracy
    assert acc is not None  # (called for a leaf whose convert record names its metric)
    spec = acc.details["metric"]
    key, unit, higher = spec["key"], spec.get("unit", ""), bool(spec.get("higher_is_better", True))
    why = f"not a classifier ({spec.get('task', '')}): judged by {spec.get('title', key)}"
    for k, u in (("float_accuracy_pct", "%"), ("int8_accuracy_pct", "%"), ("int8_accuracy_delta_pts", "pts")):
        out[k] = na(u, "measured" if u == "%" else "computed", why)
    missing = f"convert/{v.name} recorded no {key}"
    tag = {"metric": spec.get("name", key), "higher_is_better": higher}
    out["float_metric"] = {**from_metric(acc, f"float_{key}", unit, "measured", missing), **tag}
    out["int8_metric"] = {**from_metric(acc, f"int8_{key}", unit, "measured", missing), **tag}
    mine = value_of(out["int8_metric"])
    theirs = None
    if ref is not None and ref.accuracy is not None and acc.status != "failed":
        m = ref.accuracy.metrics.get(f"int8_{key}")
        theirs = None if m is None else m.value
    if mine is None or theirs is None:
        out["int8_metric_drop"] = {**na(unit, "computed", f"no {REFERENCE_LEAF} leaf with an int8 {key} to compare"),
                                   **tag}
    else:
        out["int8_metric_drop"] = {**val((theirs - mine) if higher else (mine - theirs), unit, "computed"), **tag}
    others = _other_metrics(acc, key)
    out["int8_other_metrics"] = val(others, "", "measured") if others else na("", "measured", "none")
    return out


def _other_metrics(acc: StageRecord, key: str) -> str:
    """The int8 metrics of a leaf besides the one it is judged by (``key``), in words: the task's other metrics
    (``MAE 0.1``) and every metric of a model's other outputs (``box MSE 0.02``)."""
    from edgedeploy.config.task import METRICS

    def label(name: str) -> str:
        metric = next((m for m in sorted(METRICS, key=len, reverse=True) if name == m or name.endswith(f"_{m}")), None)
        if metric is None or metric == name:
            return name.upper()
        return f"{name[:-len(metric) - 1]} {METRICS[metric].title if metric != 'accuracy' else 'accuracy'}"

    return ", ".join(f"{label(name[5:])} {m.value:g}{(' ' + m.unit) if m.unit else ''}"
                     for name, m in acc.metrics.items()
                     if name.startswith("int8_") and name not in ("int8_accuracy", f"int8_{key}")
                     and m.value is not None)


def _compile_values(rec: StageRecord | None, manifest: Manifest, v: _Variant) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    if rec is None:
        why = f"not compiled: no compile/{v.name}/<target> record"
    elif rec.status == "failed":
        why = f"{rec.id} failed: {rec.error}"
    else:
        why = ""
    for key, (metric, unit) in VELA_METRICS.items():
        out[key] = na(unit, "estimated", why) if why or rec is None else from_metric(
            rec, metric, unit, "estimated", f"{rec.id} recorded no {metric}")
    if why or rec is None:
        out["compiled_model_bytes"] = na("B", "measured", why)
        out["npu_clock_mhz"] = na("MHz", "computed", why)
        return out
    art = rec.output("vela_model")
    out["compiled_model_bytes"] = (
        val(art.bytes, "B", "measured") if art is not None else na("B", "measured", f"{rec.id} names no Vela model")
    )
    target = manifest.targets.get(rec.target or "") or {}
    hz = target.get("npu_hz")
    out["npu_clock_mhz"] = (
        val(hz / 1e6, "MHz", "computed") if hz else na("MHz", "computed", f"no clock for {rec.target} in the manifest")
    )
    return out


def _fit(row_values: Mapping[str, Any], target: Mapping[str, Any] | None, target_name: str) -> dict[str, Any]:
    """Whether a compiled leaf fits the board's memory; NPU-only targets have no memory to fit."""
    mem = (target or {}).get("memory")
    if not target or target.get("kind") != "board" or not mem:
        return {"applies": False, "fits": None, "text": "n/a",
                "note": f"{target_name} is an NPU configuration, not a board: no memory sizes to fit"}
    sram, model = value_of(row_values["sram_bytes"]), value_of(row_values["compiled_model_bytes"])
    margin = int(mem.get("runtime_margin_bytes") or 0)
    sram_cap, flash_cap = int(mem["sram_bytes"]), int(mem["flash_bytes"])
    out: dict[str, Any] = {
        "applies": True,
        "board_sram_bytes": sram_cap,
        "board_flash_bytes": flash_cap,
        "runtime_margin_bytes": margin,
        "sram_needed_bytes": None if sram is None else sram + margin,
        "flash_needed_bytes": model,
    }
    if sram is None or model is None:
        out.update(fits=None, text="unknown", note="not compiled for this board")
        return out
    problems = []
    if sram + margin > sram_cap:
        problems.append(f"SRAM {B(sram)} + {B(margin)} runtime margin exceeds {B(sram_cap)} "
                        f"by {B(sram + margin - sram_cap)}")
    if model > flash_cap:
        problems.append(f"compiled model {B(model)} exceeds {B(flash_cap)} flash by {B(model - flash_cap)}")
    out["fits"] = not problems
    out["text"] = "yes" if not problems else "no"
    out["note"] = "; ".join(problems) if problems else (
        f"SRAM {B(sram)} + {B(margin)} runtime margin ≤ {B(sram_cap)}; "
        f"compiled model {B(model)} ≤ {B(flash_cap)} flash"
    )
    dram = value_of(row_values["dram_bytes"])
    if dram:
        out["note"] += f"; DRAM use ({B(dram)}) not checked: the target file gives no DRAM size"
    return out
