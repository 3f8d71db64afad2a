"""Structured (M:N) sparsity for Ethos-U85: the 2:4 pattern, its masks and its preservation check.

Ethos-U85's MAC array skips the zero products of a kernel that holds at least two zeros in every group of four
consecutive input channels of one output channel of the int8 kernel: the innermost axis of TFLite's OHWI
convolution kernels and of the ``[out, in]`` fully connected weights. In Keras layout the same groups run along
axis 2 of a ``[H, W, in, out]`` Conv2D kernel and axis 0 of a ``[in, out]`` Dense kernel (TFMOT's
``sparsity_m_by_n`` groups run along the same axis). Depthwise kernels and layers whose input channels are not
a multiple of four are left out and named.

Pure NumPy: no TensorFlow here, so the masks and checks are unit-tested without it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable

import numpy as np

from edgedeploy.config.tree import NOT_NPU_FORMATS, PATTERNS  # noqa: F401  (read here by the pruning and its checks)

ZEROS, GROUP = 2, 4  # the 2:4 pattern: at least ZEROS zeros in every GROUP consecutive input channels


def input_channels(kind: str, shape: tuple[int, ...], where: str) -> int | None:
    """The input-channel count of a Conv2D/Dense kernel in Keras (``where="keras"``) or int8 TFLite layout."""
    if kind not in ("Conv2D", "Dense"):
        return None
    if where == "keras":
        return int(shape[2] if kind == "Conv2D" else shape[0])
    return int(shape[-1])  # OHWI, [out, in]


def eligible(kind: str, shape: tuple[int, ...], where: str = "keras") -> bool:
    cin = input_channels(kind, shape, where)
    return cin is not None and cin % GROUP == 0


def why_left_out(kind: str, shape: tuple[int, ...], where: str = "keras") -> str | None:
    """Why a layer's kernel gets no 2:4 pattern, or None when it gets one."""
    if kind == "DepthwiseConv2D":
        return "depthwise kernel (one input channel per output channel): no 2:4 groups"
    cin = input_channels(kind, shape, where)
    if cin is None:
        return f"{kind} has no 2:4 kernel"
    if cin % GROUP:
        return f"{cin} input channels, not a multiple of {GROUP}"
    return None


def groups(kernel: np.ndarray, kind: str, where: str = "keras") -> np.ndarray:
    """The kernel as rows of four consecutive input channels of one output channel: shape ``[n, 4]``."""
    k = np.asarray(kernel)
    if where == "keras":
        k = np.moveaxis(k, 2, -1) if kind == "Conv2D" else k.T  # -> [..., out, in] with input channels last
    return k.reshape(-1, GROUP)


def from_groups(rows: np.ndarray, shape: tuple[int, ...], kind: str) -> np.ndarray:
    """Inverse of :func:`groups` for a Keras kernel of ``shape``."""
    if kind == "Conv2D":
        h, w, cin, cout = shape
        return np.moveaxis(rows.reshape(h, w, cout, cin), -1, 2)
    cin, cout = shape
    return rows.reshape(cout, cin).T


def mask_2of4(kernel: np.ndarray, kind: str, fraction: float = 1.0) -> np.ndarray:
    """A 0/1 mask of a Keras kernel that zeroes the two smallest magnitudes of a ``fraction`` of its groups.

    ``fraction`` < 1 is a step of a gradual schedule: the groups that lose the least magnitude go first, so the
    mask of a larger fraction holds the mask of a smaller one (given the same weights).
    """
    rows = np.abs(groups(kernel, kind))
    order = np.argsort(rows, axis=1, kind="stable")
    keep = np.ones_like(rows, dtype=np.float32)
    smallest = order[:, :ZEROS]
    cost = np.take_along_axis(rows, smallest, axis=1).sum(axis=1)
    count = int(round(np.clip(fraction, 0.0, 1.0) * len(rows)))
    chosen = np.argsort(cost, kind="stable")[:count]
    keep[chosen[:, None], smallest[chosen]] = 0.0
    return from_groups(keep, np.shape(kernel), kind).astype(np.float32)


def violations(kernel: np.ndarray, kind: str, where: str = "keras") -> int:
    """How many groups of four hold fewer than two zeros."""
    zeros = (groups(kernel, kind, where) == 0).sum(axis=1)
    return int(np.sum(zeros < ZEROS))


@dataclass
class PatternVerdict:
    rows: list[dict[str, Any]]
    failures: list[str]
    left_out: list[str]


def check(node: str, where: str, kernels: Iterable[tuple[str, str, np.ndarray]],
          skipped: Iterable[str] = ()) -> PatternVerdict:
    """Judge each ``(layer, kind, kernel)`` of a 2:4 node (Keras or int8 layout): every group of four input
    channels of an eligible kernel holds at least two zeros."""
    skipped = set(skipped)
    rows, failures, left_out = [], [], []
    for layer, kind, kernel in kernels:
        shape = tuple(np.shape(kernel))
        reason = "listed in skip_layers" if layer in skipped else why_left_out(kind, shape, where)
        row: dict[str, Any] = {"layer": layer, "kind": kind, "where": where, "pattern": "2:4"}
        if reason:
            row.update(status="left out", note=reason)
            left_out.append(layer)
        else:
            bad = violations(kernel, kind, where)
            total = int(np.size(kernel)) // GROUP
            row.update(groups=total, groups_short=bad, status="ok" if bad == 0 else "failed",
                       note="" if bad == 0 else f"{bad} of {total} groups of four input channels hold < 2 zeros")
            if bad:
                failures.append(f"{node} ({where}): layer {layer}: {row['note']} (2:4 pattern)")
        rows.append(row)
    return PatternVerdict(rows, failures, left_out)


def left_out_layers(kernels: Iterable[tuple[str, str, tuple[int, ...]]], where: str = "keras") -> dict[str, str]:
    """``{layer: reason}`` for the Conv2D/Dense/DepthwiseConv2D kernels that get no 2:4 pattern."""
    out = {}
    for layer, kind, shape in kernels:
        reason = why_left_out(kind, tuple(shape), where)
        if reason and kind in ("Conv2D", "Dense", "DepthwiseConv2D"):
            out[layer] = reason
    return out
