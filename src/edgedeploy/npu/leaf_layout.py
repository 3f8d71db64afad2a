"""A compiled leaf as the NPU driver sees it: the driver payload, the read-only region and the arena layout.

Two sources hold the same facts: the ``ethos-u`` custom operator inside ``*_vela.tflite`` (inputs: command
stream, read-only weights, scratch, fast scratch, then the feature maps; addresses in the model's
``OfflineMemoryAllocation`` metadata) and Vela's ``--output-format raw`` ``.npz``.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from pathlib import Path

from ..errors import InvalidInputError, NpuModelError
from edgedeploy.core.files import read_input_bytes

# Driver actions of the payload (Vela's driver_actions.py, the ethos-u core driver).
DA_CONFIG, DA_CMD_STREAM, DA_READ_APB, DA_DUMP_SHRAM, DA_NOP = 0x01, 0x02, 0x03, 0x04, 0x05
REGION_WEIGHTS, REGION_SCRATCH, REGION_SCRATCH_FAST = 0, 1, 2
PRODUCTS = {0: "55", 1: "65", 2: "85"}  # the configuration word's product field
DTYPES = {"int8": 1, "uint8": 1, "int16": 2, "int32": 4}


@dataclass(frozen=True)
class Tensor:
    """A feature map the host writes (input) or reads (output): where it lives and how it is quantized."""

    name: str
    shape: tuple[int, ...]
    dtype: str
    region: int
    address: int
    scale: tuple[float, ...] = ()
    zero_point: tuple[int, ...] = ()

    @property
    def nbytes(self) -> int:
        n = DTYPES[self.dtype]
        for d in self.shape:
            n *= int(d)
        return n


@dataclass(frozen=True)
class Leaf:
    """Everything the model needs to run one compiled NPU subgraph."""

    source: Path
    product: int  # 0: Ethos-U55, 1: Ethos-U65, 2: Ethos-U85 (the payload's config word)
    macs: int  # MACs per cycle
    shram_bytes: int  # the NPU's shared buffer (lookup tables live at its top)
    commands: tuple[int, ...]  # the register command stream, 32-bit words
    weights: bytes  # region 0 (read-only)
    scratch_size: int
    scratch_fast_size: int
    inputs: tuple[Tensor, ...]
    outputs: tuple[Tensor, ...]

    @property
    def npu(self) -> str:
        return f"ethos-u{PRODUCTS.get(self.product, '55')}-{self.macs}"


def parse_payload(payload: bytes, where: str) -> tuple[int, int, int, tuple[int, ...]]:
    """The product, MACs per cycle, SHRAM bytes and command words of a driver payload (``COP1`` header, then
    driver actions)."""
    if len(payload) < 8 or len(payload) % 4 or payload[:4] != b"COP1":
        raise NpuModelError(f"{where}: the command stream is not an Ethos-U driver payload (no COP1 header)",
                            "compile the model again with Vela")
    words = struct.unpack(f"<{len(payload) // 4}I", payload)
    i, product, macs, shram, commands = 1, None, 0, 0, None
    while i < len(words):
        tag = words[i]
        action, high, param = tag & 0xFF, (tag >> 8) & 0xFF, tag >> 16
        if action == DA_CONFIG:
            if i + 2 >= len(words):
                break
            config = words[i + 1]
            macs = 1 << (config & 0xF)
            shram = ((config >> 8) & 0xFF) * 1024
            product = (config >> 28) & 0xF
            i += 3
        elif action == DA_CMD_STREAM:
            length = (high << 16) | param
            commands = words[i + 1 : i + 1 + length]
            if len(commands) != length:
                raise NpuModelError(f"{where}: the command stream is truncated ({len(commands)} of {length} words)",
                                    "compile the model again with Vela")
            i += 1 + length
        elif action == DA_NOP:
            i += 1
        elif action == DA_READ_APB or action == DA_DUMP_SHRAM:
            i += 1
        else:
            raise NpuModelError(f"{where}: driver action {action:#x} at word {i} is not implemented",
                                "compile the model again with Vela 5.2")
    if commands is None or product is None:
        missing = "configuration" if product is None else "command stream"
        raise NpuModelError(f"{where}: the driver payload holds no {missing}", "compile the model again with Vela")
    if product not in PRODUCTS:
        raise NpuModelError(f"{where}: NPU product {product} in the payload is not an Ethos-U55, U65 or U85",
                            "compile the model again with Vela 5.2 for an ethos-u55, ethos-u65 or ethos-u85 target")
    return product, macs, shram, tuple(commands)


def read_leaf(path: Path) -> Leaf:
    """Read a ``*_vela.tflite`` or Vela raw ``.npz``."""
    path = Path(path)
    if path.suffix == ".npz":
        return _read_npz(path)
    return _read_vela_tflite(path)


def _read_npz(path: Path) -> Leaf:
    import io

    import numpy as np

    data = read_input_bytes(path, "Vela raw output", "data")
    try:
        with np.load(io.BytesIO(data), allow_pickle=False) as npz:
            raw = {}
            for k in npz.files:
                try:
                    raw[k] = npz[k]
                except ValueError:  # object arrays (the quantization entries) need pickle: not read
                    continue
    except Exception as exc:  # noqa: BLE001 - a damaged archive
        raise InvalidInputError(f"{path} is not a readable .npz ({type(exc).__name__})",
                                "write it again with `vela --output-format raw`") from exc
    missing = [k for k in ("cmd_data", "weight_data", "scratch_size", "input_offset", "output_offset") if k not in raw]
    if missing:
        raise InvalidInputError(f"{path} lacks {', '.join(missing)}", "write it with `vela --output-format raw`")
    product, macs, shram, commands = parse_payload(raw["cmd_data"].tobytes(), str(path))

    def tensors(kind: str) -> tuple[Tensor, ...]:
        found = []
        for j in range(len(raw[f"{kind}_offset"])):
            size = int(raw[f"{kind}_elem_size"][j])
            dtype = {1: "int8", 2: "int16", 4: "int32"}.get(size)
            if dtype is None:
                raise NpuModelError(f"{path}: {kind} {j} has {size}-byte elements",
                                    "1-, 2- and 4-byte ones are modelled")
            shape = tuple(int(d) for d in raw[f"{kind}_shape"][j])
            while len(shape) > 4 and shape[0] == 1:  # Vela pads raw shapes with leading ones
                shape = shape[1:]
            found.append(Tensor(f"{kind}{j}", shape, dtype, int(raw[f"{kind}_region"][j]),
                                int(raw[f"{kind}_offset"][j])))
        return tuple(found)

    return Leaf(path, product, macs, shram, commands, raw["weight_data"].tobytes(), int(raw["scratch_size"]),
                int(raw.get("scratch_fast_size", 0)), tensors("input"), tensors("output"))


def _read_vela_tflite(path: Path) -> Leaf:
    from flatbuffers import encode, packer
    from flatbuffers import number_types as N

    from edgedeploy.tflite.reader import DTYPES as TFL_DTYPES
    from edgedeploy.tflite.reader import OP_CUSTOM, _buffer_bytes, _Table, read_tflite

    model_info = read_tflite(path)  # the usual checks and one-line errors
    ops = [o for o in model_info.operators if o.code == OP_CUSTOM and o.custom_code == "ethos-u"]
    if len(ops) != 1:
        raise InvalidInputError(f"{path} holds {len(ops)} ethos-u operators",
                                "verify a model compiled by Vela into one NPU subgraph")
    data = bytearray(read_input_bytes(path, "compiled model", "model"))
    model = _Table(data, encode.Get(packer.uoffset, data, 0))
    buffers = model.tables(4)
    sg = model.tables(2)[0]
    tensors = sg.tables(0)
    op = sg.tables(3)[ops[0].index]
    ins = [j for j in op.scalars(1, N.Int32Flags)]
    outs = [j for j in op.scalars(2, N.Int32Flags)]
    offsets = _offline_offsets(model, data, buffers)

    def raw(j: int) -> bytes:
        return _buffer_bytes(data, buffers, tensors[j].scalar(2, N.Uint32Flags))

    def shape(j: int) -> tuple[int, ...]:
        return tuple(int(d) for d in tensors[j].scalars(0, N.Int32Flags))

    def feature_map(j: int) -> Tensor:
        t = tensors[j]
        code = t.scalar(1, N.Int8Flags)
        dtype = TFL_DTYPES[code] if 0 <= code < len(TFL_DTYPES) else f"type{code}"
        if dtype not in DTYPES:
            raise NpuModelError(f"{path}: feature map '{t.string(3)}' has type {dtype}",
                                "int8/int16/int32 are modelled")
        if j >= len(offsets) or offsets[j] < 0:
            raise InvalidInputError(f"{path}: feature map '{t.string(3)}' has no address in the arena",
                                    "compile the model again with Vela (it writes OfflineMemoryAllocation)")
        q = t.table(4)
        scale = tuple(float(s) for s in q.scalars(2, N.Float32Flags)) if q is not None else ()
        zp = tuple(int(z) for z in q.scalars(3, N.Int64Flags)) if q is not None else ()
        return Tensor(t.string(3), shape(j), dtype, REGION_SCRATCH, int(offsets[j]), scale, zp)

    product, macs, shram, commands = parse_payload(raw(ins[0]), str(path))
    scratch = shape(ins[2])
    scratch_fast = shape(ins[3])
    return Leaf(path, product, macs, shram, commands, raw(ins[1]), int(scratch[0]) if scratch else 0,
                int(scratch_fast[0]) if scratch_fast else 0,
                tuple(feature_map(j) for j in ins[4:]), tuple(feature_map(j) for j in outs))


def _offline_offsets(model, data: bytearray, buffers) -> list[int]:
    """The arena offset of each tensor of subgraph 0 (``OfflineMemoryAllocation``: version, subgraphs, count,
    offsets)."""
    from flatbuffers import number_types as N

    from edgedeploy.tflite.reader import _buffer_bytes

    for meta in model.tables(6):  # Model.metadata (slot 6): name 0, buffer 1
        if meta.string(0) == "OfflineMemoryAllocation":
            raw = _buffer_bytes(data, buffers, meta.scalar(1, N.Uint32Flags))
            words = struct.unpack(f"<{len(raw) // 4}i", raw[: len(raw) // 4 * 4])
            return list(words[3:])
    return []
