"""What a decoded Ethos-U85 operation does, read from its registers' fields (:mod:`edgedeploy.npu.u85_commands`).

The field positions are those of the U85 register interface Vela 5.2's U85 backend writes.
"""

from __future__ import annotations

from typing import Any

from .commands import Operation
from .u85_commands import (ACC_INPUT, ACTIVATION, BITS, BROADCAST, FORMATS, OFM_ROUNDING, RESIZE, REVERSE, STORAGE,
                           TRANSPOSE, UPSCALE)


def _bits(value: int, low: int, width: int) -> int:
    return (value >> low) & ((1 << width) - 1)


def _precision(value: int, output: bool) -> dict[str, Any]:
    """An IFM/IFM2/OFM precision register: element type, size, layout, and for the OFM its scaling and order."""
    out: dict[str, Any] = {
        "signed": bool(_bits(value, 0, 1)),
        "bits": BITS[_bits(value, 1 if output else 2, 2)],
        "format": FORMATS.get(_bits(value, 6, 2), f"format {_bits(value, 6, 2)}"),
        "storage": STORAGE[_bits(value, 14, 2)],
    }
    if output:
        out["scale"] = "GLOBAL" if _bits(value, 8, 1) else "PER_CHANNEL"
        out["reverse"] = REVERSE[_bits(value, 9, 2)]
        out["transpose"] = TRANSPOSE.get(_bits(value, 11, 3), f"transpose {_bits(value, 11, 3)}")
    return out


def _shape(op: Operation, fm: str) -> list[int] | None:
    """An OFM's height, width and depth; for an IFM its first tile's height and width and the depth."""
    names = (f"{fm}_HEIGHT_M1", f"{fm}_WIDTH_M1", f"{fm}_DEPTH_M1") if fm == "OFM" else (
        f"{fm}_HEIGHT0_M1", f"{fm}_WIDTH0_M1", "IFM_DEPTH_M1")
    if not all(n in op.r0 for n in names):
        return None
    return [op.r0[n] + 1 for n in names]


def _zero_point(op: Operation, name: str) -> int | None:
    return op.signed(name) if name in op.r0 else None


def _scale(op: Operation, name: str) -> dict[str, Any] | None:
    """A 32-bit scale register: the multiplier in the payload word, shift and rounding in the command's parameter."""
    if name not in op.r1:
        return None
    value = op.r1[name]
    param = value >> 32
    rounding = _bits(param, 13, 3) if name == "OFM_SCALE" else _bits(param, 13, 1)
    return {"scale": value & 0x7FFFFFFF, "shift": _bits(param, 0, 6), "double_round": _bits(param, 6, 5),
            "rounding": OFM_ROUNDING.get(rounding, f"rounding {rounding}")}


