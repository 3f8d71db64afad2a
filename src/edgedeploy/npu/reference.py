"""TFLite's reference kernels on the int8 model: outputs and every intermediate integer tensor, per case."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np


@dataclass
class Reference:
    outputs: list[np.ndarray]  # per model output: (cases, *shape)
    tensors: dict[str, np.ndarray]  # name -> (cases, *shape), integer tensors only
    producers: dict[str, str]  # tensor name -> the TFLite operator that writes it
    operands: dict[str, tuple[str, ...]] = field(default_factory=dict)  # tensor name -> its writer's input tensors


# Bytes per element of the TFLite tensor types (edgedeploy.tflite.reader.DTYPES); 8 for a type not listed.
ELEMENT_BYTES = {"float32": 4, "float16": 2, "int32": 4, "uint8": 1, "int64": 8, "bool": 1, "int16": 2, "int8": 1,
                 "float64": 8, "uint64": 8, "uint32": 4, "uint16": 2, "int4": 1, "bfloat16": 2, "complex64": 8,
                 "complex128": 16}


def declared_bytes(int8_model: Path) -> tuple[int, str]:
    """Bytes of every tensor of the model's first subgraph, from the shapes it declares (what the reference run
    keeps of each case), and the largest tensor's name; read before the interpreter allocates anything."""
    from flatbuffers import encode, packer
    from flatbuffers import number_types as N

    from edgedeploy.core.files import read_input_bytes
    from edgedeploy.tflite.reader import DTYPES, _Table, read_tflite

    read_tflite(int8_model)  # the usual checks and one-line errors
    data = bytearray(read_input_bytes(int8_model, "int8 model", "model"))
    model = _Table(data, encode.Get(packer.uoffset, data, 0))
    total, largest, name = 0, -1, ""
    for t in model.tables(2)[0].tables(0):
        code = t.scalar(1, N.Int8Flags)
        n = ELEMENT_BYTES.get(DTYPES[code] if 0 <= code < len(DTYPES) else "", 8)
        for d in t.scalars(0, N.Int32Flags):
            n *= max(int(d), 1)
        total += n
        if n > largest:
            largest, name = n, t.string(3) or "?"
    return total, name


def operands(int8_model: Path) -> dict[str, tuple[str, ...]]:
    """Each operator output's name -> the names of that operator's input tensors (first subgraph; an omitted
    optional input, index -1, is left out)."""
    from flatbuffers import encode, packer
    from flatbuffers import number_types as N

    from edgedeploy.core.files import read_input_bytes
    from edgedeploy.tflite.reader import _Table

    data = bytearray(read_input_bytes(int8_model, "int8 model", "model"))
    graph = _Table(data, encode.Get(packer.uoffset, data, 0)).tables(2)[0]
    names = [t.string(3) or "" for t in graph.tables(0)]
    found: dict[str, tuple[str, ...]] = {}
    for op in graph.tables(3):
        ins = tuple(names[i] for i in op.scalars(1, N.Int32Flags) if 0 <= i < len(names))
        for o in op.scalars(2, N.Int32Flags):
            if 0 <= o < len(names):
                found[names[o]] = ins
    return found


def run_reference(int8_model: Path, inputs: list[np.ndarray]) -> Reference:
    """Run each case through LiteRT's interpreter with its reference kernels (BUILTIN_REF), keeping every
    tensor."""
    from edgedeploy.core.files import read_input_bytes
    from edgedeploy.tflite.interpreter import make_interpreter
    from edgedeploy.tflite.reader import read_tflite

    model = read_input_bytes(int8_model, "int8 model", "model")
    interp = make_interpreter(model, reference=True, keep_all_tensors=True)
    ins, outs = interp.get_input_details(), interp.get_output_details()
    details = [d for d in interp.get_tensor_details() if np.dtype(d["dtype"]).kind in "iu" and d["name"]]
    n = inputs[0].shape[0]
    kept: dict[str, list[Any]] = {d["name"]: [] for d in details}
    results: list[list[Any]] = [[] for _ in outs]
    for c in range(n):
        for i, arr in enumerate(inputs):
            interp.set_tensor(ins[i]["index"], arr[c : c + 1].reshape(ins[i]["shape"]))
        interp.invoke()
        for j, d in enumerate(outs):
            results[j].append(interp.get_tensor(d["index"])[0].copy())
        for d in details:
            try:
                kept[d["name"]].append(interp.get_tensor(d["index"]).copy())
            except ValueError:  # a tensor without data (never written)
                kept[d["name"]] = []
    producers = {o.output_name: o.op for o in read_tflite(int8_model).operators}
    tensors = {k: np.stack(v) for k, v in kept.items() if len(v) == n}
    return Reference([np.stack(r) for r in results], tensors, producers, operands(int8_model))
