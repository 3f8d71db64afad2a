"""Compression diagnostics gathered from the int8 models and Vela's debug database."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Iterable

from ..errors import InvalidInputError
from edgedeploy.core.manifest import Manifest
from edgedeploy.core.units import fmt_bytes, fmt_count
from edgedeploy.report.levels import PALETTE_LIMIT, is_clustered_leaf
from .collect import _Variant, int8_model_path


# Output-channel axis of the weights of each operator (TFLite layouts: OHWI, 1HWO, OI).
OUTPUT_CHANNEL_AXIS = {"CONV_2D": 0, "DEPTHWISE_CONV_2D": 3, "FULLY_CONNECTED": 0, "TRANSPOSE_CONV": 0,
                       "CONV_3D": 4}


def weight_diagnostics(model_path: Path) -> list[dict[str, Any]]:
    """Distinct int8 values per weight tensor (and per output channel) and the zero fraction."""
    import numpy as np

    from edgedeploy.tflite.reader import read_weight_tensors

    out = []
    for w in read_weight_tensors(model_path):
        if w.dtype not in ("int8", "uint8", "int16"):
            continue
        values = w.values()
        # The output-channel axis: the quantized dimension when per-channel, else the operator's layout.
        axis = w.quantized_dimension if len(w.scale) > 1 else OUTPUT_CHANNEL_AXIS.get(w.op, 0)
        axis = axis if 0 <= axis < values.ndim else 0
        per_channel = np.moveaxis(values, axis, 0).reshape(values.shape[axis], -1)
        counts = [int(np.unique(ch).size) for ch in per_channel]
        out.append(
            {
                "tensor": w.name,
                "op": w.op,
                "shape": list(w.shape),
                "distinct_values": int(np.unique(values).size),
                "max_distinct_per_channel": max(counts) if counts else 0,
                "output_channels": int(values.shape[axis]),
                "zero_fraction": float(np.count_nonzero(values == 0) / values.size) if values.size else 0.0,
                "elements": int(values.size),
            }
        )
    return out


def _compression(manifest: Manifest, variants: Iterable[_Variant]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for v in variants:
        path = int8_model_path(manifest, v.source)
        entry: dict[str, Any] = {"leaf": v.name, "clustered_leaf": is_clustered_leaf(v.name),
                                 "palette_limit": PALETTE_LIMIT}
        if path is None or not path.is_file():
            entry.update(model=None, tensors=[], status="unavailable",
                         note=f"unavailable: no int8 model of {v.name} in this run"
                         + (f" ({path} is missing)" if path is not None else ""))
            out[v.name] = entry
            continue
        try:
            tensors = weight_diagnostics(path)
        except InvalidInputError as exc:
            entry.update(model=_shown(manifest, path), tensors=[], status="unavailable",
                         note=f"unavailable: {exc.one_line()}")
            out[v.name] = entry
            continue
        for t in tensors:
            t["palette_ok_per_tensor"] = t["distinct_values"] <= PALETTE_LIMIT
            t["palette_ok_per_channel"] = t["max_distinct_per_channel"] <= PALETTE_LIMIT
        over_channel = [t for t in tensors if not t["palette_ok_per_channel"]]
        over_tensor = [t for t in tensors if not t["palette_ok_per_tensor"]]
        total = sum(t["elements"] for t in tensors)
        zeros = sum(t["zero_fraction"] * t["elements"] for t in tensors)
        entry.update(
            model=_shown(manifest, path),
            tensors=tensors,
            weight_tensors=len(tensors),
            max_distinct_values=max((t["distinct_values"] for t in tensors), default=0),
            max_distinct_per_channel=max((t["max_distinct_per_channel"] for t in tensors), default=0),
            zero_fraction=zeros / total if total else 0.0,
            tensors_over_limit_per_tensor=len(over_tensor),
            tensors_over_limit_per_channel=len(over_channel),
        )
        if not entry["clustered_leaf"]:
            entry["status"] = "not clustered"
            entry["note"] = (f"{len(over_tensor)} of {len(tensors)} weight tensors have more than {PALETTE_LIMIT} "
                             "distinct int8 values (expected for a leaf that was not clustered)")
        elif over_channel:
            worst = max(over_channel, key=lambda t: t["max_distinct_per_channel"])
            entry["status"] = "lost"
            entry["survives_per_channel"] = False
            entry["note"] = (
                f"clustering did not survive into Vela's encoding: {len(over_channel)} of {len(tensors)} weight "
                f"tensors have output channels with more than {PALETTE_LIMIT} distinct int8 values (up to "
                f"{worst['max_distinct_per_channel']} in '{_short(worst['tensor'])}'), so Vela cannot palette-encode them"
            )
        elif over_tensor:
            worst = max(over_tensor, key=lambda t: t["distinct_values"])
            entry["status"] = "lost"
            entry["survives_per_channel"] = True
            entry["note"] = (
                f"clustering did not survive into Vela's encoding: it holds per output channel (at most "
                f"{entry['max_distinct_per_channel']} values), but per-channel scales (and folded batch norms) "
                f"give {len(over_tensor)} of {len(tensors)} weight tensors more than {PALETTE_LIMIT} distinct int8 "
                f"values (up to {worst['distinct_values']} in '{_short(worst['tensor'])}'), more than the palette of a weight "
                "stream that spans several output channels can hold"
            )
        else:
            entry["status"] = "kept"
            entry["survives_per_channel"] = True
            entry["note"] = (f"every weight tensor has at most {entry['max_distinct_values']} distinct int8 values "
                             f"(≤ {PALETTE_LIMIT}): Vela can palette-encode them")
        _npu_weights(entry, v)
        out[v.name] = entry
    return out


def _npu_weights(entry: dict[str, Any], v: _Variant) -> None:
    """Per target, the NPU weight facts of Vela's debug database (compiled with ``debug_db``), if recorded."""
    found = {rec.target: rec.details["npu_weights"] for rec in sorted(v.compiles, key=lambda r: r.target or "")
             if rec.status != "failed" and rec.details.get("npu_weights")}
    if not found:
        return
    entry["npu_weights"] = found
    shown = []
    for target, facts in found.items():
        s = facts["summary"]
        cycles = s.get("weight_read_cycles")
        shown.append(f"{target} {fmt_bytes(s['encoded_weight_bytes'])} encoded in {s['layers']} layers"
                     + (f", {fmt_count(cycles, 'weight-read cycles')}" if cycles is not None else "")
                     + (f", {s['layers_over_palette']} layers over the palette" if s.get("layers_over_palette") else ""))
    entry["note"] = f"{entry['note']}; Vela's debug database: " + "; ".join(shown)


