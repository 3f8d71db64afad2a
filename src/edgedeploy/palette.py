"""Palette-aware compression: keep clusters and sparsity all the way into the NPU's weight streams.

Vela encodes each weight stream losslessly, with a palette of at most 32 distinct int8 values and run-length
coding of zeros. TFMOT clusters float weights; int8 per-channel scales (and batch norms folded into the kernels)
then spread each tensor's clusters over many distinct int8 values, and Vela's palette no longer applies.

This module keeps the palette in the int8 values themselves. For each weight tensor it chooses one shared
*integer* palette ``P`` (at most ``clusters`` values in [-127, 127]) and writes every output channel as its
own scale times palette values::

    w[..., c] = s_c * P[index],  s_c = max|w[..., c]| / 127,  ±127 in P

(With ``[palette] scales = "fitted"`` each ``s_c`` is instead the fraction of that which fits the channel's
weights best, its largest weights clipped to ±127: :func:`fitted_scales`.) Because each channel keeps a weight at
±127, the converter's symmetric per-channel scale is exactly ``s_c`` and the int8 kernel holds only values of
``P``: at most ``clusters`` distinct values per tensor, whatever the channel scales are. Zero stays a palette
value, so pruned weights stay zero. Batch norms are folded into the kernels first, so the converter has nothing
left to fold.

Nodes (see :data:`NODES`): ``clustered_palette`` / ``pruned_clustered_palette`` cluster the baseline / the TFMOT
pruned node straight onto per-tensor palettes, zeros kept (PTQ leaves of the same names; they replace TFMOT's
clustering, whose per-tensor float clusters a folded batch norm would spread again), and ``cqat_palette`` /
``pcqat_palette`` run
quantization-aware training whose weight quantizers snap each kernel to its palette on every step (a
straight-through estimator), so the palette survives training and conversion. A layer whose batch norm was
folded trains in its kernel's units before folding (:func:`palette_qat_model`), as TFMOT's QAT of the unfolded
model does; the factors are kept in the node's plan file.

By default the projection is error-compensating (:func:`project_compensated`, GPTQ-style): each layer's input
hessian from real fine-tune samples (:func:`layer_hessians`) lets the error of every snapped weight be pushed
onto the weights not yet snapped, so the layer's output moves far less than with nearest-value snapping
(:func:`project`, ``[palette] projection = "nearest"``).

Per-layer settings (``[layers.NAME] sparsity / clusters``) and an optional sensitivity sweep (``[palette]
search = true``) choose, per layer, the palette size and extra sparsity that give the smallest Vela-encoded
weights within an accuracy budget, judged on fine-tune samples from the rise of the cross-entropy
(:func:`drop_per_loss`). Work items of the sweep run in a local process pool, or as Ray tasks
(``executor = "ray"``).

The parsers of Vela's debug database (``--enable-debug-db``) at the end of this module are pure functions.
"""

from __future__ import annotations

import csv
import io
import json
import logging
import math
import os
import re
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Iterable, Iterator, Mapping, Sequence

import numpy as np

from .errors import InvalidInputError, PreservationError, ToolFailedError, UsageError
from .keras_model import KERNEL_LAYERS
from .recipe import PALETTE_CHOICES, PALETTE_DEFAULTS, PALETTE_PLAN_VERSION

log = logging.getLogger("edgedeploy")

# Vela's weight encoder keeps a palette of at most this many distinct values per weight stream.
PALETTE_LIMIT = 32
QMAX = 127  # symmetric int8 weights: [-127, 127]

# node -> (parent node, technique); every palette node is also a leaf of the same name.
NODES: dict[str, tuple[str, str]] = {
    "clustered_palette": ("baseline", "palette"),
    "pruned_clustered_palette": ("pruned", "palette"),
    "cqat_palette": ("clustered_palette", "palette_qat"),
    "pcqat_palette": ("pruned_clustered_palette", "palette_qat"),
}
LEAVES: dict[str, str] = {n: n for n in NODES}
QAT_NODES = {n for n, (_, t) in NODES.items() if t == "palette_qat"}
PLAN_FILE = "palette.json"
EXECUTORS = ("process", "ray")


# --------------------------------------------------------------------------- palettes (pure NumPy)


def channels_last(kernel: np.ndarray, kind: str) -> np.ndarray:
    """The kernel as a 2-D array (elements per channel, output channels), in the converter's channel order."""
    kernel = np.asarray(kernel)
    if kind == "DepthwiseConv2D":  # (kh, kw, in, mult) -> channels in*mult, as TFLite's 1HWO layout
        return kernel.reshape(-1, kernel.shape[2] * kernel.shape[3])
    return kernel.reshape(-1, kernel.shape[-1])


def channel_scales(flat: np.ndarray, per_tensor: bool = False) -> np.ndarray:
    """Symmetric int8 scales of each column of ``flat`` (max |w| / 127), as the TFLite converter computes them."""
    peak = np.abs(flat).max(axis=0) if flat.size else np.zeros(flat.shape[1])
    if per_tensor:
        peak = np.full(flat.shape[1], np.abs(flat).max() if flat.size else 0.0)
    return peak / QMAX


