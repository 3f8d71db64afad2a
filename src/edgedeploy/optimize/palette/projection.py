"""Per-tensor integer palettes and the projection of kernels onto them (pure NumPy): nearest-value
snapping (:func:`project`) and the error-compensating, GPTQ-style projection (:func:`project_compensated`)."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ...errors import UsageError
from edgedeploy.config.recipe import PALETTE_CHOICES

from edgedeploy.vela.debugdb import PALETTE_LIMIT  # noqa: E402
QMAX = 127


# palettes (pure NumPy)

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


# error-compensating projection (pure)

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