LAYER_KEYS = ("operator", "encoded_weight_bytes", "vela_distinct_weights", "int8_distinct", "within_palette",
              "int8_zero_fraction", "weight_read_cycles", "npu_cycles")


def npu_weight_layers(variants: Iterable[_Variant]) -> dict[str, dict[str, Any]]:
    """Per variant and target, Vela's per-layer NPU weight facts (compiles run with ``--debug-db``)."""
    out: dict[str, dict[str, Any]] = {}
    for v in variants:
        for rec in sorted(v.compiles, key=lambda r: r.target or ""):
            facts = rec.details.get("npu_weights") if rec.status != "failed" else None
            if not facts or rec.target is None:
                continue
            layers = [{"layer": _layer_label(row.get("tensor") or row.get("name") or "?"),
                       **{k: row.get(k) for k in LAYER_KEYS}} for row in facts.get("layers", [])]
            out.setdefault(v.name, {})[rec.target] = {"summary": facts.get("summary", {}), "layers": layers}
    return out


_KERNEL_SUFFIXES = ("/Conv2D", "/depthwise", "/MatMul", "/conv2d_transpose", "/Conv2DBackpropInput", "/Conv3D")


def _layer_label(tensor: str) -> str:
    """The part of a fused weight tensor's name that names its layer (``…/depthwise``, ``…/Conv2D``), else the first."""
    parts = tensor.split(";")
    named = next((p for p in parts if p.endswith(_KERNEL_SUFFIXES)), parts[0])
    return _short(named)


def _short(name: str, limit: int = 60) -> str:
    """A tensor name as people read it: its first ';'-separated part, cut to ``limit`` characters."""
    first = name.split(";")[0]
    return first if len(first) <= limit else first[: limit - 1] + "…"


def _shown(manifest: Manifest, path: Path) -> str:
    try:
        return str(path.resolve().relative_to(manifest.run_dir.resolve()))
    except ValueError:
        return str(path)
