"""Golden vectors: evaluation rows, quantization, the TFLM reference run and the ``.npz`` file."""

from __future__ import annotations

import io
import logging
import re
import sys
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence

from ..errors import InvalidInputError, ToolFailedError, ToolMissingError, UsageError
from edgedeploy.tflite.reader import TensorInfo, TfliteModel
from .c_files import GoldenSet
from .conventions import C_TYPES, HOST_ARENA_MIN, TFLM_PIN

log = logging.getLogger("edgedeploy")


@dataclass
class EvalData:
    path: Path
    x: Any  # float32 evaluation rows, shaped like the model input (without the batch axis)
    y: Any | None  # int class per row, or None
    rows: Any  # row index of each x in the file
    labels: list[str] | None
    split: str  # how the evaluation rows were chosen
    sha256: str = ""


def load_eval_data(path: Path, input_shape: Sequence[int], num_classes: int, kind: str = "classification") -> EvalData:
    """The evaluation split of a data file (see :mod:`edgedeploy.config.data`), with each row's index in the file.

    ``kind`` is the run's task (:mod:`edgedeploy.config.task`): only a classifier's targets are class labels; a
    regression or reconstruction model's are values, so its golden cases carry no label (``y`` is None). A file of
    inputs only (an autoencoder's ``x_train``/``x_test``, or ``x`` and ``split``) gives unlabelled rows whatever
    the task: the golden outputs are then the model's own.
    """
    import numpy as np

    from edgedeploy.config.data import EVAL, load_dataset, read_data_file, read_targets
    from edgedeploy.core.npz import read_npz

    arrays = read_data_file(Path(path))
    if read_targets(Path(path), arrays)[0] is None:
        kind = "reconstruction"  # no targets to read labels from
    ds = load_dataset(Path(path), tuple(int(d) for d in input_shape), int(num_classes), kind, arrays=arrays)
    info = ds.describe()
    if ds.layout == "x/y/split":
        rows = np.flatnonzero(read_npz(ds.path, "data file", "data", keys=("split",))["split"] == EVAL
                              ).astype(np.int64)
    else:
        rows = np.arange(len(ds.x_eval), dtype=np.int64)
    y = ds.y_eval if kind == "classification" else None
    return EvalData(ds.path, ds.x_eval, y, rows, ds.labels, str(info["eval_split"]), ds.sha256)


def select_cases(y: Any | None, n: int) -> list[int]:
    """Positions of ``n`` cases: the first example of each class in turn, in file order."""
    import numpy as np

    if n <= 0:
        return []
    y = np.asarray(y)
    seen: dict[int, int] = {}
    keys = []
    for i, cls in enumerate(y.tolist()):
        rank = seen.get(cls, 0)
        seen[cls] = rank + 1
        keys.append((rank, cls, i))
    keys.sort()
    return [i for _, _, i in keys[:n]]


def quantize(x: Any, scale: float, zero_point: int, dtype: str) -> Any:
    """Float values to a quantized integer type, as TFLite's QUANTIZE kernel does."""
    import numpy as np

    info = np.iinfo(np.dtype(C_TYPES[dtype][1]))
    v = np.asarray(x, dtype=np.float32) / np.float32(scale)
    r = np.sign(v) * np.floor(np.abs(v).astype(np.float64) + 0.5)  # round half away from zero
    q = np.clip(r + int(zero_point), info.min, info.max)
    return q.astype(np.dtype(C_TYPES[dtype][1]))


def dequantize(q: Any, scale: float, zero_point: int) -> Any:
    import numpy as np

    return (np.asarray(q, dtype=np.float32) - np.float32(zero_point)) * np.float32(scale)


def prepare_inputs(x: Any, t: TensorInfo) -> tuple[Any, Any]:
    """Float rows typed for model input ``t``: (model-typed array, float array)."""
    import numpy as np

    xf = np.asarray(x, dtype=np.float32)
    if t.dtype in ("int8", "uint8", "int16"):
        if len(t.scale) != 1:
            raise InvalidInputError(f"model input '{t.name}' has no per-tensor scale", "export a per-tensor quantized model")
        return quantize(xf, t.scale[0], t.zero_point[0] if t.zero_point else 0, t.dtype), xf
    if t.dtype == "float32":
        return xf, xf
    raise InvalidInputError(f"model input '{t.name}' has type {t.dtype}", "golden vectors need int8, uint8, int16 or float32 inputs")


