"""Pure C text: literals, sizes and the ``#define`` lines of one tensor."""

from __future__ import annotations

import math
from typing import Any, Sequence

from ..errors import InvalidInputError, UsageError
from edgedeploy.tflite.reader import TensorInfo
from .conventions import ARENA_ALIGNMENT, C_TYPES, MODEL_ALIGNMENT, check_section


def c_float(value: float) -> str:
    """A float32 constant that round-trips exactly (``0.00390625f``, ``1.0f``)."""
    value = float(value)
    if not math.isfinite(value):
        raise InvalidInputError(f"cannot write {value} as a C float constant", "check the model's quantization")
    import numpy as np

    text = np.format_float_positional(np.float32(value), unique=True, trim="0")
    if "e" not in text and len(text.replace("-", "").replace(".", "").lstrip("0")) > 12:
        text = np.format_float_scientific(np.float32(value), unique=True, trim="0")
    if "." not in text and "e" not in text:
        text += ".0"
    if text.endswith("."):
        text += "0"
    return text + "f"


def c_string(text: str) -> str:
    """A C string literal; anything outside printable ASCII becomes an octal escape."""
    out = []
    for byte in str(text).encode("utf-8", "replace"):  # a lone surrogate (from a data file) becomes "?"
        ch = chr(byte)
        if ch in '"\\':
            out.append("\\" + ch)
        elif 0x20 <= byte < 0x7F and ch != "?":  # '?' escaped so no trigraph can form
            out.append(ch)
        else:
            out.append(f"\\{byte:03o}")
    return '"' + "".join(out) + '"'


def c_int(value: int) -> str:
    """An integer for a ``#define``: negative values in parentheses, so ``x-ZP`` stays ``x-(-128)``."""
    value = int(value)
    return f"({value})" if value < 0 else str(value)


def c_bytes(data: bytes, per_line: int = 12, indent: str = "    ") -> str:
    """``data`` as the lines of a C initializer: ``0x1c, 0x00, ...``."""
    lines = []
    for start in range(0, len(data), per_line):
        chunk = data[start : start + per_line]
        lines.append(indent + " ".join(f"0x{b:02x}," for b in chunk))
    return "\n".join(lines)


def c_numbers(values: Sequence[Any], ctype: str, per_line: int = 16, indent: str = "    ") -> str:
    """Numbers of one C type as the lines of an initializer."""
    if ctype == "float":
        items = [c_float(v) for v in values]
        per_line = min(per_line, 8)
    else:
        items = [str(int(v)) for v in values]
    lines = []
    for start in range(0, len(items), per_line):
        lines.append(indent + " ".join(f"{v}," for v in items[start : start + per_line]))
    return "\n".join(lines)


def model_attribute(section: str, alignment: int = MODEL_ALIGNMENT) -> str:
    """The GCC/Clang/Arm Compiler 6 attribute that aligns the model and names its section."""
    if alignment < 1 or alignment & (alignment - 1):
        raise UsageError(f"alignment {alignment} is not a power of two", "use 16 (what Ethos-U needs) or more")
    check_section(section)
    return f"__attribute__((aligned({alignment}), section({c_string(section)})))"


def round_up(value: int, multiple: int) -> int:
    return -(-int(value) // multiple) * multiple


def arena_size(planned_bytes: int, margin_bytes: int, alignment: int = ARENA_ALIGNMENT) -> int:
    """Tensor arena bytes: what Vela planned plus the runtime margin, rounded up to ``alignment``."""
    if planned_bytes < 0 or margin_bytes < 0:
        raise InvalidInputError(f"negative memory figure ({planned_bytes}, {margin_bytes})", "re-run the compile")
    return round_up(planned_bytes + margin_bytes, alignment)


def c_type_of(dtype: str) -> str:
    try:
        return C_TYPES[dtype][0]
    except KeyError:
        raise InvalidInputError(
            f"tensors of type {dtype} cannot be exported to C", f"supported types: {', '.join(C_TYPES)}"
        ) from None


def dtype_bytes(dtype: str) -> int:
    import numpy as np

    return np.dtype(C_TYPES[dtype][1]).itemsize


def elements(shape: Sequence[int]) -> int:
    n = 1
    for d in shape:
        n *= max(int(d), 1)
    return n


def guard_name(name: str, suffix: str = "H") -> str:
    """The include guard of bundle ``name``'s header: distinct for distinct names.

    C names are case-sensitive, so bundles ``kws`` and ``KWS`` can sit in one firmware. A name without
    capitals keeps the upper-cased guard (``EDGEDEPLOY_KWS_H``); a name with capitals keeps its spelling and
    ends in ``_CASED``, a tail no upper-cased guard has (``EDGEDEPLOY_KWS_H_CASED``).
    """
    if name == name.lower():
        return f"EDGEDEPLOY_{name.upper().lstrip('_')}_{suffix}"
    return f"EDGEDEPLOY_{name.lstrip('_')}_{suffix}_CASED"


def tensor_defines(prefix: str, kind: str, index: int, t: TensorInfo) -> list[str]:
    """``#define`` lines describing one input or output tensor."""
    p = f"{prefix}_{kind}_{index}"
    ctype = c_type_of(t.dtype)
    n = elements(t.shape)
    lines = [
        f"#define {p}_NAME {c_string(t.name)}",
        f"#define {p}_DTYPE {c_string(t.dtype)}",
        f"#define {p}_CTYPE {ctype}",
        f"#define {p}_RANK {len(t.shape)}",
        f"#define {p}_DIMS {{{', '.join(str(int(d)) for d in t.shape)}}}",
        f"#define {p}_ELEMENTS {n}",
        f"#define {p}_BYTES {n * dtype_bytes(t.dtype)}",
    ]
    if len(t.scale) == 1:
        lines += [
            f"#define {p}_QUANTIZED 1",
            f"#define {p}_SCALE {c_float(t.scale[0])}",
            f"#define {p}_ZERO_POINT {c_int(int(t.zero_point[0]) if t.zero_point else 0)}",
        ]
    elif len(t.scale) > 1:
        lines += [f"#define {p}_QUANTIZED 2 /* per-axis: {len(t.scale)} scales, see manifest.json */"]
    else:
        lines += [f"#define {p}_QUANTIZED 0"]
    return lines
