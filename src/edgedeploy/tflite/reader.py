"""Read a ``.tflite`` flatbuffer without TensorFlow.

Used to reject bad inputs before any tool runs (not a file, not TFLite,
truncated, float where int8 is needed) and to read the input/output tensors
and quantization parameters that firmware needs.

Reading uses the ``flatbuffers`` runtime with the TFLite schema's field slots
(``schema.fbs``); it is fast enough to run before every compile. Operator
names come from the ``tflite`` package's generated enum, loaded only when a
name is needed.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from edgedeploy.errors import InvalidInputError
from edgedeploy.core.files import read_input_bytes

# TensorType enum of schema.fbs.
DTYPES = (
    "float32", "float16", "int32", "uint8", "int64", "string", "bool", "int16", "complex64", "int8",
    "float64", "complex128", "uint64", "resource", "variant", "uint32", "uint16", "int4", "bfloat16",
)  # fmt: skip
FLOAT_DTYPES = {"float32", "float16", "float64", "bfloat16"}
OP_QUANTIZE, OP_DEQUANTIZE, OP_CUSTOM = 114, 6, 32
# CONV_2D, DEPTHWISE_CONV_2D and FULLY_CONNECTED (inputs: data, weights, bias), by BuiltinOperator code, so that
# reading scales needs no operator names (naming imports the generated schema package, the slowest part).
BIAS_OPS = {3: "CONV_2D", 4: "DEPTHWISE_CONV_2D", 9: "FULLY_CONNECTED"}
BIAS_SCALE_TOLERANCE = 0.02  # the kernels take a bias scale of input scale x weight scale
# Operators that convert between float and integer at a model's edges.
BOUNDARY_OPS = {"QUANTIZE", "DEQUANTIZE"}


@lru_cache(maxsize=1)
def _op_names() -> dict[int, str]:
    import tflite  # the generated schema; imported only to name operators

    return {v: k for k, v in vars(tflite.BuiltinOperator).items() if not k.startswith("_")}


@dataclass(frozen=True)
class TensorInfo:
    name: str
    shape: tuple[int, ...]
    dtype: str  # "int8", "float32", ...
    scale: tuple[float, ...]
    zero_point: tuple[int, ...]
    quantized_dimension: int = 0

    def to_dict(self) -> dict:
        return {
            "name": self.name,
            "shape": list(self.shape),
            "dtype": self.dtype,
            "scale": list(self.scale),
            "zero_point": list(self.zero_point),
        }


@dataclass(frozen=True)
class OperatorInfo:
    index: int
    code: int
    custom_code: str
    input_types: tuple[str, ...]
    output_types: tuple[str, ...]
    output_name: str
    input_scales: tuple[tuple[float, ...], ...] = ()  # each input's quantization scales (empty if none)
    zero_bias: bool = False  # a third input that is a constant of zeros (a bias that adds nothing)

    @property
    def op(self) -> str:
        """"CONV_2D", "CUSTOM:ethos-u", ..."""
        if self.code == OP_CUSTOM:
            return f"CUSTOM:{self.custom_code}"
        return _op_names().get(self.code, str(self.code))

    @property
    def is_boundary(self) -> bool:
        return self.code in (OP_QUANTIZE, OP_DEQUANTIZE)

    @property
    def computes_in_float(self) -> bool:
        first_input = self.input_types[:1]
        return not self.is_boundary and any(t in FLOAT_DTYPES for t in first_input + self.output_types)

    def bias_scale_ratio(self) -> float | None:
        """For a convolution or fully-connected operator with a non-zero int32 bias: the bias scale over the input
        scale times the weight scale, the farthest from 1 over the channels (the kernels compute with 1); else
        None."""
        if self.code not in BIAS_OPS or len(self.input_types) != 3 or self.input_types[2] != "int32" or self.zero_bias:
            return None
        inp, weights, bias = self.input_scales
        if len(inp) != 1 or not weights or len(weights) not in (1, len(bias)) or not inp[0]:
            return None
        ratios = [b / (inp[0] * w) for b, w in zip(bias, weights * len(bias) if len(weights) == 1 else weights) if w]
        return max(ratios, key=lambda r: abs(r - 1.0), default=None)


@dataclass(frozen=True)
class TfliteModel:
    """A parsed ``.tflite`` file: its size, input and output tensors, operators and buffers."""

    path: Path
    size: int
    inputs: tuple[TensorInfo, ...]
    outputs: tuple[TensorInfo, ...]
    operators: tuple[OperatorInfo, ...]

    @property
    def op_counts(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for o in self.operators:
            counts[o.op] = counts.get(o.op, 0) + 1
        return counts

    def float_compute_ops(self) -> list[OperatorInfo]:
        """Operators other than the edge QUANTIZE/DEQUANTIZE that compute in float."""
        return [o for o in self.operators if o.computes_in_float]

    def is_integer(self) -> bool:
        return bool(self.operators) and not self.float_compute_ops()

    def misbiased_operators(self) -> list[tuple[OperatorInfo, float]]:
        """Operators whose bias is quantized for other scales than they compute with, and by how much
        (:meth:`OperatorInfo.bias_scale_ratio` off 1 by more than ``BIAS_SCALE_TOLERANCE``)."""
        ratios = [(o, o.bias_scale_ratio()) for o in self.operators]
        return [(o, r) for o, r in ratios if r is not None and abs(r - 1.0) > BIAS_SCALE_TOLERANCE]

    def has_ethos_u_op(self) -> bool:
        return any(o.code == OP_CUSTOM and o.custom_code == "ethos-u" for o in self.operators)


def describe_misbiased(op: OperatorInfo, ratio: float) -> str:
    """One of :meth:`TfliteModel.misbiased_operators` in words: the operator, its layer and its bias scale."""
    return f"{op.op} '{op.output_name.split(';')[0]}' (bias scale {ratio:.2f} x input scale x weight scale)"



class _Table:
    """A flatbuffer table read by field slot (``schema.fbs`` field order)."""

    def __init__(self, buf: bytearray, pos: int) -> None:
        from flatbuffers.table import Table

        self.t = Table(buf, pos)

    def _off(self, slot: int) -> int:
        return self.t.Offset(4 + 2 * slot)

    def scalar(self, slot: int, flags, default=0):
        o = self._off(slot)
        return self.t.Get(flags, o + self.t.Pos) if o else default

    def string(self, slot: int) -> str:
        o = self._off(slot)
        return self.t.String(o + self.t.Pos).decode("utf-8", "replace") if o else ""

    def table(self, slot: int) -> "_Table | None":
        o = self._off(slot)
        return _Table(self.t.Bytes, self.t.Indirect(o + self.t.Pos)) if o else None

    def length(self, slot: int) -> int:
        o = self._off(slot)
        return self.t.VectorLen(o) if o else 0

    def tables(self, slot: int) -> list["_Table"]:
        o = self._off(slot)
        if not o:
            return []
        start = self.t.Vector(o)
        return [_Table(self.t.Bytes, self.t.Indirect(start + 4 * i)) for i in range(self.t.VectorLen(o))]

    def scalars(self, slot: int, flags) -> list:
        o = self._off(slot)
        if not o:
            return []
        start, width = self.t.Vector(o), flags.bytewidth
        return [self.t.Get(flags, start + width * i) for i in range(self.t.VectorLen(o))]


def read_tflite(path: Path | str) -> TfliteModel:
    """Parse ``path`` or raise :class:`InvalidInputError` saying what is wrong with it."""
    path = Path(path)
    # a regular file of at most 2 GiB (a flatbuffer cannot be larger), checked before a byte is read
    data = bytearray(read_input_bytes(path, "model", "model"))
    if len(data) < 16 or data[4:8] != b"TFL3":
        what = "empty" if not data else "not a TFLite flatbuffer (no TFL3 identifier)"
        raise InvalidInputError(f"{path} is {what}", "pass a .tflite file written by the TFLite converter")
    try:
        return _parse(path, data)
    except InvalidInputError:
        raise
    except Exception as exc:  # out-of-range reads on truncated data
        raise InvalidInputError(
            f"{path} is truncated or corrupt ({type(exc).__name__})", "re-export the model or copy it again"
        ) from exc


def _parse(path: Path, data: bytearray) -> TfliteModel:
    from flatbuffers import encode, packer
    from flatbuffers import number_types as N

    size = len(data)

    def check(pos: int, what: str) -> None:
        if not 0 <= pos < size:
            raise InvalidInputError(f"{path} is truncated or corrupt ({what} points past the end)", "copy the file again")

    root = encode.Get(packer.uoffset, data, 0)
    check(root, "root table")
    model = _Table(data, root)
    # Model: version 0, operator_codes 1, subgraphs 2, description 3, buffers 4
    buffers = model.tables(4)
    for i, buf in enumerate(buffers):
        # Buffer: data 0, offset 1, size 2
        offset, length = buf.scalar(1, N.Uint64Flags), buf.scalar(2, N.Uint64Flags)
        if offset > 1 and offset + length > size:
            raise InvalidInputError(f"{path} is truncated (buffer {i} runs past the end)", "copy the file again")
        n = buf.length(0)
        if n:
            check(buf.t.Vector(buf._off(0)) + n - 1, f"buffer {i}")
    codes = []
    for oc in model.tables(1):
        # OperatorCode: deprecated_builtin_code 0 (int8), custom_code 1, version 2, builtin_code 3 (int32)
        codes.append((max(oc.scalar(0, N.Int8Flags), oc.scalar(3, N.Int32Flags)), oc.string(1)))
    subgraphs = model.tables(2)
    if not subgraphs:
        raise InvalidInputError(f"{path} has no subgraph", "re-export the model")
    sg = subgraphs[0]
    # SubGraph: tensors 0, inputs 1, outputs 2, operators 3, name 4
    tensors = sg.tables(0)

    def dtype(i: int) -> str:
        code = tensors[i].scalar(1, N.Int8Flags)
        return DTYPES[code] if 0 <= code < len(DTYPES) else f"type{code}"

    def tensor(i: int) -> TensorInfo:
        t = tensors[i]
        # Tensor: shape 0, type 1, buffer 2, name 3, quantization 4
        q = t.table(4)
        scale: tuple[float, ...] = ()
        zp: tuple[int, ...] = ()
        qdim = 0
        if q is not None:
            # QuantizationParameters: min 0, max 1, scale 2, zero_point 3, details_type 4, details 5, quantized_dimension 6
            scale = tuple(float(s) for s in q.scalars(2, N.Float32Flags))
            zp = tuple(int(z) for z in q.scalars(3, N.Int64Flags)) or (0,) * len(scale)
            qdim = q.scalar(6, N.Int32Flags)
        return TensorInfo(t.string(3), tuple(int(d) for d in t.scalars(0, N.Int32Flags)), dtype(i), scale, zp, qdim)

    operators = []
    for index, op in enumerate(sg.tables(3)):
        # Operator: opcode_index 0 (uint32), inputs 1, outputs 2
        code_index = op.scalar(0, N.Uint32Flags)
        if code_index >= len(codes):
            raise InvalidInputError(f"{path} is corrupt (operator {index} has no operator code)", "copy the file again")
        ins = [j for j in op.scalars(1, N.Int32Flags) if j >= 0]
        outs = [j for j in op.scalars(2, N.Int32Flags) if j >= 0]
        code, custom = codes[code_index]
        operators.append(
            OperatorInfo(
                index,
                code,
                custom,
                tuple(dtype(j) for j in ins),
                tuple(dtype(j) for j in outs),
                tensors[outs[0]].string(3) if outs else "",
                tuple(tensor(j).scale for j in ins),
                len(ins) == 3 and not any(_buffer_bytes(data, buffers, tensors[ins[2]].scalar(2, N.Uint32Flags))),
            )
        )
    inputs = tuple(tensor(int(j)) for j in sg.scalars(1, N.Int32Flags))
    outputs = tuple(tensor(int(j)) for j in sg.scalars(2, N.Int32Flags))
    return TfliteModel(path, size, inputs, outputs, tuple(operators))


def require_integer_model(model: TfliteModel) -> None:
    """Raise when the model computes in float: Vela would put those operators on the CPU."""
    if model.has_ethos_u_op():
        raise InvalidInputError(
            f"{model.path} is already compiled by Vela (it holds an ethos-u custom operator)",
            "pass the int8 .tflite from before Vela",
        )
    floats = model.float_compute_ops()
    if floats:
        kinds = sorted({o.op for o in floats})
        raise InvalidInputError(
            f"{model.path} is a float model ({len(floats)} of {len(model.operators)} operators compute in float: "
            f"{', '.join(kinds[:5])}); Vela would leave {'it' if len(floats) == 1 else 'them'} on the CPU",
            "convert it to full int8 first: `edgedeploy optimize MODEL.h5 --data DATA.npz --leaves ptq`",
        )


def misbiased_descriptions(path: str) -> list[str]:
    """:meth:`TfliteModel.misbiased_operators` of ``path`` in words; picklable, so a Vela worker (which has
    the flatbuffer reader's dependencies loaded already) computes it while the main process stays light."""
    return [describe_misbiased(o, ratio) for o, ratio in read_tflite(path).misbiased_operators()]


def check_int8_model(path: str) -> None:
    """Read ``path`` and require an integer model; runs in a worker process as well as here."""
    require_integer_model(read_tflite(path))


@dataclass(frozen=True)
class WeightTensor:
    """A constant weight tensor (rank >= 2, stored in the file) and the operator that reads it."""

    name: str
    op: str
    shape: tuple[int, ...]
    dtype: str
    quantized_dimension: int
    scale: tuple[float, ...]
    data: bytes

    def values(self):
        """The stored values as a NumPy array of ``shape`` (integers stay integers)."""
        import numpy as np

        kinds = {"int8": np.int8, "uint8": np.uint8, "int16": np.int16, "int32": np.int32, "float32": np.float32,
                 "float16": np.float16}
        if self.dtype not in kinds:
            raise InvalidInputError(f"weight tensor '{self.name}' has type {self.dtype}", "expected an int8 model")
        return np.frombuffer(self.data, dtype=kinds[self.dtype]).reshape(self.shape)


def _buffer_bytes(data: bytearray, buffers: list[_Table], index: int) -> bytes:
    """The bytes of buffer ``index`` (stored inline or after the flatbuffer); empty for none (not a constant)."""
    from flatbuffers import number_types as N

    if not 0 < index < len(buffers):
        return b""
    buf = buffers[index]
    # Buffer: data 0, offset 1, size 2
    offset, size = buf.scalar(1, N.Uint64Flags), buf.scalar(2, N.Uint64Flags)
    if offset > 1:
        return bytes(data[offset : offset + size])
    if buf.length(0):
        start = buf.t.Vector(buf._off(0))
        return bytes(data[start : start + buf.length(0)])
    return b""


def read_weight_tensors(path: Path | str) -> list[WeightTensor]:
    """Constant tensors of rank >= 2 that operators read (filters and fully-connected weights), in operator order."""
    from flatbuffers import encode, packer
    from flatbuffers import number_types as N

    path = Path(path)
    read_tflite(path)  # the same checks and one-line errors as for any model
    data = bytearray(read_input_bytes(path, "model", "model"))
    model = _Table(data, encode.Get(packer.uoffset, data, 0))
    buffers = model.tables(4)
    codes = [(max(oc.scalar(0, N.Int8Flags), oc.scalar(3, N.Int32Flags)), oc.string(1)) for oc in model.tables(1)]
    sg = model.tables(2)[0]
    tensors = sg.tables(0)
    found: list[WeightTensor] = []
    seen: set[int] = set()
    for op in sg.tables(3):
        code, custom = codes[op.scalar(0, N.Uint32Flags)]
        op_name = f"CUSTOM:{custom}" if code == OP_CUSTOM else _op_names().get(code, str(code))
        for j in op.scalars(1, N.Int32Flags):
            if j < 0 or j in seen:
                continue
            t = tensors[j]
            shape = tuple(int(d) for d in t.scalars(0, N.Int32Flags))
            b = t.scalar(2, N.Uint32Flags)
            if len(shape) < 2 or not 0 < b < len(buffers):
                continue
            raw = _buffer_bytes(data, buffers, b)
            if not raw:
                continue  # not a constant
            code_t = t.scalar(1, N.Int8Flags)
            q = t.table(4)
            seen.add(j)
            found.append(
                WeightTensor(
                    name=t.string(3),
                    op=op_name,
                    shape=shape,
                    dtype=DTYPES[code_t] if 0 <= code_t < len(DTYPES) else f"type{code_t}",
                    quantized_dimension=q.scalar(6, N.Int32Flags) if q is not None else 0,
                    scale=tuple(float(s) for s in q.scalars(2, N.Float32Flags)) if q is not None else (),
                    data=raw,
                )
            )
    return found