def _import_tflm():
    try:
        from tflite_micro.python.tflite_micro import runtime
    except ImportError as exc:
        raise ToolMissingError(
            "the TensorFlow Lite Micro interpreter (tflite-micro) is not installed",
            f"pip install --pre {TFLM_PIN}",
        ) from exc
    return runtime


def package_version(name: str) -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(name)
    except PackageNotFoundError:
        return "missing"


def _one_case(arr: Any, c: int, shape: Sequence[int]) -> Any:
    """Case ``c`` of ``arr`` shaped as the model's input tensor."""
    import numpy as np

    return np.ascontiguousarray(arr[c].reshape(tuple(int(d) for d in shape)))


def _drop_batch(out: Any) -> Any:
    import numpy as np

    out = np.array(out)
    return out[0].copy() if out.ndim > 1 and out.shape[0] == 1 else out.copy()


def run_tflm(model: bytes, inputs: Sequence[Any], input_shapes: Sequence[Sequence[int]], n_outputs: int) -> list[Any]:
    """Run each case through TFLM's reference kernels; per output an array [N, ...]."""
    import numpy as np

    runtime = _import_tflm()
    try:
        interp = runtime.Interpreter.from_bytes(bytes(model), arena_size=max(10 * len(model), HOST_ARENA_MIN))
    except (RuntimeError, ValueError) as exc:
        raise ToolFailedError(
            f"TensorFlow Lite Micro could not load the int8 model ({exc})",
            "check that every operator has a TFLM reference kernel",
        ) from exc
    n = inputs[0].shape[0]
    outs: list[list[Any]] = [[] for _ in range(n_outputs)]
    for c in range(n):
        interp.reset()
        for i, arr in enumerate(inputs):
            interp.set_input(_one_case(arr, c, input_shapes[i]), i)
        try:
            interp.invoke()
        except RuntimeError as exc:
            raise ToolFailedError(f"TensorFlow Lite Micro failed on golden case {c} ({exc})") from exc
        for j in range(n_outputs):
            outs[j].append(_drop_batch(interp.get_output(j)))
    return [np.stack(o) for o in outs]


def run_tflite(
    model: bytes, inputs: Sequence[Any], input_shapes: Sequence[Sequence[int]], n_outputs: int, reference: bool = False
) -> list[Any]:
    """Run each case through LiteRT's interpreter: its default (XNNPACK) kernels, or its reference kernels."""
    import numpy as np

    from edgedeploy.tflite.interpreter import make_interpreter

    interp = make_interpreter(bytes(model), reference=reference)
    ins, outs_d = interp.get_input_details(), interp.get_output_details()
    n = inputs[0].shape[0]
    outs: list[list[Any]] = [[] for _ in range(n_outputs)]
    for c in range(n):
        for i, arr in enumerate(inputs):
            interp.set_tensor(ins[i]["index"], _one_case(arr, c, input_shapes[i]))
        interp.invoke()
        for j in range(n_outputs):
            outs[j].append(_drop_batch(interp.get_tensor(outs_d[j]["index"])))
    return [np.stack(o) for o in outs]


def compare_outputs(reference: Sequence[Any], other: Sequence[Any]) -> dict[str, Any]:
    """How far ``other`` is from ``reference``: largest absolute difference, share of elements that differ."""
    import numpy as np

    total = differing = 0
    max_diff = 0.0
    for a, b in zip(reference, other):
        da = np.asarray(a, dtype=np.float64)
        db = np.asarray(b, dtype=np.float64)
        diff = np.abs(da - db)
        total += diff.size
        differing += int(np.count_nonzero(diff))
        max_diff = max(max_diff, float(diff.max()) if diff.size else 0.0)
    a0, b0 = np.asarray(reference[0]), np.asarray(other[0])
    n = a0.shape[0]
    argmax_same = int(np.sum(a0.reshape(n, -1).argmax(1) == b0.reshape(n, -1).argmax(1)))
    return {
        "max_abs_diff": int(max_diff) if float(max_diff).is_integer() else max_diff,
        "fraction_differing": differing / total if total else 0.0,
        "elements": total,
        "elements_differing": differing,
        "argmax_agreement": argmax_same / n if n else 1.0,
    }