def describe(op: Operation) -> dict[str, Any]:
    """What a decoded U85 operation does, from its registers: shapes, kernel, weights, scaling and activation."""
    out: dict[str, Any] = {"index": op.index, "kind": op.kind, "word": op.word}
    if op.kind == "DMA":
        src, dst = op.r0.get("DMA0_SRC_REGION", 0), op.r0.get("DMA0_DST_REGION", 0)
        out.update(source_region=_bits(src, 0, 3), destination_region=_bits(dst, 0, 3),
                   source_internal=bool(_bits(src, 8, 1)), destination_internal=bool(_bits(dst, 8, 1)),
                   stride_mode=_bits(src, 9, 2), length=op.r1.get("DMA0_LEN"))
        return out
    if op.kind == "RESIZE":
        out["sub_op"] = RESIZE.get(op.param & 0x3, f"resize mode {op.param & 0x3}")
    elif op.sub_op:
        out["sub_op"] = op.sub_op
    out["ifm"] = {"shape": _shape(op, "IFM"), "region": op.r0.get("IFM_REGION"),
                  "zero_point": _zero_point(op, "IFM_ZERO_POINT"),
                  "broadcast": BROADCAST.get(_bits(op.r0.get("IFM_BROADCAST", 0), 0, 4)),
                  "upscale": UPSCALE.get(_bits(op.r0.get("IFM_UPSCALE", 0), 0, 2)),
                  **_precision(op.r0.get("IFM_PRECISION", 0), output=False)}
    if op.kind == "ELEMENTWISE":
        out["ifm2"] = {"shape": _shape(op, "IFM2"), "region": op.r0.get("IFM2_REGION"),
                       "zero_point": _zero_point(op, "IFM2_ZERO_POINT"),
                       "broadcast": BROADCAST.get(_bits(op.r0.get("IFM2_BROADCAST", 0), 0, 4)),
                       **_precision(op.r0.get("IFM2_PRECISION", 0), output=False)}
    out["ofm"] = {"shape": _shape(op, "OFM"), "region": op.r0.get("OFM_REGION"),
                  "zero_point": _zero_point(op, "OFM_ZERO_POINT"),
                  **_precision(op.r0.get("OFM_PRECISION", 0), output=True)}
    if op.kind in ("CONV", "DEPTHWISE", "POOL"):
        stride = op.r0.get("KERNEL_STRIDE", 0)
        out["kernel"] = {
            "shape": [op.r0.get("KERNEL_HEIGHT_M1", 0) + 1, op.r0.get("KERNEL_WIDTH_M1", 0) + 1],
            "stride": [(_bits(stride, 1, 1) | _bits(stride, 9, 1) << 1) + 1,
                       (_bits(stride, 0, 1) | _bits(stride, 6, 1) << 1) + 1],
            "dilation": [_bits(stride, 4, 1) + 1, _bits(stride, 3, 1) + 1],
            "padding": [op.r0.get(f"IFM_PAD_{s}", 0) for s in ("TOP", "LEFT", "BOTTOM", "RIGHT")],
        }
    if op.kind in ("CONV", "DEPTHWISE"):
        fmt, stride = op.r0.get("WEIGHT_FORMAT", 0), op.r0.get("KERNEL_STRIDE", 0)
        out["weights"] = {
            "format": "FAST" if _bits(fmt, 0, 1) else "STANDARD",
            "sparsity": "2:4" if _bits(fmt, 4, 1) else "NONE",
            "order": "PART_KERNEL_FIRST" if _bits(stride, 2, 1) else "DEPTH_FIRST",
            "from_ifm2": bool(op.param & 1),
            "streams": [(op.r1.get(f"WEIGHT{s}_BASE"), op.r1.get(f"WEIGHT{s}_LENGTH")) for s in ("", "1", "2", "3")
                        if f"WEIGHT{s}_LENGTH" in op.r1 and op.r1[f"WEIGHT{s}_LENGTH"]],
            "scale_stream": (op.r1.get("SCALE_BASE"), op.r1.get("SCALE_LENGTH")),
        }
    acc = op.r0.get("ACC_FORMAT", 0)
    out["accumulator"] = {"bits": 48 if _bits(acc, 0, 2) else 32, "input": ACC_INPUT.get(_bits(acc, 4, 2)),
                          "output": not _bits(acc, 6, 1)}
    act = op.r0.get("ACTIVATION", 0)
    out["activation"] = {"function": ACTIVATION.get(_bits(act, 0, 5), f"function {_bits(act, 0, 5)}"),
                         "table": _bits(act, 5, 3), "min": op.signed("ACTIVATION_MIN") if "ACTIVATION_MIN" in op.r0
                         else None, "max": op.signed("ACTIVATION_MAX") if "ACTIVATION_MAX" in op.r0 else None}
    for name in ("OFM_SCALE", "IFM_SCALE", "IFM2_SCALE"):
        if op.kind == "ELEMENTWISE" or name == "OFM_SCALE":
            out[name.lower()] = _scale(op, name)
    return out
