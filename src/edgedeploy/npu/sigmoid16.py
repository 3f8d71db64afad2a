"""The TANH and SIGMOID activation functions on 16-bit outputs (activation functions 3 and 4).

Vela 5.2 compiles int16 LOGISTIC and TANH to a 1x1 AVERAGE pool with one of these functions (int8 ones become
lookup tables). The pool's OFM_SCALE brings the input to the functions' fixed-point input, 1/(3 * 4096) per step
(``generate_ofm_scaling_for_pooling``, the multiplier and shift of TFLite's int16 LOGISTIC and TANH kernels); the
output is Q0.15. Arm does not publish the functions' arithmetic. They are modelled as TFLite's int16 reference
kernels compute them, which Vela's scaling is made for: |x| picks two neighbouring samples of a 256-entry table
of sigmoid(i / 24) in 0.16 fixed point and interpolates between them (sigmoid: steps of 2**9 input units; tanh,
as 2 sigmoid(2x) - 1: steps of 2**8), then the sign folds the result.

The table is not plain samples: each entry is the sample less half the error that linear interpolation makes at
the midpoint of its interval (rounded to the nearest integer), and the last entry is 65535.
"""

from __future__ import annotations

import math
from functools import lru_cache

import numpy as np

TANH, SIGMOID = 3, 4
ENTRIES = 256


def _sigmoid(x: float) -> float:
    return 1.0 / (1.0 + math.exp(-x))


@lru_cache(maxsize=1)
def table() -> np.ndarray:
    """sigmoid(i / 24), i = 0..255, in 0.16 fixed point, biased by half the interpolation error at each midpoint."""
    out = []
    for i in range(ENTRIES - 1):
        here, there, mid = (65536 * _sigmoid(v / 24) for v in (i, i + 1, i + 0.5))
        out.append(round(here - ((here + there) / 2 - mid) / 2))
    return np.array(out + [65535], dtype=np.int64)


def _interpolate(abs_x: np.ndarray, step_bits: int, top: int) -> np.ndarray:
    """The table at ``abs_x`` / 2**step_bits, interpolated and scaled by 2**step_bits; ``top`` past its end."""
    t = table()
    hi = abs_x >> step_bits
    inside = hi < ENTRIES - 1
    h = np.where(inside, hi, 0)
    frac = abs_x & ((1 << step_bits) - 1)
    return np.where(inside, (t[h] << step_bits) + frac * (t[h + 1] - t[h]), top)


def sigmoid(x: np.ndarray) -> np.ndarray:
    """Q0.15 sigmoid of ``x`` (1/(3 * 4096) per step)."""
    x = np.asarray(x, dtype=np.int64)
    r = _interpolate(np.abs(x), 9, 0x7FFF << 10)
    return np.where(x >= 0, r + (1 << 9), (1 << 25) - r + (1 << 9) - 1) >> 10


def tanh(x: np.ndarray) -> np.ndarray:
    """Q0.15 tanh of ``x`` (1/(3 * 4096) per step)."""
    x = np.asarray(x, dtype=np.int64)
    r = _interpolate(np.abs(x), 8, 0xFFFF << 8)
    return np.where(x >= 0, r - (1 << 23) + (1 << 7), (1 << 23) - r + (1 << 7) - 1) >> 8


FUNCTIONS = {TANH: tanh, SIGMOID: sigmoid}
