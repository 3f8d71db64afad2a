"""The NPU model as a hardware-in-the-loop "device": input bytes in, output bytes out.

A transport for :mod:`edgedeploy.hil.testing` (any callable from input bytes to output bytes is one): the tests written
for a board run against the compiled model's command stream on this machine. ``model`` is a ``*_vela.tflite``
whose operators all run on the NPU, or Vela's raw ``.npz``::

    from edgedeploy.npu.transport import npu_transport

    @pytest.fixture(scope="session")
    def device():
        return npu_transport("out/compile/kws/ethos-u55-128/model_int8_vela.tflite")
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable

import numpy as np

from ..errors import NpuModelError
from . import u85_commands, u85_ops
from .commands import decode_for
from .leaf_layout import read_leaf
from .machine import run


def npu_transport(model: str | Path) -> Callable[[bytes], bytes]:
    """A callable running one input (the model's input tensors' bytes, in order) through the NPU model."""
    path = Path(model)
    leaf = read_leaf(path)
    if path.suffix != ".npz":
        from edgedeploy.tflite.reader import read_tflite

        others = sorted({o.op for o in read_tflite(path).operators if o.op != "CUSTOM:ethos-u"})
        if others:
            raise NpuModelError(f"{path} runs {', '.join(others)} on the CPU; the NPU model runs only the NPU part",
                                "use a leaf that Vela maps entirely to the NPU")
    ops = decode_for(leaf.product, leaf.commands, str(path))
    if leaf.product == u85_commands.PRODUCT:
        u85_ops.check(ops, leaf.npu, str(path))
    sizes = [t.nbytes for t in leaf.inputs]
    types = {"int8": np.int8, "uint8": np.uint8, "int16": np.int16, "int32": np.int32}

    def transport(data: bytes) -> bytes:
        if len(data) != sum(sizes):
            raise ValueError(f"input is {len(data)} bytes; {path.name} takes {sum(sizes)}")
        arrays, pos = [], 0
        for t, n in zip(leaf.inputs, sizes):
            arr = np.frombuffer(data[pos : pos + n], dtype=types[t.dtype]).reshape((1,) + tuple(t.shape))
            arrays.append(arr)
            pos += n
        outs, _ = run(leaf, arrays, ops=ops)
        return b"".join(np.ascontiguousarray(o[0]).tobytes() for o in outs)

    return transport