def make_golden(model: bytes, tflite: TfliteModel, data: EvalData, n: int) -> GoldenSet:
    import numpy as np

    if len(tflite.inputs) != 1:
        raise UsageError(
            f"golden vectors need a single-input model; {tflite.path} has {len(tflite.inputs)} inputs",
            "pass --golden 0",
        )
    picks = select_cases(data.y, n) if data.y is not None else list(range(min(n, data.x.shape[0])))
    if len(picks) < n:
        log.warning("only %d evaluation rows in %s; writing %d golden cases", len(picks), data.path, len(picks))
    picks_arr = np.asarray(picks, dtype=np.int64)
    model_in, float_in = prepare_inputs(data.x[picks_arr], tflite.inputs[0])
    outputs = run_tflm(model, [model_in], [tflite.inputs[0].shape], len(tflite.outputs))
    argmax = outputs[0].reshape(outputs[0].shape[0], -1).argmax(axis=1).astype(np.int32)
    label = (data.y[picks_arr] if data.y is not None else np.full(len(picks), -1)).astype(np.int32)
    is_quantized_input = tflite.inputs[0].dtype != "float32"
    return GoldenSet(
        inputs=(model_in,),
        outputs=tuple(outputs),
        argmax=argmax,
        label=label,
        row=data.rows[picks_arr].astype(np.int64),
        float_inputs=(float_in,) if is_quantized_input else (),
    )


def npz_bytes(arrays: Mapping[str, Any]) -> bytes:
    """An ``.npz`` (what ``numpy.savez`` writes) with fixed timestamps, so equal arrays give equal bytes."""
    import numpy as np

    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", compression=zipfile.ZIP_STORED) as zf:
        for key, value in arrays.items():
            member = io.BytesIO()
            np.lib.format.write_array(member, np.asarray(value), allow_pickle=False)
            info = zipfile.ZipInfo(f"{key}.npy", date_time=(1980, 1, 1, 0, 0, 0))
            info.external_attr = 0o644 << 16
            zf.writestr(info, member.getvalue())
    return buf.getvalue()


def golden_arrays(golden: GoldenSet, labels: Sequence[str] | None) -> dict[str, Any]:
    import numpy as np

    arrays: dict[str, Any] = {}
    for i, a in enumerate(golden.inputs):
        arrays[f"input_{i}"] = a
    for i, a in enumerate(golden.float_inputs):
        arrays[f"input_{i}_float"] = a
    for i, a in enumerate(golden.outputs):
        arrays[f"output_{i}"] = a
    arrays["argmax"] = golden.argmax
    arrays["label"] = golden.label
    arrays["row"] = golden.row
    if labels:
        arrays["labels"] = np.asarray(list(labels), dtype=str)
    return arrays


_ARENA_TOTAL = re.compile(r"Arena allocation total (\d+) bytes")
_ARENA_SCRIPT = (
    "import sys\n"
    "from tflite_micro.python.tflite_micro import runtime\n"
    "runtime.Interpreter.from_file(sys.argv[1], arena_size=int(sys.argv[2])).print_allocations()\n"
)


def host_arena_bytes(model: Path, timeout: float = 120.0) -> int | None:
    """The host TFLM interpreter's arena total for ``model`` (its allocator prints it; a child process catches it).

    ``None`` when it cannot be read. TFLM on the host uses its reference kernels and 64-bit
    pointers, so this is a base figure, not the target's: the firmware's own use is measured
    by ``edgedeploy emulate``.
    """
    from edgedeploy.core.proc import run_command

    size = max(10 * Path(model).stat().st_size, HOST_ARENA_MIN)
    result = run_command([sys.executable, "-c", _ARENA_SCRIPT, str(model), str(size)], timeout=timeout)
    found = _ARENA_TOTAL.findall(result.stdout + result.stderr) if result.ok else []
    return int(found[-1]) if found else None
