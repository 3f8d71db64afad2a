"""The order an Ethos-U85 operation stores its OFM in: transposed or reversed axes (OFM_PRECISION bits 9-13).

The U85 computes an operation's OFM in its own (height, width, depth) order -- OFM_HEIGHT_M1, OFM_WIDTH_M1 and
OFM_DEPTH_M1 are the shape *before* transposition -- and writes it with its axes permuted: OFM_PRECISION bits 11-13
name the stored order (HWC, the identity; WHC, HCW, WCH, CHW, CWH), element (h, w, c) landing at the stored
position whose height, width and depth are the op's axes in that order (WHC: (w, h, c); CHW: (c, h, w)). The OFM's
tile registers (OFM_HEIGHT0_M1, OFM_HEIGHT1_M1, OFM_WIDTH0_M1), bases and strides describe the stored feature map,
*after* transposition, in NHWC or NHCWB16. Vela 5.2 lowers TRANSPOSE, and the channel interleaving of a depthwise
convolution's depth multiplier, to 1x1 pooling operations with such outputs.

Bits 9-10 reverse one axis (H, W or C): the operation's element i along it lands at position ``n - 1 - i`` of the
feature map the OFM registers describe (n the axis's size; the bases still address its first element). Vela lowers
REVERSE_V2 to a 1x1 pooling operation with such an output. Vela never combines a reverse with a transpose or with a
chained OFM, and the model executes neither combination, nor the transpose codes the register interface leaves
undefined (4, 5), nor a transposed or reversed OFM handed to the chaining buffer.
"""

from __future__ import annotations

import numpy as np

from .commands import Operation
from .ops import ofm_shape
from .u85_commands import REVERSE, TRANSPOSE

AXES = {"H": 0, "W": 1, "C": 2}


def transpose(op: Operation) -> int:
    """OFM_PRECISION's transpose field (0: HWC, the identity); 0 for a U55/U65 operation, which has none."""
    return 0 if op.registers is None else (op.r0.get("OFM_PRECISION", 0) >> 11) & 0x7


def reverse(op: Operation) -> int:
    """OFM_PRECISION's reverse field (0: none); 0 for a U55/U65 operation."""
    return 0 if op.registers is None else (op.r0.get("OFM_PRECISION", 0) >> 9) & 0x3


def permutation(code: int) -> tuple[int, int, int]:
    """For a transpose code, the op's axes (0 height, 1 width, 2 depth) in stored order."""
    order = TRANSPOSE[code]
    return AXES[order[0]], AXES[order[1]], AXES[order[2]]


def why_not(op: Operation) -> str | None:
    """Why the model cannot store ``op``'s OFM in the order its registers ask (None: it can)."""
    code, rev = transpose(op), reverse(op)
    if code not in TRANSPOSE:
        return f"OFM transpose code {code} is undefined"
    if code and rev:
        return f"an OFM both transposed ({TRANSPOSE[code]}) and reversed ({REVERSE[rev]}) is not modelled"
    if (code or rev) and (op.r0.get("OFM_PRECISION", 0) >> 14) & 0x3 == 2:
        return "a transposed or reversed OFM in the chaining buffer is not modelled"
    return None


def stored_shape(op: Operation) -> tuple[int, int, int]:
    """The OFM's (height, width, depth) as stored in memory: OFM_HEIGHT/WIDTH/DEPTH_M1 with the axes transposed."""
    shape = ofm_shape(op)
    code = transpose(op)
    if not code:
        return shape
    perm = permutation(code)
    return shape[perm[0]], shape[perm[1]], shape[perm[2]]


def arrange(op: Operation, values: np.ndarray) -> np.ndarray:
    """``values`` (batch, h, w, c) in the op's order, rearranged into the order the OFM is stored in."""
    code, rev = transpose(op), reverse(op)
    if rev:
        return np.flip(values, axis=rev)  # REVERSE: 1 H, 2 W, 3 C -- the batch array's axes 1, 2, 3
    if not code:
        return values
    perm = permutation(code)
    return np.transpose(values, (0, 1 + perm[0], 1 + perm[1], 1 + perm[2]))
