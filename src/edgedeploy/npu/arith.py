"""Integer arithmetic of the output stage: scaling by (multiplier, shift) with the NPU's rounding modes.

A scale register holds a 32-bit multiplier and a 6-bit shift: the value is ``x * multiplier / 2**shift``.
Rounding modes (``rounding`` of Vela's registers):

* TFL: TensorFlow Lite's two steps (``SaturatingRoundingDoublingHighMul`` of ``x << max(0, 31 - shift)``
  then ``RoundingDivideByPOT`` by ``max(0, shift - 31)``, ties away from zero), which Vela's
  ``scaling.quantise_scale`` values are made for;
* TRUNCATE: towards zero, in one step;
* NATURAL: ties upwards (add half, shift right), in one step.

Values are int64 NumPy arrays; where a product could leave 63 bits the arithmetic runs on Python integers.
"""

from __future__ import annotations

import numpy as np

INT64_SAFE = 1 << 62


def _big(*arrays) -> bool:
    bound = 1
    for a in arrays:
        a = np.asarray(a)
        bound *= int(np.abs(a).max()) + 1 if a.size else 1
    return bound >= INT64_SAFE


def _obj(a) -> np.ndarray:
    return np.asarray(a).astype(object)


def srdhm(a, b):
    """TFLite's SaturatingRoundingDoublingHighMul on 64-bit products (a * b rounded, divided by 2**31)."""
    big = _big(a, b)
    a_, b_ = (_obj(a), _obj(b)) if big else (np.asarray(a, np.int64), np.asarray(b, np.int64))
    ab = a_ * b_
    nudge = np.where(ab >= 0, 1 << 30, 1 - (1 << 30))
    total = ab + nudge
    # division truncating towards zero
    q = np.where(total >= 0, total // (1 << 31), -((-total) // (1 << 31)))
    return q.astype(np.int64) if not big else q


def rdbpot(x, exponent):
    """TFLite's RoundingDivideByPOT: x / 2**exponent, ties away from zero."""
    exponent = np.asarray(exponent, dtype=np.int64) if not isinstance(exponent, int) else exponent
    x = np.asarray(x)
    obj = x.dtype == object
    e = _obj(exponent) if obj else np.asarray(exponent, np.int64)
    one = 1 if obj else np.int64(1)
    mask = (one << e) - 1
    remainder = x & mask
    threshold = (mask >> 1) + np.where(x < 0, 1, 0)
    return (x >> e) + np.where(remainder > threshold, 1, 0)


def scale(x, multiplier, shift, rounding: str):
    """``x * multiplier / 2**shift`` rounded by ``rounding`` (TFL, TRUNCATE, NATURAL), as int64 (or objects)."""
    x = np.asarray(x)
    multiplier = np.asarray(multiplier, dtype=np.int64)
    shift = np.asarray(shift, dtype=np.int64)
    if rounding == "TFL":
        left = np.maximum(0, 31 - shift)
        right = np.maximum(0, shift - 31)
        big = _big(x, multiplier) or _big(x, 1 << int(left.max()) if left.size else 1, multiplier)
        xs = (_obj(x) << _obj(left)) if big else (x.astype(np.int64) << left)
        return _narrow(rdbpot(srdhm(xs, multiplier), right))
    big = _big(x, multiplier)
    prod = (_obj(x) * _obj(multiplier)) if big else x.astype(np.int64) * multiplier
    sh = _obj(shift) if big else shift
    if rounding == "NATURAL":
        below = np.maximum(shift - 1, 0)
        half = np.where(shift > 0, (_obj(1) << _obj(below)) if big else (np.int64(1) << below), 0)
        return _narrow((prod + half) >> sh)
    if rounding == "TRUNCATE":
        q = np.where(prod >= 0, prod >> sh, -((-prod) >> sh))
        return _narrow(q)
    raise ValueError(rounding)


def _narrow(a):
    """Back to int64 where the values fit (they do after scaling to an output precision)."""
    a = np.asarray(a)
    if a.dtype == object:
        lo, hi = -(1 << 63), (1 << 63) - 1
        a = np.vectorize(lambda v: min(max(int(v), lo), hi), otypes=[np.int64])(a) if a.size else a.astype(np.int64)
    return a.astype(np.int64)


def saturate(x, size: int, signed: bool):
    """Clip to the range of a ``size``-byte integer."""
    bits = 8 * size
    lo, hi = (-(1 << (bits - 1)), (1 << (bits - 1)) - 1) if signed else (0, (1 << bits) - 1)
    return np.clip(x, lo, hi)