def normalized(flat: np.ndarray, per_tensor: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """Weights divided by their channel scale (values in [-127, 127]) and the scales; empty channels stay 0."""
    scales = channel_scales(flat, per_tensor)
    safe = np.where(scales > 0, scales, 1.0)
    return flat / safe, scales


def fit_palette(x: np.ndarray, clusters: int, keep_zero: bool, seed: int = 0, iterations: int = 30) -> np.ndarray:
    """At most ``clusters`` integer levels in [-127, 127] for the normalized values ``x`` (1-D k-means).

    The channel extremes (±127, where values reach them) are fixed levels, so every channel keeps its scale;
    0 is a fixed level when ``keep_zero`` (pruned weights stay zero). The other levels are k-means centroids
    of the remaining values, rounded to integers.
    """
    if clusters < 2:
        raise UsageError(f"a palette needs at least 2 values, not {clusters}", "set clusters >= 2")
    x = np.asarray(x, dtype=np.float64).ravel()
    fixed = []
    if x.size and x.max() >= QMAX - 0.5:
        fixed.append(QMAX)
    if x.size and x.min() <= -QMAX + 0.5:
        fixed.append(-QMAX)
    if keep_zero:
        fixed.append(0)
    fixed = sorted(set(fixed))
    rest = x[~np.isin(np.rint(x), fixed)] if fixed else x
    if keep_zero:
        rest = rest[rest != 0]
    free = clusters - len(fixed)
    distinct = np.unique(np.rint(rest))
    if free <= 0 or rest.size == 0:
        return np.array(fixed[:clusters] if free < 0 else fixed, dtype=np.int64)
    if distinct.size <= free:
        return np.unique(np.concatenate([fixed, distinct])).astype(np.int64)
    # Lloyd iterations on the values, fixed levels included in the assignment but never moved.
    centroids = np.quantile(rest, (np.arange(free) + 0.5) / free)
    fixed_arr = np.asarray(fixed, dtype=np.float64)
    for _ in range(iterations):
        levels = np.concatenate([centroids, fixed_arr])
        assign = np.abs(rest[:, None] - levels[None, :]).argmin(axis=1)
        moved = centroids.copy()
        for i in range(free):
            members = rest[assign == i]
            if members.size:
                moved[i] = members.mean()
        if np.allclose(moved, centroids):
            break
        centroids = moved
    levels = np.unique(np.clip(np.rint(np.concatenate([centroids, fixed_arr])), -QMAX, QMAX)).astype(np.int64)
    return levels


SCALES = PALETTE_CHOICES["scales"]  # [palette] scales: how each channel's scale is chosen (fit_palette_and_scales)
SHRINKS = np.linspace(1.0, 0.5, 26)  # the fractions of max|w| / 127 that fitted_scales tries


def fitted_scales(flat: np.ndarray, palette: np.ndarray, per_tensor: bool = False) -> np.ndarray:
    """Per column of ``flat``, the scale ``s`` among ``SHRINKS`` x max|w| / 127 whose ``s * P[nearest]`` has the
    least squared error: weights beyond ``127 s`` clip to ±127, so a few large weights no longer stretch the grid.

    Since ``s <= max|w| / 127``, each column's largest weight still snaps to ±127: the converter's symmetric
    scale of the projected kernel is exactly ``s``, and its int8 values stay palette values.
    """
    flat = np.asarray(flat, dtype=np.float64)
    peak = channel_scales(flat, per_tensor)
    safe = np.where(peak > 0, peak, 1.0)
    errors = []
    for shrink in SHRINKS:
        s = safe * shrink
        err = (flat - snap(flat / s, palette) * s) ** 2
        errors.append(np.full(flat.shape[1], err.sum()) if per_tensor else err.sum(axis=0))
    return np.where(peak > 0, peak * SHRINKS[np.argmin(np.stack(errors), axis=0)], 0.0)


def fit_palette_and_scales(flat: np.ndarray, clusters: int, keep_zero: bool, seed: int = 0, per_tensor: bool = False,
                           scales: str = "peak", rounds: int = 3) -> tuple[np.ndarray, np.ndarray]:
    """The shared palette of ``flat`` (channels last) and each channel's scale.

    ``scales = "peak"``: max|w| / 127, every channel's largest weight at ±127. ``"fitted"``: palette and scales
    fitted together, ``rounds`` times :func:`fitted_scales` then :func:`fit_palette` on the weights divided by
    their scales (clipped to ±127).
    """
    if scales not in SCALES:
        raise UsageError(f"palette scales '{scales}' are unknown", f"use one of {', '.join(SCALES)}")
    x, channel = normalized(flat, per_tensor)
    palette = fit_palette(x, clusters, keep_zero, seed)
    if scales == "fitted":
        for _ in range(rounds):
            channel = fitted_scales(flat, palette, per_tensor)
            safe = np.where(channel > 0, channel, 1.0)
            palette = fit_palette(np.clip(flat / safe, -QMAX, QMAX), clusters, keep_zero, seed)
    return palette, channel


def snap(x: np.ndarray, palette: np.ndarray) -> np.ndarray:
    """Each value of ``x`` replaced by the nearest palette level."""
    levels = np.sort(np.asarray(palette, dtype=np.float64))
    if levels.size == 1:
        return np.full_like(np.asarray(x, dtype=np.float64), levels[0])
    mids = (levels[1:] + levels[:-1]) / 2
    return levels[np.searchsorted(mids, x)]


def magnitude_prune(flat: np.ndarray, sparsity: float) -> np.ndarray:
    """Zero the smallest-magnitude weights of the whole tensor until ``sparsity`` of it is zero."""
    if sparsity <= 0:
        return flat
    n_zero = math.floor(sparsity * flat.size)
    if n_zero <= int(np.count_nonzero(flat == 0)):
        return flat
    order = np.argsort(np.abs(flat), axis=None, kind="stable")
    out = flat.copy().ravel()
    out[order[:n_zero]] = 0.0
    return out.reshape(flat.shape)


@dataclass(frozen=True)
class Projection:
    kernel: np.ndarray
    palette: np.ndarray
    sparsity: float
    distinct_int8: int


def project(kernel: np.ndarray, kind: str, clusters: int, sparsity: float = 0.0, per_tensor: bool = False,
            keep_zero: bool | None = None, seed: int = 0, palette: np.ndarray | None = None,
            scales: str = "peak") -> Projection:
    """Project one kernel onto a shared integer palette (after optional extra magnitude pruning).

    The result is a float kernel whose symmetric int8 quantization (per channel, or per tensor) holds only
    palette values.
    """
    shape = np.shape(kernel)
    flat = channels_last(np.asarray(kernel, dtype=np.float64), kind)
    flat = magnitude_prune(flat, sparsity)
    if keep_zero is None:
        keep_zero = bool(np.any(flat == 0))
    if palette is None:
        palette, channel = fit_palette_and_scales(flat, clusters, keep_zero, seed, per_tensor, scales)
    else:  # the kernel's own scales (bake_palettes: a trained kernel already on its palette)
        channel = channel_scales(flat, per_tensor)
    x = flat / np.where(channel > 0, channel, 1.0)
    q = snap(x, palette)
    if 0 in set(np.asarray(palette).tolist()):
        q[flat == 0] = 0.0  # pruned weights stay zero
    out = (q * channel[None, :]).astype(np.float32)
    distinct = int(np.unique(int8_symmetric(out, per_tensor)).size)
    return Projection(out.reshape(shape), np.asarray(palette, dtype=np.int64),
                      float(np.mean(out == 0)), distinct)


def int8_symmetric(flat: np.ndarray, per_tensor: bool = False) -> np.ndarray:
    """What the converter stores for ``flat`` (2-D, channels last): round(w / (max|w| / 127)) per channel."""
    x, _ = normalized(np.asarray(flat, dtype=np.float64), per_tensor)
    return np.clip(np.rint(x), -QMAX, QMAX).astype(np.int8)


# --------------------------------------------------------------------------- error-compensating projection (pure)

DAMP = 0.01  # GPTQ's dampening: this fraction of the mean diagonal is added to each layer's hessian


def inverse_cholesky(hessian: np.ndarray, damp: float = DAMP) -> np.ndarray:
    """Upper Cholesky factor of the damped inverse of ``hessian`` (as GPTQ uses it).

    Inputs that never fire (zero diagonal) get a unit diagonal: nothing flows through them, so no error is
    pushed onto them. The dampening grows tenfold until the factorization succeeds.
    """
    h = np.array(hessian, dtype=np.float64)
    dead = np.diag(h) <= 0
    h[dead, dead] = 1.0
    mean = float(np.mean(np.diag(h))) or 1.0
    for factor in (damp, damp * 10, damp * 100, 1.0):
        try:
            return np.linalg.cholesky(np.linalg.inv(h + factor * mean * np.eye(len(h)))).T
        except np.linalg.LinAlgError:
            continue
    raise np.linalg.LinAlgError("the layer's input hessian cannot be inverted even with dampening")


def saliency_mask(flat: np.ndarray, hinv_diag: np.ndarray, sparsity: float, protect: np.ndarray) -> np.ndarray:
    """Keep-mask (1 = kept) with at least ``sparsity`` zeros in every output channel, chosen by OBS saliency.

    A weight's saliency is the output error its removal costs, ``w^2 / [H^-1]_ii`` (the inverse-Cholesky
    diagonal squared, as SparseGPT). Zeros already there count towards the target; ``protect`` (per channel,
    the row of the channel's peak weight) is never pruned, so every channel keeps its scale. The count per
    channel rounds up (a 3x3 depthwise channel at 50% loses 5 of its 9 weights, not 4), up to all but the peak.
    """
    d, channels = flat.shape
    mask = (flat != 0).astype(np.float64)
    n_zero = min(math.ceil(sparsity * d - 1e-9), d - 1)
    if sparsity <= 0 or n_zero <= 0:
        return mask
    hd = np.broadcast_to(np.asarray(hinv_diag, dtype=np.float64).reshape(d, -1), (d, channels))
    saliency = flat ** 2 / np.maximum(hd, 1e-30) ** 2
    saliency[flat == 0] = -1.0  # already zero: counted first
    saliency[protect, np.arange(channels)] = np.inf
    order = np.argsort(saliency, axis=0, kind="stable")[:n_zero]
    np.put_along_axis(mask, order, 0.0, axis=0)
    return mask


def compensate(flat: np.ndarray, hinv: np.ndarray, levels: np.ndarray, scales: np.ndarray, mask: np.ndarray,
               peak: np.ndarray) -> np.ndarray:
    """Quantize ``flat`` (inputs x channels) onto ``levels`` x channel scale, one input row at a time, GPTQ-style.

    Each row is snapped to its nearest allowed value; masked weights become 0 and each channel's ``peak`` row
    becomes exactly ±127 x scale (so the converter's scale is unchanged). The error of every row is spread
    over the rows not yet quantized through the inverse hessian ``hinv`` (its upper Cholesky factor), which
    keeps the layer's output on the calibration inputs close to the unquantized one.
    """
    w = np.array(flat, dtype=np.float64)
    d, channels = w.shape
    safe = np.where(scales > 0, scales, 1.0)
    cols = np.arange(channels)
    peak_value = np.sign(np.asarray(flat)[peak, cols]) * QMAX * safe
    out = np.zeros_like(w)
    for i in range(d):
        q = snap(w[i] / safe, levels) * safe
        q = np.where(mask[i] > 0, q, 0.0)
        q = np.where(peak == i, peak_value, q)
        out[i] = q
        if i + 1 < d:
            err = (w[i] - q) / hinv[i, i]
            w[i + 1:] -= np.outer(hinv[i, i + 1:], err)
    return out


def project_compensated(kernel: np.ndarray, kind: str, hessian: np.ndarray, clusters: int, sparsity: float = 0.0,
                        keep_zero: bool | None = None, seed: int = 0, damp: float = DAMP,
                        scales: str = "peak") -> Projection:
    """:func:`project` with the layer's inputs taken into account (GPTQ / SparseGPT-style error compensation).

    ``hessian`` is the layer's input second moment ``E[x x^T]`` over calibration samples (inputs in the
    kernel's flattened order; for a DepthwiseConv2D one matrix per channel, shape (channels, k, k)). Extra
    sparsity removes the weights whose loss the rest can best make up for (OBS saliency) instead of the
    smallest; each weight is then snapped to the shared palette in turn while the error so far is pushed onto
    the weights still free. The palette, the per-channel scales and the zeros are the same kind as
    :func:`project` gives: the int8 kernel holds at most ``clusters`` values per tensor.
    """
    shape = np.shape(kernel)
    flat = channels_last(np.asarray(kernel, dtype=np.float64), kind)
    d, channels = flat.shape
    peak = np.abs(flat).argmax(axis=0)
    h = np.asarray(hessian, dtype=np.float64)
    depthwise = h.ndim == 3
    if (depthwise and h.shape != (channels, d, d)) or (not depthwise and h.shape != (d, d)):
        raise ValueError(f"hessian of shape {h.shape} does not fit a kernel of {d} inputs x {channels} channels")
    hinvs = [inverse_cholesky(hc, damp) for hc in h] if depthwise else [inverse_cholesky(h, damp)]
    if depthwise:
        mask = np.concatenate([saliency_mask(flat[:, c:c + 1], np.diag(hinvs[c]), sparsity, peak[c:c + 1])
                               for c in range(channels)], axis=1)
    else:
        mask = saliency_mask(flat, np.diag(hinvs[0]), sparsity, peak)
    if keep_zero is None:
        keep_zero = bool(np.any(mask == 0))
    palette, channel = fit_palette_and_scales(flat * mask, clusters, keep_zero, seed, scales=scales)
    levels = np.sort(palette.astype(np.float64))
    if depthwise:
        q = np.concatenate([compensate(flat[:, c:c + 1], hinvs[c], levels, channel[c:c + 1], mask[:, c:c + 1],
                                       peak[c:c + 1]) for c in range(channels)], axis=1)
    else:
        q = compensate(flat, hinvs[0], levels, channel, mask, peak)
    out = q.astype(np.float32)
    distinct = int(np.unique(int8_symmetric(out)).size)
    return Projection(out.reshape(shape), palette.astype(np.int64), float(np.mean(out == 0)), distinct)


# --------------------------------------------------------------------------- plans and the search (pure)


@dataclass(frozen=True)
class LayerSetting:
    """What the palette node does to one layer: ``clusters`` None keeps the layer as its parent left it."""

    clusters: int | None
    sparsity: float = 0.0

    @property
    def key(self) -> str:
        return "keep" if self.clusters is None else f"k{self.clusters}_s{self.sparsity:g}"

    def to_dict(self) -> dict[str, Any]:
        return {"clusters": self.clusters, "sparsity": self.sparsity}


def candidate_settings(clusters: Sequence[int], sparsities: Sequence[float]) -> list[LayerSetting]:
    return [LayerSetting(int(k), float(s)) for k in clusters for s in sparsities]


def start_options(options: Mapping[str, Sequence[Mapping[str, Any]]]) -> dict[str, Mapping[str, Any]]:
    """Per layer, the option a walk starts from: the most bytes (the sweep's largest palette), then least drop."""
    return {layer: max(opts, key=lambda o: (o["bytes"], -max(o["drop"], 0.0))) for layer, opts in options.items() if opts}


def memoized(joint_drop):
    """``joint_drop`` judging each plan (layer -> setting) once, however often it is asked."""
    memo: dict[str, Any] = {}

    def judged(plan: Mapping[str, Mapping[str, Any]]):
        key = json.dumps(sorted((k, sorted(v.items())) for k, v in plan.items()))
        if key not in memo:
            memo[key] = joint_drop(plan)
        return memo[key]

    return judged


def greedy_plan(options: Mapping[str, Sequence[Mapping[str, Any]]], joint_drop, budget: float
                ) -> tuple[dict[str, dict[str, Any]], list[dict[str, Any]]]:
    """Per layer, a setting such that the *joint* accuracy drop stays within ``budget``, fewest bytes first.

    ``options[layer]`` lists {"setting": LayerSetting-dict, "bytes": int, "drop": float (points, this layer
    alone)}; the option with the most bytes is where the layer starts (the sweep's largest palette). Drops of
    single layers do not add up (in one measured case ten harmless layers together lost 9 points), so every
    step is checked on the whole model: moves are tried in order (no measured loss first, then most bytes
    saved per point lost) and kept when ``joint_drop(plan)`` is within ``budget``. ``joint_drop`` returns the
    drop, or a mapping with the drop under ``"drop"`` and more facts to record with the step. Returns (plan,
    steps tried).
    """
    start = start_options(options)
    current = dict(start)
    moves = []
    for layer, opts in options.items():
        base = start.get(layer)
        for o in opts:
            if base is None or o["bytes"] >= base["bytes"] or o["drop"] > budget:
                continue
            saved = base["bytes"] - o["bytes"]
            moves.append((max(o["drop"], 0.0) > 0, -saved / max(o["drop"], 1e-3), -saved, layer, o))
    moves.sort(key=lambda m: m[:3])
    steps = []
    for _, _, _, layer, o in moves:
        if o["bytes"] >= current[layer]["bytes"]:
            continue
        trial = {**current, layer: o}
        judged = joint_drop({k: v["setting"] for k, v in trial.items()})
        extra = dict(judged) if isinstance(judged, Mapping) else {"drop": judged}
        drop = float(extra.pop("drop"))
        ok = drop <= budget
        steps.append({"layer": layer, "setting": o["setting"], "joint_drop": round(drop, 3), "kept": ok,
                      "encoded_bytes": int(sum(v["bytes"] for v in trial.values())), **extra})
        if ok:
            current = trial
    return {k: v["setting"] for k, v in current.items()}, steps


def plan_bytes(options: Mapping[str, Sequence[Mapping[str, Any]]], plan: Mapping[str, Mapping[str, Any]]) -> int:
    """Encoded bytes of ``plan`` (layer -> setting) as the sweep measured them for each layer alone."""
    total = 0
    for layer, setting in plan.items():
        total += next(int(o["bytes"]) for o in options[layer] if o["setting"] == setting)
    return total


def sized_plan(options: Mapping[str, Sequence[Mapping[str, Any]]], joint_drop, max_bytes: int, low: float,
               resolution: float = 0.02, rounds: int = 16) -> dict[str, Any]:
    """The plan of least joint drop whose encoded bytes fit ``max_bytes``: :func:`greedy_plan` at bisected budgets.

    A larger budget lets :func:`greedy_plan` take more moves, so its plan gets smaller as the budget grows
    (not strictly: every budget orders and filters the moves anew). The budget is bisected between ``low``
    (the drop every plan starts from) and the drop of the smallest plan (hundreds of points when every layer
    is at its smallest setting), on a log scale above ``low``, to ``resolution`` points or ``rounds`` walks;
    the fitting plan of least drop over all walks wins. Joint drops are memoised, so walks
    that share their first moves judge them once. Returns {"plan", "bytes", "drop", "fits", "walks" (budget,
    bytes, drop of each), "steps" (the chosen walk's)}; when even the smallest plan does not fit, that plan
    with ``fits`` False.
    """
    judged = memoized(joint_drop)

    def drop_of(plan: Mapping[str, Mapping[str, Any]]) -> float:
        value = judged(plan)
        return float(value["drop"] if isinstance(value, Mapping) else value)

    walks: list[dict[str, Any]] = []

    def walk(budget: float) -> dict[str, Any]:
        plan, steps = greedy_plan(options, judged, budget)
        result = {"budget": round(budget, 3), "bytes": plan_bytes(options, plan), "drop": round(drop_of(plan), 3),
                  "plan": plan, "steps": steps}
        walks.append(result)
        return result

    smallest = walk(float("inf"))
    if smallest["bytes"] > max_bytes:
        best = smallest
    else:
        lo, hi = low, max(smallest["drop"], low)
        for _ in range(rounds):
            if hi - lo <= resolution:
                break
            mid = low - resolution + math.sqrt((lo - low + resolution) * (hi - low + resolution))
            if walk(mid)["bytes"] <= max_bytes:
                hi = mid
            else:
                lo = mid
        best = min((w for w in walks if w["bytes"] <= max_bytes), key=lambda w: (w["drop"], w["bytes"]))
    return {"plan": best["plan"], "bytes": best["bytes"], "drop": best["drop"], "fits": best["bytes"] <= max_bytes,
            "walks": [{k: w[k] for k in ("budget", "bytes", "drop")} for w in walks], "steps": best["steps"]}


LINEAR_REGIME = 5.0  # points: single-layer items beyond this measured drop do not fit the loss-to-accuracy slope
MIN_SLOPE_ITEMS = 5


def drop_per_loss(measured_drops: Sequence[float], loss_rises: Sequence[float]) -> float | None:
    """Accuracy points lost per nat of cross-entropy gained, fitted over a sweep's single-layer items.

    A least-squares line through the origin over the items whose loss rose and whose measured drop is at most
    :data:`LINEAR_REGIME` points (accuracy saturates at chance while the loss keeps growing). None when fewer
    than :data:`MIN_SLOPE_ITEMS` items qualify or the fit is not positive.

    Why: an accuracy drop measured on samples the model was fine-tuned on is coarse (one sample is 1/n) and,
    far from the decision boundary, understates what unseen samples lose once many small changes add up,
    while the loss rise is smooth and carries over to unseen samples. Measured on the DS-CNN of this project:
    the slope fitted on fine-tune samples was 27-32 points per nat, the same fit on the evaluation split 32-35.
    """
    d = np.asarray(measured_drops, dtype=np.float64)
    r = np.asarray(loss_rises, dtype=np.float64)
    use = (r > 0) & (d <= LINEAR_REGIME) & np.isfinite(d) & np.isfinite(r)
    if int(use.sum()) < MIN_SLOPE_ITEMS:
        return None
    slope = float(d[use] @ r[use] / (r[use] @ r[use]))
    return slope if slope > 0 else None


def holdout_split(n: int, fraction: float, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Sorted indices (train, hold-out) of a fine-tune split of ``n`` samples; a seeded random ``fraction`` is held out."""
    k = max(1, round(n * fraction)) if fraction > 0 else 0
    hold = np.sort(np.random.default_rng(seed).permutation(n)[:k])
    return np.setdiff1d(np.arange(n), hold), hold


# --------------------------------------------------------------------------- Vela's debug database (pure)

_TABLE_RE = re.compile(r'<table name="(?P<name>[^"]+)">\s*<!\[CDATA\[\s*(?P<body>.*?)\]\]>\s*</table>', re.DOTALL)
WEIGHT_OPS = ("CONV_2D", "DEPTHWISE_CONV_2D", "FULLY_CONNECTED", "TRANSPOSE_CONV", "CONV_3D")


def parse_debug_db(text: str) -> dict[str, list[dict[str, str]]]:
    """The tables of Vela's ``*_debug.xml`` (``--enable-debug-db``): name -> rows (column -> text)."""
    tables = {}
    try:
        for m in _TABLE_RE.finditer(text):
            rows = csv.DictReader(io.StringIO(m.group("body").replace("\0", ""), newline=""))
            tables[m.group("name")] = [{k: v for k, v in r.items() if isinstance(k, str) and isinstance(v, str)}
                                       for r in rows]
    except csv.Error as exc:
        raise ToolFailedError(f"Vela's debug database has a table that is not CSV ({exc})",
                              "re-run the compile with --enable-debug-db") from exc
    if not tables:
        raise ToolFailedError("no <table> in Vela's debug database", "re-run the compile with --enable-debug-db")
    return tables


def _int(text: str | None) -> int | None:
    try:
        return int(float(text)) if text not in (None, "") else None
    except ValueError:
        return None


def weight_layers(tables: Mapping[str, list[dict[str, str]]]) -> list[dict[str, Any]]:
    """One row per NPU operation that reads weights, from the ``perf`` and ``perf_debug`` tables.

    Fields: ``source_op`` (the operator's index in the input .tflite, Vela's ``ext_key``), ``operator``,
    ``name`` (its output tensor), ``encoded_weight_bytes`` (Vela's ``weight_total_bytes``; they add up to
    ``total_npu_encoded_weights`` of the summary CSV), ``vela_distinct_weights`` (``weight_distinct``),
    ``weight_read_cycles`` (``est_weight_read_cycles``), ``weight_transfer_cycles``, ``weight_format``,
    ``op_cycles`` and ``npu_cycles``, and ``weight_access_cycles`` (the ``*Weights_ac`` columns per memory).
    """
    perf = {r["id"]: r for r in tables.get("perf", [])}
    ext = {r["id"]: _int(r.get("ext_key")) for r in tables.get("source", [])}
    out = []
    for r in tables.get("perf_debug", []):
        total = _int(r.get("weight_total_bytes"))
        if total is None:
            continue
        p = perf.get(r["id"], {})
        access = {k[: -len("Weights_ac")]: _int(v) for k, v in r.items()
                  if k.endswith("Weights_ac") and _int(v) is not None}
        out.append({
            "vela_id": _int(r["id"]),
            "source_op": ext.get(p.get("source_id")),
            "operator": p.get("operator", ""),
            "name": p.get("name", ""),
            "encoded_weight_bytes": total,
            "vela_distinct_weights": _int(r.get("weight_distinct")),
            "weight_format": r.get("weight_format", ""),
            "weight_read_cycles": _int(r.get("est_weight_read_cycles")),
            "weight_transfer_cycles": _int(r.get("weight_transfer_cycles")),
            "op_cycles": _int(p.get("op_cycles")),
            "npu_cycles": _int(p.get("npu_cycles")),
            "weight_access_cycles": access,
        })
    return out


def summarize_layers(layers: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Totals over :func:`weight_layers` rows (missing values count as unavailable, not zero)."""

    def total(key: str) -> int | None:
        vals = [r.get(key) for r in layers if r.get(key) is not None]
        return int(sum(vals)) if vals else None

    distinct = [r.get("int8_distinct") for r in layers if r.get("int8_distinct") is not None]
    return {
        "layers": len(layers),
        "encoded_weight_bytes": total("encoded_weight_bytes"),
        "weight_read_cycles": total("weight_read_cycles"),
        "weight_transfer_cycles": total("weight_transfer_cycles"),
        "max_int8_distinct": max(distinct) if distinct else None,
        "layers_over_palette": sum(1 for d in distinct if d > PALETTE_LIMIT),
        "palette_limit": PALETTE_LIMIT,
    }


def attach_int8(layers: list[dict[str, Any]], operators: Sequence[Any], tensors: Sequence[Any]) -> list[dict[str, Any]]:
    """Add each row's int8 weight tensor facts (name, distinct values per tensor, zeros) from the input .tflite.

    ``operators`` are :class:`~edgedeploy.tflite_model.OperatorInfo` of the input model, ``tensors`` its
    :func:`~edgedeploy.tflite_model.read_weight_tensors`; both in operator order.
    """
    weighted = [o.index for o in operators if o.op in WEIGHT_OPS]
    wt = [t for t in tensors if t.op in WEIGHT_OPS]
    by_op = dict(zip(weighted, wt)) if len(weighted) == len(wt) else {}
    for row in layers:
        t = by_op.get(row.get("source_op"))
        if t is None:
            row.update(tensor=None, int8_distinct=None, int8_zero_fraction=None, int8_elements=None)
            continue
        values = t.values()
        row.update(tensor=t.name, tflite_op=t.op, int8_distinct=int(np.unique(values).size),
                   int8_zero_fraction=round(float(np.mean(values == 0)), 4), int8_elements=int(values.size),
                   within_palette=bool(np.unique(values).size <= PALETTE_LIMIT))
    return layers


def npu_weight_report(debug_xml: Path, model: Path) -> dict[str, Any]:
    """Per-layer NPU weight facts of one compile: Vela's debug database joined with the int8 model's tensors."""
    from .tflite_model import read_tflite, read_weight_tensors

    layers = weight_layers(parse_debug_db(Path(debug_xml).read_text(encoding="utf-8")))
    try:
        attach_int8(layers, read_tflite(model).operators, read_weight_tensors(model))
    except InvalidInputError as exc:
        log.warning("%s: int8 weights not read (%s)", model, exc.one_line())
    return {"source": "vela --enable-debug-db (perf, perf_debug, source tables)", "layers": layers,
            "summary": summarize_layers(layers)}


def layer_of_tensor(tensor_name: str, layer_names: Iterable[str]) -> str | None:
    """The Keras layer a TFLite weight tensor came from, by the names in its ';'/'/'-separated parts."""
    from .keras_model import base_name

    names = set(layer_names)
    segments = [base_name(seg) for part in tensor_name.split(";") for seg in part.split("/")]
    return next((s for s in segments if s in names), None)


# --------------------------------------------------------------------------- Keras models (TensorFlow)


def fold_batch_norm(model):
    """Fold every BatchNormalization that directly follows a Conv2D/DepthwiseConv2D/Dense into its kernel and bias.

    Returns (model, {layer name: the per-output-channel factor gamma / sqrt(var + eps) folded into its kernel}).
    The function is unchanged (inference mode); the converter then has no per-channel factor left to multiply
    into a palette kernel.
    """
    from . import tfenv
    from .keras_model import bypass_layers, inner

    keras = tfenv.load().keras
    if model.__class__.__name__ != "Functional":
        return model, {}
    pairs = {}
    for layer in model.layers:
        if inner(layer).__class__.__name__ not in KERNEL_LAYERS:
            continue
        consumers = [n.outbound_layer for n in layer._outbound_nodes]
        if len(consumers) == 1 and consumers[0].__class__.__name__ == "BatchNormalization":
            bn = consumers[0]
            if len(bn._inbound_nodes) == 1 and bn.get_config().get("axis") in (-1, [-1], [3], 3, [1], 1):
                pairs[layer.name] = bn
    if not pairs:
        return model, {}
    config = model.get_config()
    rename = {bn.name: conv for conv, bn in pairs.items()}
    for spec in config["layers"]:
        if spec["name"] in pairs:
            spec["config"]["use_bias"] = True
    new = keras.Model.from_config(bypass_layers(config, rename))
    factors = {}
    for layer in new.layers:
        old = model.get_layer(layer.name)
        if layer.name not in pairs:
            layer.set_weights(old.get_weights())
            continue
        bn = pairs[layer.name]
        weights = old.get_weights()
        kernel = weights[0]
        bias = weights[1] if len(weights) > 1 else np.zeros(_out_channels(old, kernel), dtype=np.float32)
        gamma, beta, mean, var = _bn_params(bn)
        factor = gamma / np.sqrt(var + bn.epsilon)
        factors[layer.name] = factor.astype(np.float32)
        if old.__class__.__name__ == "DepthwiseConv2D":
            kh, kw, cin, mult = kernel.shape
            kernel = (kernel.reshape(kh, kw, cin * mult) * factor).reshape(kernel.shape)
        else:
            kernel = kernel * factor
        layer.set_weights([kernel.astype(np.float32), ((bias - mean) * factor + beta).astype(np.float32)])
    return new, factors


def _out_channels(layer, kernel) -> int:
    if layer.__class__.__name__ == "DepthwiseConv2D":
        return kernel.shape[2] * kernel.shape[3]
    return kernel.shape[-1]


def _bn_params(bn):
    cfg = bn.get_config()
    values = list(bn.get_weights())
    n = values[-1].shape[0]
    gamma = values.pop(0) if cfg.get("scale", True) else np.ones(n, np.float32)
    beta = values.pop(0) if cfg.get("center", True) else np.zeros(n, np.float32)
    mean, var = values[0], values[1]
    return gamma, beta, mean, var


def kernel_layers(model, skip: Iterable[str] = ()) -> list[tuple[str, str]]:
    """(layer name, kind) of every Conv2D/DepthwiseConv2D/Dense with a kernel, minus ``skip``."""
    from .keras_model import base_name, inner

    skip = set(skip)
    out = []
    for layer in model.layers:
        kind = inner(layer).__class__.__name__
        if kind in KERNEL_LAYERS and base_name(layer.name) not in skip:
            out.append((base_name(layer.name), kind))
    return out


MAX_HESSIAN_ROWS = 200_000  # input positions per batch that feed a layer's hessian (a seeded subsample beyond)


def _hessian_support(layer) -> bool:
    """Whether :func:`layer_hessians` can read this layer's inputs as rows of its flattened kernel."""
    kind = layer.__class__.__name__
    if kind == "Conv2D":
        cfg = layer.get_config()
        return cfg.get("groups", 1) == 1 and cfg.get("data_format", "channels_last") == "channels_last"
    if kind == "DepthwiseConv2D":
        return layer.get_config().get("data_format", "channels_last") == "channels_last"
    return kind == "Dense"


def _input_rows(layer, inputs, tf):
    """The layer's inputs as rows in the order of its flattened kernel: (rows, k) or, depthwise, (rows, k, C)."""
    kind = layer.__class__.__name__
    if kind == "Dense":
        return tf.reshape(inputs, [-1, inputs.shape[-1]])
    cfg = layer.get_config()
    kh, kw = cfg["kernel_size"]
    sh, sw = cfg["strides"]
    dh, dw = cfg["dilation_rate"]
    p = tf.image.extract_patches(inputs, [1, kh, kw, 1], [1, sh, sw, 1], [1, dh, dw, 1], cfg["padding"].upper())
    if kind == "DepthwiseConv2D":  # patch depth is ordered (kh, kw, C)
        return tf.reshape(p, [-1, kh * kw, inputs.shape[-1]])
    return tf.reshape(p, [-1, p.shape[-1]])


def layer_hessians(model, x: np.ndarray, layers: Sequence[str], batch_size: int = 64, seed: int = 0
                   ) -> dict[str, np.ndarray]:
    """Per layer, the second moment ``E[x x^T]`` of its inputs over ``x``, in its flattened kernel's order.

    One pass over ``x`` through a model that outputs every listed layer's input. Conv2D inputs are taken as
    the patches its kernel sees (same strides, dilation and padding); a DepthwiseConv2D gets one matrix per
    channel, shape (channels, k, k). Layers whose inputs cannot be read so (grouped convolutions, several
    inputs) are left out and keep the nearest-level projection.
    """
    from . import tfenv

    env = tfenv.load()
    tf, keras = env.tf, env.keras
    wanted = []
    for name in layers:
        layer = model.get_layer(name)
        if _hessian_support(layer) and len(layer._inbound_nodes) == 1 and not isinstance(layer.input, (list, tuple)):
            wanted.append(layer)
    if not wanted:
        return {}
    probe = keras.Model(model.inputs, [layer.input for layer in wanted])
    sums: dict[str, np.ndarray] = {}
    counts: dict[str, int] = {}
    rng = np.random.default_rng(seed)
    for start in range(0, len(x), batch_size):
        outs = probe(x[start:start + batch_size], training=False)
        outs = outs if isinstance(outs, (list, tuple)) else [outs]
        for layer, inputs in zip(wanted, outs):
            rows = _input_rows(layer, tf.cast(inputs, tf.float32), tf).numpy()
            if rows.shape[0] > MAX_HESSIAN_ROWS:
                rows = rows[np.sort(rng.choice(rows.shape[0], MAX_HESSIAN_ROWS, replace=False))]
            rows = rows.astype(np.float64)
            if rows.ndim == 3:  # depthwise: (rows, k, C) -> (C, k, k)
                part = np.einsum("nic,njc->cij", rows, rows)
            else:
                part = rows.T @ rows
            sums[layer.name] = sums.get(layer.name, 0.0) + part
            counts[layer.name] = counts.get(layer.name, 0) + rows.shape[0]
    from .keras_model import base_name

    out = {}
    for layer in wanted:
        h = sums[layer.name] / max(counts[layer.name], 1)
        if h.ndim == 3:  # output channel c * multiplier + m reads input channel c
            h = np.repeat(h, int(layer.get_config().get("depth_multiplier", 1)), axis=0)
        out[base_name(layer.name)] = h
    return out


def apply_plan(model, plan: Mapping[str, Mapping[str, Any]], seed: int = 0,
               hessians: Mapping[str, np.ndarray] | None = None, scales: str = "peak") -> dict[str, dict[str, Any]]:
    """Project the layers of ``model`` (in place) as ``plan`` says; returns what was done per layer.

    With ``hessians`` (:func:`layer_hessians` of the unprojected model), a layer that has one is projected
    with error compensation (:func:`project_compensated`); the others snap to their nearest palette value.
    ``scales``: how each channel's scale is chosen (:func:`fit_palette_and_scales`).
    """
    done = {}
    for name, setting in plan.items():
        if setting.get("clusters") is None:
            continue
        layer = model.get_layer(name)
        kind = layer.__class__.__name__
        weights = layer.get_weights()
        clusters, sparsity = int(setting["clusters"]), float(setting.get("sparsity") or 0.0)
        if hessians is not None and name in hessians:
            p = project_compensated(weights[0], kind, hessians[name], clusters, sparsity, seed=seed, scales=scales)
            method = "gptq"
        else:
            p = project(weights[0], kind, clusters, sparsity, seed=seed, scales=scales)
            method = "nearest"
        layer.set_weights([p.kernel, *weights[1:]])
        done[name] = {"palette": p.palette.tolist(), "sparsity": round(p.sparsity, 4),
                      "distinct_int8_per_channel_quant": p.distinct_int8, "method": method}
    return done


# --------------------------------------------------------------------------- recipe helpers


def default_plan(model, recipe) -> dict[str, dict[str, Any]]:
    """Every eligible layer at the recipe's clusters, with per-layer overrides from ``[layers.NAME]``."""
    layers = getattr(recipe, "layers", {}) or {}
    plan = {}
    for name, _kind in kernel_layers(model, recipe.skip_layers):
        over = layers.get(name, {})
        plan[name] = {"clusters": int(over.get("clusters", recipe.clusters)),
                      "sparsity": float(over.get("sparsity", 0.0))}
    return plan


def _palette_opt(recipe, key: str, default):
    return (getattr(recipe, "palette", None) or {}).get(key, default)


HESSIAN_SAMPLES = 1000  # fine-tune samples (random, seeded) whose layer inputs drive the error compensation


def projection_method(recipe) -> str:
    """``[palette] projection``: "gptq" (default, error-compensating) or "nearest" (each weight to its nearest value)."""
    return str(_palette_opt(recipe, "projection", PALETTE_DEFAULTS["projection"]))


def scale_method(recipe) -> str:
    """``[palette] scales``: "peak" (default, max|w| / 127 per channel) or "fitted" (:func:`fitted_scales`)."""
    return str(_palette_opt(recipe, "scales", PALETTE_DEFAULTS["scales"]))


# --------------------------------------------------------------------------- the sensitivity sweep


MEASURE_SAMPLES = 4000  # most fine-tune samples the sweep measures drops on ([palette] measure_samples)
_WORKER: dict[str, Any] = {}  # what a sweep worker process loaded once
_CLASSES: list[Any] = []  # the palette quantizer classes, made once per process (they need TFMOT)


def _worker_init(model_path: str, x_path: str, y_path: str, hessian_path: str | None = None,
                 from_logits: bool = False, scales: str = "peak") -> None:
    from . import tfenv

    env = tfenv.load()
    _WORKER["model"] = env.keras.models.load_model(model_path, compile=False)
    _WORKER["x"] = np.load(x_path)
    _WORKER["y"] = np.load(y_path)
    _WORKER["hessians"] = load_hessians(Path(hessian_path)) if hessian_path else None
    _WORKER["from_logits"] = from_logits
    _WORKER["scales"] = scales


def save_hessians(hessians: Mapping[str, np.ndarray], path: Path) -> Path:
    """Write :func:`layer_hessians` to ``path`` (.npz, one array per layer)."""
    np.savez(path, **{name: np.asarray(h) for name, h in hessians.items()})
    return path


def load_hessians(path: Path) -> dict[str, np.ndarray]:
    with np.load(path) as f:
        return {name: f[name] for name in f.files}


def _scores(model, x, y, from_logits: bool = False) -> tuple[float, float]:
    """Top-1 accuracy (%) and mean cross-entropy (nats) of ``model`` on labelled samples."""
    from .finetune import log_probs

    lp = log_probs(model.predict(x, batch_size=512, verbose=0), from_logits)
    return float(np.mean(np.argmax(lp, axis=-1) == y)) * 100.0, float(-np.mean(lp[np.arange(len(y)), y]))


def evaluate_item(layer: str, setting: dict[str, Any], seed: int) -> dict[str, Any]:
    """One sweep item, in a worker: accuracy and loss on the measured samples with only ``layer`` projected."""
    model = _WORKER["model"]
    target = model.get_layer(layer)
    saved = target.get_weights()
    try:
        done = apply_plan(model, {layer: setting}, seed, _WORKER.get("hessians"), _WORKER["scales"])
        acc, loss = _scores(model, _WORKER["x"], _WORKER["y"], bool(_WORKER.get("from_logits")))
    finally:
        target.set_weights(saved)
    return {"layer": layer, "setting": setting, "accuracy": acc, "loss": loss, "projection": done.get(layer)}


def _ray_item(model_path: str, x, y, hessians, from_logits: bool, layer: str, setting: dict[str, Any],
              seed: int, scales: str = "peak") -> dict[str, Any]:
    if "model" not in _WORKER or _WORKER.get("path") != model_path:
        from . import tfenv

        _WORKER["model"] = tfenv.load().keras.models.load_model(model_path, compile=False)
        _WORKER["path"] = model_path
    _WORKER.update(x=x, y=y, hessians=hessians, from_logits=from_logits, scales=scales)
    return evaluate_item(layer, setting, seed)


def run_items(items: Sequence[tuple[str, dict[str, Any]]], model_path: Path, x: np.ndarray, y: np.ndarray,
              work: Path, executor: str = "process", workers: int = 2, seed: int = 0,
              hessians: Mapping[str, np.ndarray] | None = None, from_logits: bool = False,
              scales: str = "peak") -> list[dict[str, Any]]:
    """Evaluate independent (layer, setting) items in a local process pool, or as Ray tasks.

    Each item gives the accuracy (%) and mean cross-entropy (``from_logits``: the model outputs logits) on
    ``x, y`` with only its layer projected.

    With ``hessians`` (the unprojected model's, :func:`layer_hessians`) items use the error-compensating
    projection, as the palette node does.
    """
    if executor not in EXECUTORS:
        raise UsageError(f"palette executor '{executor}' is unknown", f"use one of {', '.join(EXECUTORS)}")
    if executor == "ray":
        try:
            import ray
        except ImportError as exc:
            raise UsageError("palette executor 'ray' needs Ray", "pip install -e .[ray]") from exc
        started = not ray.is_initialized()
        if started:
            from .ray_executor import init_ray

            address = os.environ.get("RAY_ADDRESS")  # a cluster sets its own CPUs
            init_ray(ray, {"include_dashboard": False, "log_to_driver": False,
                           **({} if address else {"num_cpus": max(1, workers)})}, address)
        try:
            task = ray.remote(_ray_item)
            xr, yr, hr = ray.put(x), ray.put(y), ray.put(None if hessians is None else dict(hessians))
            return ray.get([task.remote(str(model_path), xr, yr, hr, from_logits, layer, setting, seed, scales)
                            for layer, setting in items])
        finally:
            if started:
                from .ray_executor import shutdown_ray

                shutdown_ray(ray)
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor
    from concurrent.futures.process import BrokenProcessPool

    from .errors import ToolFailedError

    x_path, y_path = work / "measure_x.npy", work / "measure_y.npy"
    np.save(x_path, x)
    np.save(y_path, y)
    h_path = None if hessians is None else str(save_hessians(hessians, work / "hessians.npz"))
    with ProcessPoolExecutor(max_workers=max(1, workers), mp_context=multiprocessing.get_context("spawn"),
                             initializer=_worker_init,
                             initargs=(str(model_path), str(x_path), str(y_path), h_path, from_logits,
                                       scales)) as pool:
        futures = [pool.submit(evaluate_item, layer, setting, seed) for layer, setting in items]
        try:
            return [f.result() for f in futures]
        except BrokenProcessPool as exc:
            raise ToolFailedError("a worker of the palette sweep stopped abruptly (out of memory, or a script "
                                  "that starts edgedeploy without an `if __name__ == \"__main__\":` guard)",
                                  "set [palette] workers = 1, or guard the script's entry point") from exc


ALL_WEIGHTS = "*"  # layer_bytes: the key of a model's encoded weights over every weight operator
REFERENCE = "reference"  # sensitivity_sweep: the model a size budget is a fraction of


def layer_bytes(models: Mapping[str, Path], target_name: str, work: Path, layer_names: Sequence[str]
                ) -> dict[str, dict[str, int]]:
    """Vela-encoded weight bytes per Keras layer of each int8 model (key -> layer -> bytes), Vela in workers.

    Each model's entry also holds, under :data:`ALL_WEIGHTS`, its encoded weights over every NPU operator.
    """
    from . import vela as vela_backend
    from .targets import get_target
    from .tflite_model import read_tflite, read_weight_tensors
    from .vela_pool import VelaPool, default_jobs

    target = get_target(target_name)
    out: dict[str, dict[str, int]] = {}
    with VelaPool(default_jobs(len(models))) as pool:
        jobs = {}
        for key, model in models.items():
            folder = work / f"vela_{key}"
            folder.mkdir(parents=True, exist_ok=True)
            args = vela_backend.build_vela_args(model, target, folder, "Performance", ("--enable-debug-db",))
            jobs[key] = (folder, pool.submit(args, folder / "vela.log"))
        for key, (folder, future) in jobs.items():
            res = future.result()
            xml = next(folder.glob("*_debug.xml"), None)
            if res.returncode != 0 or xml is None:
                tail = (folder / "vela.log").read_text(errors="replace").strip().splitlines()[-2:]
                from .errors import ToolFailedError

                raise ToolFailedError(f"Vela failed on {models[key]} for {target.name}: {' | '.join(tail)}",
                                      "check that the palette sweep's int8 models convert cleanly")
            rows = weight_layers(parse_debug_db(xml.read_text(encoding="utf-8")))
            attach_int8(rows, read_tflite(models[key]).operators, read_weight_tensors(models[key]))
            sizes: dict[str, int] = {ALL_WEIGHTS: int(sum(int(r["encoded_weight_bytes"]) for r in rows))}
            for r in rows:
                layer = layer_of_tensor(r.get("tensor") or "", layer_names)
                if layer is not None:
                    sizes[layer] = sizes.get(layer, 0) + int(r["encoded_weight_bytes"])
            out[key] = sizes
    return out


def sensitivity_sweep(model, data, recipe, work: Path, hessians: Mapping[str, np.ndarray] | None = None,
                      from_logits: bool = False, reference=None) -> dict[str, Any]:
    """Per layer x setting: accuracy drop and Vela-encoded bytes; then the plan that fits the budget.

    The budget is ``[palette] accuracy_budget`` (the plan of fewest bytes within it) or, when
    ``[palette] size_budget`` is set, a size: the plan of least drop whose encoded weights are at most that
    fraction of ``reference``'s (a float Keras model, converted to int8 as the ptq leaf is; the tree's
    baseline), found by :func:`sized_plan`.

    ``hessians`` (:func:`layer_hessians` of ``model``) make every projection of the sweep the error-compensating
    one the palette node then applies; without them layers snap to their nearest palette values.

    A drop is judged, by default (``[palette] drop_estimate = "loss"``), as the rise of the mean cross-entropy
    on the measured samples times the points-per-nat slope fitted over the sweep's own single-layer items
    (:func:`drop_per_loss`); ``"accuracy"`` takes the measured accuracy drop itself. Both are recorded.
    """
    from .convert import convert_int8

    t0 = time.perf_counter()
    clusters = tuple(_palette_opt(recipe, "clusters", (4, 8, 16)))
    sparsities = tuple(_palette_opt(recipe, "sparsities", (0.0, 0.6)))
    budget = float(_palette_opt(recipe, "accuracy_budget", 0.3))
    executor = str(_palette_opt(recipe, "executor", "process"))
    workers = int(_palette_opt(recipe, "workers", 2))
    target = str(_palette_opt(recipe, "target", "ethos-u55-128"))
    if _palette_opt(recipe, "measure_on", "fine-tune") == "fine-tune":
        # Drops are paired differences (the same samples with and without a setting), so the samples the
        # parent was fine-tuned on serve; the whole labelled fine-tune split resolves them ten times finer than
        # a 10% hold-out, where one sample of 300 is already a third of a point.
        hold = np.flatnonzero(np.asarray(data.y_fit) >= 0)
        hold_from = "every labelled sample of the fine-tune split"
        cap = int(_palette_opt(recipe, "measure_samples", MEASURE_SAMPLES))
        if len(hold) > cap:  # the sweep's time grows with the samples; a few thousand resolve 0.05 points
            hold = np.sort(np.random.default_rng(recipe.seed).choice(hold, cap, replace=False))
            hold_from = f"{cap} labelled samples of the fine-tune split (random, seed {recipe.seed})"
    else:
        _, hold, hold_from = sweep_holdout(data, recipe)
    if len(hold) == 0:
        raise UsageError("the palette sweep has no labelled samples to measure on",
                         "set [selection] validation_fraction > 0 or [palette] holdout = 0.2")
    x_hold, y_hold = data.x_fit[hold], data.y_fit[hold]
    layers = [name for name, _ in kernel_layers(model, recipe.skip_layers)]
    # Every layer gets a palette; the largest (Vela's limit) is where the walk starts.
    clusters = tuple(sorted(set(clusters) | {PALETTE_LIMIT}))
    settings = candidate_settings(clusters, sparsities)
    work.mkdir(parents=True, exist_ok=True)
    model_path = work / "parent.h5"
    model.save(model_path, include_optimizer=False)
    base_acc, base_loss = _scores(model, x_hold, y_hold, from_logits)
    items = [(layer, s.to_dict()) for layer in layers for s in settings]
    log.info("palette sweep: %d layers x %d settings on %d samples (%s)", len(layers), len(settings),
             len(hold), executor)
    scales = scale_method(recipe)
    results = run_items(items, model_path, x_hold, y_hold, work, executor, workers, recipe.seed, hessians,
                        from_logits, scales)
    estimate = str(_palette_opt(recipe, "drop_estimate", PALETTE_DEFAULTS["drop_estimate"]))
    slope = drop_per_loss([base_acc - r["accuracy"] for r in results], [r["loss"] - base_loss for r in results])
    if estimate == "loss" and slope is None:
        log.warning("palette sweep: too few single-layer items to relate loss to accuracy; judging measured drops")

    def judge(acc: float, loss: float) -> dict[str, float]:
        measured = base_acc - acc
        drop = slope * (loss - base_loss) if estimate == "loss" and slope is not None else measured
        return {"drop": round(drop, 3), "measured_drop": round(measured, 3),
                "loss_rise": round(loss - base_loss, 5)}

    # Encoded bytes: one int8 model per setting, every layer projected alike (Vela encodes each layer alone).
    calibration, _ = data.calibration(recipe.calibration_samples, recipe.seed)
    models = {}
    from . import tfenv

    keras = tfenv.load().keras
    for key, setting in [(s.key, s) for s in settings]:
        m = keras.models.clone_model(model)
        m.set_weights(model.get_weights())
        apply_plan(m, {layer: setting.to_dict() for layer in layers}, recipe.seed, hessians, scales)
        path = work / f"{key}.tflite"
        path.write_bytes(convert_int8(m, calibration, float_io=recipe.float_io))
        models[key] = path
    size_budget = _palette_opt(recipe, "size_budget", None)
    if size_budget is not None:
        if reference is None:
            raise UsageError("the palette sweep's size budget needs the model it is a fraction of",
                             "run it from `edgedeploy optimize`, which passes the baseline")
        models[REFERENCE] = work / f"{REFERENCE}.tflite"
        models[REFERENCE].write_bytes(convert_int8(reference, calibration, float_io=recipe.float_io))
    sizes = layer_bytes(models, target, work, layers)
    options: dict[str, list[dict[str, Any]]] = {layer: [] for layer in layers}
    for r in results:
        s = LayerSetting(r["setting"]["clusters"], r["setting"]["sparsity"])
        b = sizes.get(s.key, {}).get(r["layer"])
        if b is None:
            continue
        options[r["layer"]].append({"setting": s.to_dict(), "bytes": b, **judge(r["accuracy"], r["loss"]),
                                    "accuracy": round(r["accuracy"], 3)})
    options = {k: v for k, v in options.items() if v}
    # Single-layer drops do not add up: walk the moves and check each on the whole model.
    # Memoized: a size-budget walk that keeps no move asks again for the start plan judged here.
    @memoized
    def joint_drop(plan: Mapping[str, Mapping[str, Any]]) -> dict[str, float]:
        m = keras.models.clone_model(model)
        m.set_weights(model.get_weights())
        apply_plan(m, plan, recipe.seed, hessians, scales)
        return judge(*_scores(m, x_hold, y_hold, from_logits))

    start = start_options(options)
    start_judged = joint_drop({k: v["setting"] for k, v in start.items()})
    start_drop = start_judged["drop"]
    # "palette" (default): the budget counts from the start (every layer at Vela's 32 values, which every
    # palette leaf needs anyway and which QAT trains back), so a model whose 32-value palette alone is over
    # budget can still trade accuracy for bytes; when the start loses nothing this is the same as "parent",
    # where the budget counts from the parent model.
    budget_from = str(_palette_opt(recipe, "budget_from", "palette"))
    effective = budget + (max(start_drop, 0.0) if budget_from == "palette" else 0.0)
    sized = None
    if size_budget is None:
        chosen, steps = greedy_plan(options, joint_drop, effective)
    else:
        # Weight operators outside the sweep's layers (skipped layers) keep their bytes in every plan.
        fixed = max(v[ALL_WEIGHTS] - sum(v.get(layer, 0) for layer in options) for k, v in sizes.items()
                    if k != REFERENCE)
        reference_bytes = sizes[REFERENCE][ALL_WEIGHTS]
        limit = int(float(size_budget) * reference_bytes) - fixed
        found = sized_plan(options, joint_drop, limit, max(start_drop, 0.0))
        chosen, steps = found["plan"], found["steps"]
        sized = {"size_budget": float(size_budget), "reference_encoded_bytes": reference_bytes,
                 "fixed_encoded_bytes": fixed, "encoded_bytes": found["bytes"] + fixed,
                 "fraction_of_reference": round((found["bytes"] + fixed) / reference_bytes, 4),
                 "fits": found["fits"], "walks": found["walks"]}
        if not found["fits"]:
            log.warning("palette sweep: even the smallest plan (%d encoded bytes, %.3f of the baseline's) is over "
                        "the size budget of %.3f; add smaller [palette] clusters or larger sparsities",
                        found["bytes"] + fixed, sized["fraction_of_reference"], float(size_budget))
    kept = [st for st in steps if st["kept"]]
    final = joint_drop(chosen)  # judged already (as the start or a step), so read from the memo
    checks = {"start": f"every layer at {PALETTE_LIMIT} palette values", "start_drop": round(start_drop, 3),
              "start_measured_drop": start_judged["measured_drop"],
              "start_encoded_bytes": int(sum(o["bytes"] for o in start.values())),
              "steps_tried": len(steps), "steps_kept": len(kept),
              "drop": final["drop"], "measured_drop": final["measured_drop"],
              "encoded_bytes": plan_bytes(options, chosen)}
    return {
        "plan": chosen,
        "budget_points": None if sized else budget,
        "budget_from": budget_from,
        "effective_budget_points": None if sized else round(effective, 3),
        "size": sized,
        "measured_on": {"samples": len(hold), "from": hold_from,
                        "baseline_accuracy": round(base_acc, 3), "baseline_loss": round(base_loss, 5)},
        "drop_estimate": (estimate if estimate == "accuracy" or slope is not None
                          else "accuracy (too few items for loss)"),
        "points_per_nat": None if slope is None else round(slope, 3),
        "target": target,
        "executor": executor,
        "projection": "gptq" if hessians is not None else "nearest",
        "settings": [s.to_dict() for s in settings],
        "options": options,
        "checks": checks,
        "steps": steps,
        "seconds": round(time.perf_counter() - t0, 1),
    }


# --------------------------------------------------------------------------- QAT that keeps the palette


def _quantizer_classes():
    """The palette weight quantizer (a TFMOT LastValueQuantizer that snaps to the palette first)."""
    if _CLASSES:
        return _CLASSES[0], _CLASSES[1]
    from . import tfenv

    env = tfenv.load()
    tf = env.tf
    from tensorflow_model_optimization.python.core.quantization.keras import quantizers
    from tensorflow_model_optimization.python.core.quantization.keras.default_8bit import (
        default_8bit_quantize_registry as registry,
    )

    class PaletteWeightsQuantizer(quantizers.LastValueQuantizer):
        """Snaps a kernel to ``palette`` x channel scale (straight-through gradient), then fake-quantizes it."""

        def __init__(self, palette, per_axis: bool, depthwise: bool = False):
            super().__init__(num_bits=8, per_axis=per_axis, symmetric=True, narrow_range=True)
            self.palette = [int(v) for v in palette]
            self.depthwise = bool(depthwise)
            # Off once the kernel itself holds palette values (see bake_palettes): the converter then sees the
            # plain constant -> FakeQuant pattern it folds into an int8 tensor.
            self.snap_enabled = True
            # 1 where the parent's kernel is non-zero (set by palette_qat_model): pruned weights stay zero.
            self.mask = None
            # Per-channel factor the layer's variable is multiplied by (see palette_qat_model); None once baked.
            self.gain = None

        def build(self, tensor_shape, name, layer):
            if self.per_axis:
                return registry.default_8bit_quantizers.Default8BitConvWeightsQuantizer.build(
                    self, tensor_shape, name, layer)
            return super().build(tensor_shape, name, layer)

        def _snap(self, w):
            if self.mask is not None:  # before the scales: each channel's largest kept weight maps to ±127
                w = w * tf.cast(self.mask, w.dtype)
            levels = tf.constant(sorted(self.palette), dtype=w.dtype)
            shape = tf.shape(w)
            if self.depthwise:
                flat = tf.reshape(w, [-1, shape[2] * shape[3]])
            else:
                flat = tf.reshape(w, [-1, shape[-1]])
            if self.per_axis or self.depthwise:
                peak = tf.reduce_max(tf.abs(flat), axis=0, keepdims=True)
            else:
                peak = tf.reduce_max(tf.abs(flat))
            scale = peak / QMAX
            safe = tf.where(scale > 0, scale, tf.ones_like(scale))
            x = flat / safe
            idx = tf.argmin(tf.abs(x[..., None] - levels), axis=-1)
            snapped = tf.reshape(tf.gather(levels, idx) * scale, shape)
            if self.mask is not None:
                snapped = snapped * tf.cast(self.mask, snapped.dtype)
            return snapped

        def __call__(self, inputs, training, weights, **kwargs):
            if self.gain is not None:
                inputs = inputs * self.gain
            if self.snap_enabled:
                inputs = inputs + tf.stop_gradient(self._snap(inputs) - inputs)
            if self.depthwise:
                # TFMOT's per-axis quantizer sees one channel in a (kh, kw, C, 1) kernel, i.e. one scale for the
                # tensor, which would move the palette values; snapped values are already exact int8 values of
                # their channel scale, and the converter quantizes depthwise kernels per channel itself.
                return inputs
            return super().__call__(inputs, training, weights, **kwargs)

        def get_config(self):
            return {"palette": self.palette, "per_axis": self.per_axis, "depthwise": self.depthwise}

        @classmethod
        def from_config(cls, config):
            return cls(**config)

    class PaletteQuantizeConfig(registry.Default8BitQuantizeConfig):
        def __init__(self, weight_attrs, activation_attrs, quantize_output, palette, per_axis, depthwise=False):
            super().__init__(weight_attrs, activation_attrs, quantize_output)
            self.palette, self.per_axis, self.depthwise = list(palette), bool(per_axis), bool(depthwise)
            self.weight_quantizer = PaletteWeightsQuantizer(self.palette, self.per_axis, self.depthwise)

        def get_config(self):
            return {"weight_attrs": self.weight_attrs, "activation_attrs": self.activation_attrs,
                    "quantize_output": self.quantize_output, "palette": self.palette, "per_axis": self.per_axis,
                    "depthwise": self.depthwise}

    _CLASSES[:] = [PaletteWeightsQuantizer, PaletteQuantizeConfig]
    return PaletteWeightsQuantizer, PaletteQuantizeConfig


def qat_palettes(parent, plan: Mapping[str, Mapping[str, Any]], seed: int = 0) -> dict[str, dict[str, Any]]:
    """Per palette layer, the quantizer granularity QAT uses and the palette under it (from the parent kernel).

    Conv2D and DepthwiseConv2D are quantized per channel, as the parent node was projected, so their palette
    is read from the parent kernel. TFMOT quantizes Dense kernels per tensor: their palette is fitted anew.
    """
    out = {}
    for name, setting in plan.items():
        if setting.get("clusters") is None:
            continue
        layer = parent.get_layer(name)
        kind = layer.__class__.__name__
        kernel = layer.get_weights()[0]
        per_tensor = kind == "Dense"
        x, _ = normalized(channels_last(kernel.astype(np.float64), kind), per_tensor)
        palette = fit_palette(x, int(setting["clusters"]), keep_zero=bool(np.any(kernel == 0)), seed=seed)
        out[name] = {"kind": kind, "per_axis": not per_tensor, "palette": palette.tolist()}
    return out


def palette_qat_model(parent, plan: Mapping[str, Mapping[str, Any]], seed: int = 0,
                      folded: Mapping[str, Any] | None = None):
    """The QAT model of a palette node: TFMOT's default 8-bit scheme, palette quantizers on the palette layers.

    ``folded`` maps a layer to the batch-norm factors folded into its kernel (:func:`fold_batch_norm`). Those
    layers train in the units of their kernel before folding, as TFMOT's QAT of the unfolded model does: the
    variable holds kernel / |factor| and the quantizer multiplies it back. Adam moves every variable by about
    the learning rate per step whatever its size, and folding scales kernels by x0.014 (ResNet-8's first
    convolution) to x7 (DS-CNN's depthwise ones); trained as folded, such a layer's steps are some 70x too
    large (each one moving a weight by up to a tenth of itself) or several times too small.
    """
    from . import tfenv

    env = tfenv.load()
    quant = env.tfmot.quantization.keras
    from .keras_model import clone, quantize_for_qat

    quantizer_cls, config_cls = _quantizer_classes()
    palettes = qat_palettes(parent, plan, seed)

    def annotate(layer):
        info = palettes.get(layer.name)
        if info is None:
            return layer
        attr = kernel_attr(info["kind"] == "DepthwiseConv2D")
        # TFMOT's quantize-aware activations have no relu6 (a fused ReLU6, see fuse_separate_relu): the layer then
        # keeps its own activation and its output is fake-quantized after it, as the converter fuses them
        own = layer.get_config().get("activation") == "relu6"
        config = config_cls([attr], [] if own else ["activation"], own, info["palette"], info["per_axis"],
                            info["kind"] == "DepthwiseConv2D")
        return quant.quantize_annotate_layer(layer, quantize_config=config)

    base = clone(parent)
    annotated = env.keras.models.clone_model(base, clone_function=annotate)
    annotated.set_weights(base.get_weights())
    model = quantize_for_qat(annotated, custom_objects={"PaletteQuantizeConfig": config_cls,
                                                        "PaletteWeightsQuantizer": quantizer_cls}, what="palette QAT")
    from .keras_model import base_name

    for layer, quantizer in palette_layers(model):
        kernel = parent.get_layer(base_name(layer.name)).get_weights()[0]
        # keep the parent's zeros (its pruning) in every forward pass
        quantizer.mask = env.tf.constant((kernel != 0).astype(np.float32))
        factor = (folded or {}).get(base_name(layer.name))
        if factor is not None:
            gain = np.abs(np.asarray(factor, np.float32))
            gain = np.where(gain > 0, gain, 1.0).astype(np.float32)
            gain = gain.reshape(kernel.shape[2:] if quantizer.depthwise else kernel.shape[-1:])
            quantizer.gain = env.tf.constant(gain)
            kernel_variable(layer, quantizer).assign(kernel / gain)
    return model


def palette_layers(model) -> Iterator[tuple[Any, Any]]:
    """(layer, palette weight quantizer) of every palette layer of a palette QAT model."""
    quantizer_cls, _ = _quantizer_classes()
    for layer in model.layers:
        quantizer = getattr(getattr(layer, "quantize_config", None), "weight_quantizer", None)
        if isinstance(quantizer, quantizer_cls):
            yield layer, quantizer


def palette_kind(quantizer) -> str:
    """The layer kind a palette quantizer stands for (as :func:`channels_last` names it)."""
    return "DepthwiseConv2D" if quantizer.depthwise else ("Conv2D" if quantizer.per_axis else "Dense")


def kernel_attr(depthwise: bool) -> str:
    """The name of a kernel layer's weight attribute (and of its variable and fake-quant ranges)."""
    return "depthwise_kernel" if depthwise else "kernel"


def kernel_variable(layer, quantizer):
    """The kernel variable of a TFMOT-wrapped palette layer (the wrapper leaves the quantized tensor in the
    layer's attribute, so it is found by name)."""
    return next(w for w in layer.weights if w.name.split("/")[-1] == f"{kernel_attr(quantizer.depthwise)}:0")


def load_palette_qat(parent_path: Path, weights_path: Path, plan: Mapping[str, Mapping[str, Any]], seed: int = 0,
                     folded: Mapping[str, Any] | None = None):
    """The trained QAT model of a palette node, its kernels snapped to their palettes (ready to convert)."""
    from . import tfenv

    parent = tfenv.load().keras.models.load_model(parent_path, compile=False)
    model = palette_qat_model(parent, plan, seed, folded)
    model.load_weights(weights_path)
    bake_palettes(model)
    return model


def bake_palettes(model) -> list[str]:
    """Write each palette layer's snapped kernel into its variable and stop snapping in the graph.

    The forward pass is unchanged (snapping a snapped kernel is the identity); the converter then finds the
    constant -> FakeQuant pattern it turns into an int8 tensor.
    """
    baked = []
    for layer, quantizer in palette_layers(model):
        attr = kernel_attr(quantizer.depthwise)
        variable = kernel_variable(layer, quantizer)
        kernel = variable.numpy()
        if quantizer.gain is not None:
            kernel = kernel * quantizer.gain.numpy()
            quantizer.gain = None
        kind = palette_kind(quantizer)
        if quantizer.mask is not None:
            kernel = kernel * quantizer.mask.numpy()
        p = project(kernel, kind, len(quantizer.palette), per_tensor=not quantizer.per_axis and not quantizer.depthwise,
                    palette=np.asarray(quantizer.palette))
        variable.assign(p.kernel)
        # The fake-quant ranges TFMOT stored at the last training step can differ slightly from the final
        # kernel's channel maxima; the converter takes its scales from them, so set them to the kernel's.
        # (Depthwise kernels skip TFMOT's fake quant, whose one range would span all channels: nothing to set.)
        flat = channels_last(p.kernel, kind)
        peak = np.abs(flat).max(axis=0) if quantizer.per_axis else np.abs(flat).max()
        for w in ([] if quantizer.depthwise else layer.weights):
            short = w.name.split("/")[-1]
            if short in (f"{attr}_min:0", f"{attr}_max:0"):
                value = np.broadcast_to(-peak if short.endswith("_min:0") else peak, w.shape).astype(np.float32)
                w.assign(value)
        quantizer.snap_enabled = False
        baked.append(layer.name)
    return baked


# --------------------------------------------------------------------------- stages


def read_plan(folder: Path) -> dict[str, Any]:
    """A palette node's plan file: its per-layer plan and the batch-norm factors folded into its kernels."""
    path = Path(folder) / PLAN_FILE
    if not path.is_file():
        raise InvalidInputError(f"{path} is missing", "re-run `edgedeploy optimize` (the palette node writes it)")
    doc = json.loads(path.read_text(encoding="utf-8"))
    if doc.get("version") != PALETTE_PLAN_VERSION:
        raise InvalidInputError(f"{path} was written by an older edgedeploy",
                                "re-run `edgedeploy optimize` to redo the palette nodes")
    return doc


def write_plan(folder: Path, node: str, plan: Mapping[str, Any], folded: Mapping[str, Any]) -> Path:
    """Write the plan file :func:`read_plan` reads (``folded``: :func:`fold_batch_norm`'s factors)."""
    path = Path(folder) / PLAN_FILE
    doc = {"version": PALETTE_PLAN_VERSION, "node": node, "plan": dict(plan),
           "batch_norm_factors": {name: np.asarray(f, np.float32).tolist() for name, f in folded.items()}}
    path.write_text(json.dumps(doc, indent=2) + "\n", encoding="utf-8")
    return path


def sweep_holdout(data, recipe) -> tuple[np.ndarray, np.ndarray, str]:
    """Indices (train, hold-out) of the fine-tune split for the sweep, and where the hold-out comes from.

    By default the sweep uses the stage training's own hold-out (``[selection] validation_fraction``: no node
    trains on it); ``[palette] holdout = F`` sets aside a seeded random fraction F of the fine-tune split instead.
    Unlabelled samples are never in the hold-out. The evaluation split is never used.
    """
    fraction = _palette_opt(recipe, "holdout", None)
    shared = float(getattr(recipe, "validation_fraction", 0.0) or 0.0)
    y = np.asarray(data.y_fit)
    if fraction is None and shared > 0:
        try:
            from .finetune import holdout_split as stratified
        except ImportError:  # pragma: no cover - an older tree without stage hold-outs
            stratified = None
        if stratified is not None:
            train, hold = stratified(y, shared, recipe.seed)
            return train, hold[y[hold] >= 0], (f"the stage training's hold-out ({shared:g} of the fine-tune split, "
                                               f"stratified, seed {recipe.seed})")
    fraction = 0.2 if fraction is None else float(fraction)
    train, hold = holdout_split(len(y), fraction, recipe.seed)
    return train, hold[y[hold] >= 0], f"a random {fraction:g} of the fine-tune split (seed {recipe.seed})"


def _fit_data(data, recipe):
    """The data palette QAT trains on: with ``[palette] holdout`` set, the fine-tune split less that slice."""
    if _palette_opt(recipe, "holdout", None) is None:
        return data  # the stage training keeps its own hold-out out of training
    train, _, _ = sweep_holdout(data, recipe)
    soft = getattr(data, "soft_targets", None)
    extra = {"soft_targets": soft[train]} if soft is not None else {}
    return replace(data, x_fit=data.x_fit[train], y_fit=data.y_fit[train], **extra)


def int8_palette_rows(int8: bytes, model, plan: Mapping[str, Mapping[str, Any]], tmp: Path) -> list[dict[str, Any]]:
    """Per weight tensor of the int8 model: its Keras layer, distinct values, zeros (and those of the layer's kernel
    in ``model``, the Keras model it was converted from), and the palette it must fit."""
    from .keras_model import keras_weight_stats
    from .tflite_model import read_weight_tensors

    path = tmp / "_palette_probe.tflite"
    path.write_bytes(int8)
    try:
        tensors = read_weight_tensors(path)
    finally:
        path.unlink()
    names = [n for n, _ in kernel_layers(model)]
    keras_zeros = {st.layer: round(st.sparsity, 4) for st in keras_weight_stats(model)}
    rows = []
    for t in tensors:
        if t.op not in WEIGHT_OPS or t.dtype != "int8":
            continue
        values = t.values()
        layer = layer_of_tensor(t.name, names)
        setting = plan.get(layer or "", {})
        rows.append({"layer": layer, "op": t.op, "shape": list(t.shape), "scales": len(t.scale),
                     "distinct": int(np.unique(values).size), "sparsity": round(float(np.mean(values == 0)), 4),
                     "clusters": setting.get("clusters"), "target_sparsity": setting.get("sparsity"),
                     "keras_sparsity": keras_zeros.get(layer or "")})
    return rows


def check_palette(node: str, rows: Sequence[dict[str, Any]], tolerance: float) -> tuple[list[dict[str, Any]], list[str]]:
    """Judge int8 weight tensors of a palette leaf: ≤ clusters distinct values per TENSOR, sparsity kept.

    A planned layer's int8 tensor keeps at least the zeros of its Keras kernel (the pruned parent's, which the
    palette node and its QAT keep in every layer they were in, plus the plan's extra sparsity), less
    ``tolerance``. A layer the plan keeps as its parent left it (clusters None) is only held to Vela's palette
    limit (a warning when over it). Returns (rows with status and note, failures).
    """
    failures, out = [], []
    for r in rows:
        r = dict(r)
        problems = []
        if r["clusters"] is not None:
            limit = int(r["clusters"])
            if r["distinct"] > limit:
                problems.append(f"{r['distinct']} distinct int8 values per tensor > {limit}")
            want = max(float(r.get("target_sparsity") or 0.0), float(r.get("keras_sparsity") or 0.0))
            if want > 0 and r["sparsity"] < want - tolerance:
                problems.append(f"sparsity {r['sparsity']:.3f} < target {want:.2f} - {tolerance:.2f}")
            r["status"], r["note"] = ("failed", "; ".join(problems)) if problems else (
                "ok", f"{r['distinct']} ≤ {limit} values per tensor: one palette for Vela")
        elif r["layer"] is None:
            r["status"], r["note"] = "ok", "not a Keras kernel layer"
        else:
            over = r["distinct"] > PALETTE_LIMIT
            r["status"] = "warning" if over else "ok"
            r["note"] = (f"kept as its parent left it: {r['distinct']} values per tensor"
                         + (f" > Vela's palette of {PALETTE_LIMIT}" if over else ""))
        if problems:
            failures.append(f"{node} (int8): layer {r['layer']}: {r['note']}")
        out.append(r)
    return out, failures


def train_node(env, node: str, inputs: Mapping[str, Path], out: Path, data, recipe, loss):
    """The stage of a palette node (dispatched from :func:`edgedeploy.optimize._train_node`)."""
    from . import optimize
    from .convert import keras_accuracy
    from .keras_model import fuse_separate_relu, keras_weight_stats
    from .manifest import Metric
    from .stages import StageResult

    optimize.tfenv_seed(recipe.seed)
    t0 = time.perf_counter()
    keras = env.keras
    parent = keras.models.load_model(inputs["model"], compile=False)
    details: dict[str, Any] = {"technique": NODES[node][1]}
    warnings: list[str] = []
    fit_data = _fit_data(data, recipe)
    if NODES[node][1] == "palette":
        model, folded = fold_batch_norm(parent)  # (the baseline node split each SeparableConv2D)
        model, fused = fuse_separate_relu(model, relu6=True)  # palette QAT keeps a relu6 activation (see below)
        details.update(folded_batch_norm=sorted(folded), fused_relu=fused)
        plan = default_plan(model, recipe)
        hessians = None
        if projection_method(recipe) == "gptq":
            n = int(_palette_opt(recipe, "hessian_samples", HESSIAN_SAMPLES))
            x_h, h_from = fit_data.calibration(n, recipe.seed)
            hessians = layer_hessians(model, x_h, [name for name, _ in kernel_layers(model, recipe.skip_layers)],
                                      seed=recipe.seed)
            details["compensation"] = {"method": "gptq", "hessian_samples": int(len(x_h)), "from": h_from,
                                       "damp": DAMP, "layers": sorted(hessians)}
        else:
            details["compensation"] = {"method": "nearest"}
        big = sorted(n for n, p in plan.items() if p["clusters"] is not None and p["clusters"] > PALETTE_LIMIT)
        if big:
            warnings.append(f"{', '.join(big)}: more than {PALETTE_LIMIT} clusters, more values than Vela's palette holds")
        if _palette_opt(recipe, "search", False):
            reference = inputs.get("baseline_model")
            if reference is not None:
                reference = keras.models.load_model(reference, compile=False)
            sweep = sensitivity_sweep(model, data, recipe, out / "_sweep", hessians, loss.from_logits, reference)
            plan.update({k: v for k, v in sweep["plan"].items()})
            for name, over in (getattr(recipe, "layers", {}) or {}).items():  # explicit settings win
                if name in plan:
                    plan[name] = {"clusters": int(over.get("clusters", recipe.clusters)),
                                  "sparsity": float(over.get("sparsity", 0.0))}
            details["sweep"] = {k: v for k, v in sweep.items() if k != "plan"}
            import shutil

            shutil.rmtree(out / "_sweep", ignore_errors=True)
        details["scales"] = scale_method(recipe)
        details["projection"] = apply_plan(model, plan, recipe.seed, hessians, details["scales"])
        over = {name: p["distinct_int8_per_channel_quant"] for name, p in details["projection"].items()
                if p["distinct_int8_per_channel_quant"] > int(plan[name]["clusters"])}
        if over:
            name = next(iter(over))
            raise PreservationError(f"stage {node}: layer {name} quantizes to {over[name]} distinct int8 values, more "
                                    f"than its palette of {plan[name]['clusters']}",
                                    "report this model; list the layer in skip_layers to leave it as it is")
        result_model = model
        target = out / optimize.FLOAT_MODEL
        result_model.save(target, include_optimizer=False)
        role = "keras_model"
    else:
        doc = read_plan(Path(inputs["model"]).parent)
        plan, folded = doc["plan"], doc["batch_norm_factors"]
        result_model = palette_qat_model(parent, plan, recipe.seed, folded)
        optimize.start_qat_ranges(result_model, parent, data, recipe, details)
        # The same training budget as TFMOT's cluster + QAT path (the cluster stage's epochs plus the QAT
        # stage's), as one run: one warm-up and one decay at the QAT stage's rate. Two runs back to back
        # restart the warm-up halfway, which on ResNet-8 (2 + 2 epochs) undid the first run's progress.
        epochs = recipe.stage("cluster").epochs + recipe.stage("qat").epochs
        one_run = replace(recipe, stage_epochs={**recipe.stage_epochs, "qat": epochs})
        details["training"] = {"qat": optimize._fit(env, result_model, fit_data, one_run, "qat", loss, node)}
        details["qat_palettes"] = qat_palettes(parent, plan, recipe.seed)
        details["epochs"] = epochs
        details["trained_in"] = "kernel units before batch-norm folding" if folded else "the kernels as they are"
        target = out / optimize.QAT_WEIGHTS
        result_model.save_weights(target)
        role = "qat_weights"
    write_plan(out, node, plan, folded)
    details["plan"] = plan
    details["preservation"] = [s.to_dict() for s in keras_weight_stats(result_model)]
    accuracy = keras_accuracy(result_model, data.x_eval, data.y_eval)
    metrics = {
        "float_accuracy": Metric(round(accuracy, 3), "%", "measured"),
        "train_seconds": Metric(round(time.perf_counter() - t0, 2), "s", "measured"),
    }
    return StageResult(outputs={role: target, "palette_plan": out / PLAN_FILE}, metrics=metrics, details=details,
                       warnings=warnings)


def convert_leaf(env, leaf: str, inputs: Mapping[str, Path], out: Path, data, recipe):
    """The convert stage of a palette leaf (dispatched from :func:`edgedeploy.optimize._convert_leaf`)."""
    from . import optimize
    from .convert import gzip_size, tflite_accuracy
    from .manifest import Metric
    from .stages import StageResult

    optimize.tfenv_seed(recipe.seed)
    t0 = time.perf_counter()
    node = LEAVES[leaf]
    doc = read_plan(Path(inputs["model"]).parent)
    plan = doc["plan"]
    if node in QAT_NODES:
        model = load_palette_qat(inputs["parent_model"], inputs["model"], plan, recipe.seed, doc["batch_norm_factors"])
    else:
        model = env.keras.models.load_model(inputs["model"], compile=False)
    float_acc, int8, calibrated_on = optimize.leaf_int8(model, node in QAT_NODES, leaf, data, recipe)
    target = out / optimize.INT8_MODEL
    target.write_bytes(int8)
    int8_acc = tflite_accuracy(int8, data.x_eval, data.y_eval)
    rows = int8_palette_rows(int8, model, plan, out)
    rows, failures = check_palette(node, rows, recipe.sparsity_tolerance)
    if failures:
        more = f" (and {len(failures) - 1} more)" if len(failures) > 1 else ""
        raise PreservationError(f"stage {leaf} lost its palette: {failures[0]}{more}",
                                "report this model; list the layer in skip_layers to leave it as it is")
    metrics = {
        "float_accuracy": Metric(round(float_acc, 3), "%", "measured"),
        "int8_accuracy": Metric(round(int8_acc, 3), "%", "measured"),
        "tflite_bytes": Metric(len(int8), "B", "measured"),
        "gzip_bytes": Metric(gzip_size(int8), "B", "measured"),
        "max_distinct_int8_per_tensor": Metric(max((r["distinct"] for r in rows), default=0), "count", "measured"),
        "convert_seconds": Metric(round(time.perf_counter() - t0, 2), "s", "measured"),
    }
    warnings = [f"{r['layer']}: {r['note']}" for r in rows if r["status"] == "warning"]
    return StageResult(
        outputs={"int8_model": target},
        metrics=metrics,
        details={
            "node": node,
            "preservation": rows,
            "plan": plan,
            "data": data.describe(),
            "calibration": calibrated_on,
            "accuracy_split": data.describe()["eval_split"],
            "float_io": recipe.float_io,
        },
        warnings=warnings,
    )
