"""Preservation of a thinned model's widths: every stage below a thinned node, and its int8 file, keeps the
input and output channels of every kernel (pure: compares channel counts)."""

from __future__ import annotations

from typing import Iterable, Mapping

from edgedeploy.core.weight_stats import WeightStats
from edgedeploy.optimize.preserve import Verdict


def int8_channels(found: Iterable[WeightStats]) -> dict[str, tuple[int | None, int]]:
    """(input, output) channels of each int8 kernel (TFLite layouts: Conv2D OHWI, depthwise 1HWO, FC OI)."""
    out: dict[str, tuple[int | None, int]] = {}
    for s in found:
        shape = s.shape
        if s.kind == "Conv2D" and len(shape) == 4:
            out[s.layer] = (int(shape[3]), int(shape[0]))
        elif s.kind == "DepthwiseConv2D" and len(shape) == 4:
            # 1HWO holds no input count: with a depth multiplier over 1 it is O / multiplier (None: not compared)
            out[s.layer] = (None, int(shape[3]))
        elif s.kind == "Dense" and len(shape) == 2:
            out[s.layer] = (int(shape[1]), int(shape[0]))
    return out


def check_channels(node: str, where: str, expected: Mapping[str, tuple[int, int]],
                   found: Mapping[str, tuple[int | None, int]]) -> Verdict:
    """Each kernel of ``found`` has the (input, output) channels of the same layer in ``expected`` (a count of None
    in ``found`` is not known there and not compared); a layer missing from ``found`` fails too (its kernel could
    not be matched to be checked)."""
    rows, failures = [], []
    for layer, want in expected.items():
        got = found.get(layer)
        row = {"layer": layer, "where": where, "check": "channels", "expected": list(want),
               "found": list(got) if got else None, "status": "ok", "note": ""}
        if got is None:
            row.update(status="failed", note="no kernel of this layer found")
        elif any(g is not None and g != w for g, w in zip(got, want)):
            row.update(status="failed", note=f"channels (in, out) {tuple(got)} != thinned {tuple(want)}")
        if row["status"] == "failed":
            failures.append(f"{node} ({where}): layer {layer}: {row['note']}")
        rows.append(row)
    return Verdict(rows, [], failures)
