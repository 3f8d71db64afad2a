"""Run a compiled leaf's command stream over a batch of inputs: memory regions, DMA, and each operation.

Memory is one byte array per region, with a row per input, set up as the driver does: region 0 the read-only
weights, region 1 the arena (scratch, with the model's inputs and outputs at their offsets), region 2 the fast
scratch, and the NPU's internal SHRAM (lookup tables), which DMA reaches through its ``internal`` flag.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Sequence

import numpy as np

from ..errors import InvalidInputError, NpuModelError
from .bounds import MEMORY_ENV, WORK_ENV, leaf_cost
from . import u85_commands, u85_ops
from .commands import Operation, decode_for
from .elementwise import elementwise
from .leaf_layout import REGION_SCRATCH, REGION_SCRATCH_FAST, REGION_WEIGHTS, Leaf
from .ops import DUAL_CORE_MACS, convolution, pooling

SHRAM = -1
INTERNAL = 0x100


@dataclass
class Trace:
    """What a run did: operations executed, by kind."""

    executed: list[Operation] = field(default_factory=list)

    def counts(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for op in self.executed:
            key = op.kind if op.kind in ("CONV", "DEPTHWISE", "DMA") else f"{op.kind} {op.sub_op}"
            out[key] = out.get(key, 0) + 1
        return out


def run(leaf: Leaf, inputs: Sequence[np.ndarray], on_op: Callable[[Operation, Callable], None] | None = None,
        ops: list[Operation] | None = None) -> tuple[list[np.ndarray], Trace]:
    """The outputs of ``leaf`` for a batch of inputs (each shaped (batch, *tensor shape), its tensor's type).

    ``on_op(op, memory)`` is called after each operation (to look at what it wrote)."""
    if len(inputs) != len(leaf.inputs):
        raise InvalidInputError(f"{leaf.source} has {len(leaf.inputs)} inputs; {len(inputs)} given",
                                "pass one array per model input")
    batch = int(inputs[0].shape[0])
    ops = decode_for(leaf.product, leaf.commands, str(leaf.source)) if ops is None else ops
    u85 = leaf.product == u85_commands.PRODUCT
    if u85:
        u85_ops.check(ops, leaf.npu, str(leaf.source))
    cost = leaf_cost(leaf, ops)  # every declared size bounded before a region is allocated
    why = cost.over(batch, keep_outputs=False)
    if why is not None:
        raise InvalidInputError(f"{leaf.source}: the NPU model needs {why}",
                                f"run at most {cost.max_cases(False):,} inputs at a time, or raise {MEMORY_ENV} or "
                                f"{WORK_ENV}")
    regions = _regions(leaf, batch)

    def memory(region: int) -> np.ndarray:
        if region not in regions:
            raise NpuModelError(f"{leaf.source}: region {region} is not set up (regions 0-2 and SHRAM are)",
                                "the command stream is corrupt; compile the model again with Vela")
        return regions[region]

    for tensor, data in zip(leaf.inputs, inputs):
        raw = np.ascontiguousarray(np.asarray(data).astype(_np_type(tensor.dtype))).view(np.uint8).reshape(batch, -1)
        if raw.shape[1] != tensor.nbytes:
            raise InvalidInputError(f"input '{tensor.name}' takes {tensor.nbytes} bytes per case; {raw.shape[1]} given",
                                    f"pass arrays shaped {tensor.shape}")
        memory(tensor.region)[:, tensor.address : tensor.address + tensor.nbytes] = raw
    trace = Trace()
    chain: dict = {}  # the U85's chaining buffers
    for op in ops:
        if u85:
            u85_ops.execute(op, memory, leaf.macs, chain)
        else:
            _execute(op, memory, leaf.macs)
        trace.executed.append(op)
        if on_op is not None:
            on_op(op, memory)
    outs = []
    for tensor in leaf.outputs:
        raw = memory(tensor.region)[:, tensor.address : tensor.address + tensor.nbytes]
        outs.append(np.ascontiguousarray(raw).view(_np_type(tensor.dtype)).reshape((batch,) + tuple(tensor.shape)))
    return outs, trace


def _execute(op: Operation, memory: Callable[[int], np.ndarray], macs: int) -> None:
    if op.kind == "DMA":
        _dma(op, memory)
    elif op.kind in ("CONV", "DEPTHWISE"):
        convolution(op, memory, macs, depthwise=op.kind == "DEPTHWISE")
    elif op.kind == "POOL":
        pooling(op, memory)
    elif op.kind == "ELEMENTWISE":
        elementwise(op, memory)
    else:  # pragma: no cover - decode yields only these kinds
        raise NpuModelError(f"{op.title} is not modelled", "")


def _dma(op: Operation, memory: Callable[[int], np.ndarray]) -> None:
    src_reg, dst_reg = op.reg("DMA0_SRC_REGION"), op.reg("DMA0_DST_REGION")
    for name, reg in (("source", src_reg), ("destination", dst_reg)):
        if (reg >> 9) & 0x3:
            raise NpuModelError(f"{op.title}: a 2D/3D DMA {name} (stride mode {(reg >> 9) & 3}) is not modelled",
                                "1D DMA is")
    if src_reg & INTERNAL:
        raise NpuModelError(f"{op.title}: DMA from internal memory is not modelled", "DMA into SHRAM is")
    src = memory(src_reg & 0xFF)
    dst = memory(SHRAM if dst_reg & INTERNAL else dst_reg & 0xFF)
    s, d, n = op.reg32("DMA0_SRC") & ((1 << 40) - 1), op.reg32("DMA0_DST") & ((1 << 40) - 1), op.reg32("DMA0_LEN")
    if s + n > src.shape[1] or d + n > dst.shape[1]:
        raise NpuModelError(f"{op.title}: DMA of {n} B from {s} to {d} runs past a region "
                            f"({src.shape[1]} B and {dst.shape[1]} B)",
                            "the command stream is corrupt or the arena too small; compile the model again with Vela")
    dst[:, d : d + n] = src[:, s : s + n]


def _regions(leaf: Leaf, batch: int) -> dict[int, np.ndarray]:
    arena = leaf.scratch_size
    for t in leaf.inputs + leaf.outputs:
        if t.region == REGION_SCRATCH:
            arena = max(arena, t.address + t.nbytes)
    weights = np.frombuffer(leaf.weights, dtype=np.uint8)
    return {
        REGION_WEIGHTS: np.broadcast_to(weights, (batch, weights.size)).copy(),
        REGION_SCRATCH: np.zeros((batch, arena), dtype=np.uint8),
        REGION_SCRATCH_FAST: np.zeros((batch, max(leaf.scratch_fast_size, 0)), dtype=np.uint8),
        # one core's SHRAM (the payload gives both cores' of a two-core NPU): lookup tables sit at its top
        SHRAM: np.zeros((batch, max(leaf.shram_bytes // (2 if leaf.macs == DUAL_CORE_MACS else 1), 2048)), np.uint8),
    }


def _np_type(dtype: str):
    return {"int8": np.int8, "uint8": np.uint8, "int16": np.int16, "int32": np.int32}[dtype]
