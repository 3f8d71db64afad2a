"""Candidate widths compiled with Vela for the cycle staircase (:mod:`edgedeploy.optimize.thin_npu`).

Each candidate is the model thinned to its widths (:func:`edgedeploy.keras.thin.thin_model`), converted to int8
on a few calibration samples (cycles do not depend on the ranges) and compiled in a pool of Vela workers for
each target; the per-operator cycles of Vela's per-layer CSV are keyed by the operator's name, kind and
occurrence, which do not change with the widths. The cycles taken from each row are its ``NPU`` column, the
share of the summary's NPU cycles (the column sums to them), which is what the budget holds: ``Op Cycles`` is
the larger of the NPU's and the memory's cycles of the operator and sums to the total cycles instead (on
Ethos-U85-256 the two sums differed by 3,400 to 18,000 cycles among ResNet-8's candidates, by the widths).
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any, Mapping, Sequence

from ..errors import ToolFailedError

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


def compile_models(models: Sequence[bytes], targets: Sequence[str], work: Path, jobs: int = 1
                   ) -> dict[str, list[dict[str, Any]]]:
    """Per target, per model: ``npu_cycles``, ``total_cycles``, ``encoded_weights_bytes`` and the keyed rows."""
    from edgedeploy.vela import outputs as vela_backend
    from edgedeploy.config.targets import get_target
    from edgedeploy.vela.pool import VelaPool

    work.mkdir(parents=True, exist_ok=True)
    paths = []
    for i, data in enumerate(models):
        path = work / f"m{i}.tflite"
        path.write_bytes(data)
        paths.append(path)
    out: dict[str, list[Any]] = {}  # (every slot is filled before the return, or Vela's failure raised)
    try:
        with VelaPool(jobs) as pool:
            futures = {}
            for t in targets:
                target = get_target(t)
                for i, path in enumerate(paths):
                    folder = work / f"{t}_{i}"
                    folder.mkdir(parents=True, exist_ok=True)
                    args = vela_backend.build_vela_args(path, target, folder, "Performance")
                    futures[(t, i)] = (target, folder, path, pool.submit(args, folder / "vela.log"))
            for (t, i), (target, folder, path, future) in futures.items():
                res = future.result()
                found = vela_backend.find_vela_outputs(folder, path.stem)
                if res.returncode != 0 or "summary_csv" not in found or "per_layer_csv" not in found:
                    tail = (folder / "vela.log").read_text(errors="replace").strip().splitlines()[-2:]
                    raise ToolFailedError(f"Vela failed on a thinned candidate for {t}: {' | '.join(tail)}",
                                          "read the Vela log in the thinned node's stage folder")
                summary = vela_backend.parse_summary_csv(found["summary_csv"].read_text(encoding="utf-8"))
                layers = vela_backend.parse_per_layer_csv(found["per_layer_csv"].read_text(encoding="utf-8"))
                m = vela_backend.summary_metrics(summary, target, layers)
                out.setdefault(t, [None] * len(paths))[i] = {
                    "npu_cycles": m["npu_cycles"].value, "total_cycles": m["total_cycles"].value,
                    "encoded_weights_bytes": m["encoded_weights_bytes"].value, "keyed": op_key_rows(layers)}
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return out
