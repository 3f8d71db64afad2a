"""What an FVP run is fed, and how the output it dumps compares with a golden reference.

The input, in this order of preference:

1. ``golden``: the first golden case of a firmware bundle written by ``edgedeploy export``
   for the same variant, target and compiled model (``golden.npz``: ``input_0``, and the
   TensorFlow Lite Micro reference outputs ``output_i``, which the dumped output is compared with);
2. ``eval_sample``: the first evaluation sample (``split == 1``, or ``x_test[0]``) of the data
   file the ``convert/<variant>`` stage recorded in ``details["data"]``, quantized with the
   model's input scale and zero point as TFLite's QUANTIZE kernel does;
3. ``zero``: every input element at the input's zero point (real value 0), for models
   compiled from a user's ``.tflite`` with no recorded data.

The dumped output is the model's output tensors in order (the runner's packing).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

from ..errors import InvalidInputError, UsageError
from edgedeploy.core.files import read_input_text
from edgedeploy.core.manifest import Manifest
from edgedeploy.tflite.reader import TensorInfo

_ITEM_BYTES = {
    "int8": 1, "uint8": 1, "bool": 1, "int16": 2, "uint16": 2, "float16": 2, "bfloat16": 2,
    "int32": 4, "uint32": 4, "float32": 4, "int64": 8, "uint64": 8, "float64": 8,
}  # fmt: skip
_NUMPY_DTYPES = {"int8": "<i1", "uint8": "<u1", "int16": "<i2", "int32": "<i4", "float32": "<f4", "float16": "<f2"}


@dataclass
class InputChoice:
    data: bytes
    source: str  # golden | eval_sample | zero
    description: str
    files: dict[str, Path] = field(default_factory=dict)
    golden_output: bytes | None = None


# --------------------------------------------------------------------------- tensors


def tensor_bytes(t: TensorInfo) -> int | None:
    size = _ITEM_BYTES.get(t.dtype)
    if size is None or any(d <= 0 for d in t.shape):
        return None
    n = 1
    for d in t.shape:
        n *= d
    return n * size


def _elements(t: TensorInfo) -> int:
    n = 1
    for d in t.shape:
        n *= max(d, 1)
    return n


def zero_input(tensors: tuple[TensorInfo, ...]) -> bytes:
    """Every element at the zero point (real value 0), tensors concatenated in order."""
    import numpy as np

    parts = []
    for t in tensors:
        dtype = _NUMPY_DTYPES.get(t.dtype)
        if dtype is None:
            raise InvalidInputError(f"model input {t.name} has type {t.dtype}", "use an int8, int16 or float32 input")
        zp = t.zero_point[0] if t.zero_point and t.dtype not in ("float32", "float16") else 0
        parts.append(np.full(_elements(t), zp, dtype=dtype).tobytes())
    return b"".join(parts)


def quantize_sample(sample, t: TensorInfo) -> bytes:
    """One float sample as the bytes of tensor ``t`` (quantized when the tensor is integer)."""
    import numpy as np

    dtype = _NUMPY_DTYPES.get(t.dtype)
    if dtype is None:
        raise InvalidInputError(f"model input {t.name} has type {t.dtype}", "use an int8, int16 or float32 input")
    x = np.asarray(sample).reshape(-1)
    if x.size != _elements(t):
        raise InvalidInputError(
            f"an eval sample has {x.size} values but model input {t.name} takes {_elements(t)} {tuple(t.shape)}",
            "record the data file the model was converted with",
        )
    if t.dtype in ("float32", "float16"):
        return x.astype(dtype).tobytes()
    if not t.scale:
        q = np.round(x.astype(np.float64))
    else:  # as TFLite's QUANTIZE kernel: float32 division, round half away from zero
        v = x.astype(np.float32) / np.float32(t.scale[0])
        q = np.sign(v) * np.floor(np.abs(v).astype(np.float64) + 0.5) + (t.zero_point[0] if t.zero_point else 0)
    info = np.iinfo(np.dtype(dtype))
    return np.clip(q, info.min, info.max).astype(dtype).tobytes()


# --------------------------------------------------------------------------- input choice


BUNDLE_SCHEMA = "edgedeploy.firmware"
_BUNDLE_HINT = "pass a folder written by `edgedeploy export`"


def golden_from_bundle(
    bundle: Path, leaf: str, target_name: str, vela_sha256: str, inputs: tuple[TensorInfo, ...],
    outputs: tuple[TensorInfo, ...],
) -> InputChoice:
    """The first golden case of an ``edgedeploy export`` bundle made from this very compiled model."""
    import numpy as np

    bundle = Path(bundle)
    path = bundle / "manifest.json"
    try:  # a regular file of bounded size: a FIFO there never blocks
        info = json.loads(read_input_text(path, "bundle manifest", "manifest"))
    except (OSError, ValueError, RecursionError) as exc:
        raise InvalidInputError(f"{path} cannot be read ({exc})", _BUNDLE_HINT) from exc
    if not isinstance(info, dict) or info.get("schema") != BUNDLE_SCHEMA:
        raise InvalidInputError(f"{path} is not an edgedeploy firmware bundle", _BUNDLE_HINT)
    src = info.get("source", {})
    if (src.get("leaf"), src.get("target")) != (leaf, target_name):
        raise UsageError(
            f"{bundle} was exported for '{src.get('leaf')}' on {src.get('target')}, not '{leaf}' on {target_name}",
            "pass the bundle exported for this variant and target",
        )
    if info.get("model", {}).get("sha256") != vela_sha256:
        raise InvalidInputError(
            f"{bundle} holds another compile of '{leaf}' for {target_name} than this run",
            "re-run `edgedeploy export` from this run folder",
        )
    golden = info.get("golden") or {}
    npz = bundle / str(golden.get("npz") or "golden.npz")
    if not golden.get("count") or not npz.is_file():
        raise InvalidInputError(f"{bundle} has no golden vectors", "export with --data DATA.npz --golden N")
    from edgedeploy.core.npz import read_npz

    arrays = read_npz(npz, "golden vectors", "data")  # regular, bounded, arrays only
    missing = [k for k in ["input_0", *(f"output_{i}" for i in range(len(outputs)))] if k not in arrays]
    if missing or len(inputs) != 1:
        what = ", ".join(missing) or "a single input"
        raise InvalidInputError(f"{npz} lacks {what}", "re-run `edgedeploy export`")
    if any(a.ndim == 0 or len(a) == 0 for a in arrays.values()):
        raise InvalidInputError(f"{npz} holds an array without cases", "re-run `edgedeploy export`")
    data = np.ascontiguousarray(arrays["input_0"][0]).tobytes()
    expected = b"".join(np.ascontiguousarray(arrays[f"output_{i}"][0]).tobytes() for i in range(len(outputs)))
    row = f" (data row {int(arrays['row'][0])})" if "row" in arrays else ""
    want = tensor_bytes(inputs[0])
    if want is not None and len(data) != want:
        raise InvalidInputError(f"{npz}: input_0 has {len(data)} bytes per case, the model takes {want}",
                                "re-run `edgedeploy export`")
    return InputChoice(
        data, "golden", f"golden case 0{row} of {bundle}", files={"golden": npz}, golden_output=expected
    )


def _eval_sample(manifest: Manifest, leaf: str, tensors: tuple[TensorInfo, ...]) -> InputChoice | None:
    rec = manifest.records.get(f"convert/{leaf}")
    data = rec.details.get("data") if rec is not None and rec.status == "ok" else None
    if not isinstance(data, Mapping) or not isinstance(data.get("path"), str) or len(tensors) != 1:
        return None
    path = Path(data["path"])
    if not path.is_file():
        return None
    import numpy as np

    from edgedeploy.config.data import EVAL

    from edgedeploy.core.npz import read_npz

    npz = read_npz(path, "data file", "data", keys=("x", "split", "x_test"))  # regular, bounded, arrays only
    keys = set(npz)
    if {"x", "split"} <= keys and npz["split"].ndim == 1 and npz["x"].ndim >= 1:
        rows = np.flatnonzero(npz["split"] == EVAL)
        if rows.size == 0 or int(rows[0]) >= len(npz["x"]):
            return None
        sample, where = npz["x"][int(rows[0])], f"x[{int(rows[0])}] (the first row with split == {EVAL})"
    elif "x_test" in keys and npz["x_test"].ndim >= 1 and len(npz["x_test"]):
        sample, where = npz["x_test"][0], "x_test[0]"
    else:
        return None
    return InputChoice(
        quantize_sample(sample, tensors[0]),
        "eval_sample",
        f"{path.name} {where}, quantized with the model's input scale and zero point",
        files={"data": path},
    )


def choose_input(
    manifest: Manifest,
    leaf: str,
    target_name: str,
    inputs: tuple[TensorInfo, ...],
    golden: InputChoice | None = None,
) -> InputChoice:
    """The input of the run: a golden case if given, else an eval sample if recorded, else zeros."""
    if golden is not None:
        return golden
    sample = _eval_sample(manifest, leaf, inputs)
    if sample is not None:
        return sample
    return InputChoice(zero_input(inputs), "zero", "every input element at its zero point (no recorded data)")


def compare_outputs(got: bytes, expected: bytes, outputs: tuple[TensorInfo, ...]) -> dict[str, Any]:
    """How the dumped output differs from the golden reference output, tensor by tensor."""
    import numpy as np

    differing, max_diff, offset, argmax_same = 0, 0.0, 0, None
    for i, t in enumerate(outputs):
        n = tensor_bytes(t)
        dtype = _NUMPY_DTYPES.get(t.dtype)
        if n is None or dtype is None or offset + n > min(len(got), len(expected)):
            return {"comparable": False}
        a = np.frombuffer(got[offset : offset + n], dtype=dtype).astype(np.float64)
        b = np.frombuffer(expected[offset : offset + n], dtype=dtype).astype(np.float64)
        differing += int(np.sum(a != b))
        max_diff = max(max_diff, float(np.max(np.abs(a - b))) if a.size else 0.0)
        if i == 0 and a.size:
            argmax_same = bool(np.argmax(a) == np.argmax(b))
        offset += n
    max_value: float | int = int(max_diff) if float(max_diff).is_integer() else max_diff
    return {
        "comparable": True,
        "elements_differing": differing,
        "max_abs_diff": max_value,
        "argmax_agrees": argmax_same,
    }
