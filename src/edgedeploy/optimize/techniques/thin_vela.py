"""Candidate widths compiled with Vela for the cycle staircase (:mod:`edgedeploy.optimize.techniques.thin_widths`).

Each candidate is the model thinned to its widths (:func:`edgedeploy.keras.channel_surgery.thin_model`), converted to int8
on a few calibration samples (cycles do not depend on the ranges) and compiled in a pool of Vela workers for
each target; the per-operator cycles of Vela's per-layer CSV are keyed by the operator's name, kind and
occurrence, which do not change with the widths. The cycles taken from each row are its ``NPU`` column, the
share of the summary's NPU cycles (the column sums to them), which is what the budget holds: ``Op Cycles`` is
the larger of the NPU's and the memory's cycles of the operator and sums to the total cycles instead (the two
sums differ by the widths; docs/methods/thin.md).
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any, Mapping, Sequence

from edgedeploy.core.steptime import timed

TRACE = "_thin_vela"  # the work folder inside the node's stage folder (removed when done)


def op_key_rows(layers: list[dict[str, Any]]) -> list[tuple[tuple[str, str, int], float]]:
    """NPU operator rows of Vela's per-layer CSV as ((name, operator, occurrence), NPU cycles)."""
    seen: dict[tuple[str, str], int] = {}
    out = []
    for row in layers:
        if row.get("Target") not in (None, "NPU"):
            continue
        name, op = str(row.get("Name", "")), str(row.get("NNG Operator") or row.get("Original Operator"))
        k = seen.get((name, op), 0)
        seen[(name, op)] = k + 1
        cycles = row.get("NPU")
        out.append(((name, op, k), float(cycles) if isinstance(cycles, (int, float)) else 0.0))
    return out


def layer_of(name: str, layer_kinds: Mapping[str, str]) -> str | None:
    """The Keras layer a Vela operator row belongs to: a kernel layer named in its tensor name, else any layer."""
    segments = [seg for part in name.split(";") for seg in part.split("/")]
    named = [seg for seg in segments if seg in layer_kinds]
    kernel = [seg for seg in named if layer_kinds[seg] in ("Conv2D", "DepthwiseConv2D", "Dense")]
    return kernel[0] if kernel else named[0] if named else None


@timed("candidate_vela")
def compile_models(models: Sequence[bytes], targets: Sequence[str], work: Path, jobs: int = 1
                   ) -> dict[str, list[dict[str, Any]]]:
    """Per target, per model: ``npu_cycles``, ``total_cycles``, ``encoded_weights_bytes`` and the keyed rows."""
    from edgedeploy.config.targets import get_target
    from edgedeploy.vela.runner import VelaRequest, run_all

    work.mkdir(parents=True, exist_ok=True)
    paths = []
    for i, data in enumerate(models):
        path = work / f"m{i}.tflite"
        path.write_bytes(data)
        paths.append(path)
    out: dict[str, list[Any]] = {}  # (every slot is filled before the return, or Vela's failure raised)
    try:
        requests, keys = [], []
        for t in targets:
            target = get_target(t)
            for i, path in enumerate(paths):
                folder = work / f"{t}_{i}"
                folder.mkdir(parents=True, exist_ok=True)
                requests.append(VelaRequest(path, target, folder, "Performance"))
                keys.append((t, i))
        results = run_all(requests, jobs, shown=["a thinned candidate"] * len(requests),
                          need={"vela_model", "summary_csv", "per_layer_csv"},
                          fix="read the Vela log in the thinned node's stage folder")
        for (t, i), res in zip(keys, results):
            m = res.metrics
            out.setdefault(t, [None] * len(paths))[i] = {
                "npu_cycles": m["npu_cycles"].value, "total_cycles": m["total_cycles"].value,
                "encoded_weights_bytes": m["encoded_weights_bytes"].value, "keyed": op_key_rows(res.layers)}
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return out
