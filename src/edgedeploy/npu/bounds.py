"""What a compiled leaf may ask of the NPU model, estimated from its declared sizes before anything is allocated.

Every size the model takes from a compiled leaf (the scratch tensors, the arena offsets of its inputs and
outputs, and per operation the feature-map heights, widths and depths, kernel sizes, strides and padding of
the command stream) sets how much memory and work NumPy will spend. They are checked here, in Python integers,
against limits (docs/commands/verify.md, "Limits"):

* a feature map declares no more elements than the region it lies in holds bytes (a real stream never
  overlays its own elements), and a kernel has at most :data:`KERNEL_POSITIONS` positions;
* the memory regions plus the largest operation's working set, per case, times the cases (plus, for
  ``verify``, every operation's output and the reference run's tensors kept for the comparison) stay within
  the memory limit;
* the element operations (multiply-accumulates, reads, writes) of all cases stay within the work limit.

A leaf that breaks a limit for one case is :class:`NpuModelError` naming the file, the operation and the
registers; a number of cases that breaks it is the caller's to lower.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from ..errors import NpuModelError, UsageError
from .commands import Operation
from .featuremap import IFM_SIZES, OFM_SIZES
from .leaf_layout import DTYPES, REGION_SCRATCH, REGION_SCRATCH_FAST, REGION_WEIGHTS, Leaf
from .ops import _padding, ofm_shape
from .weight_streams import kernel

MIB = 1 << 20
CASES_LIMIT = 10_000  # verify --count
MEMORY_ENV, MEMORY_DEFAULT_MIB = "EDGEDEPLOY_NPU_MEMORY_MIB", 2048
WORK_ENV, WORK_DEFAULT_G = "EDGEDEPLOY_NPU_WORK_G", 20  # 10^9 element operations
KERNEL_POSITIONS = 256 * 256  # the largest kernel Vela's constraints admit (a 256x256 average pool)
FIX = "the command stream is corrupt; compile the model again with Vela"
F64 = 8  # bytes of the int64 and float64 arrays the operations compute in


def _env_limit(name: str, default: int, unit: int) -> int:
    text = os.environ.get(name)
    if text is None or not text.strip():
        return default * unit
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise UsageError(f"{name} is {text!r}", f"set it to a whole number >= 1 (default {default})")
    return value * unit


def memory_limit() -> int:
    """Bytes the NPU model may hold (``EDGEDEPLOY_NPU_MEMORY_MIB``, default 2048 MiB)."""
    return _env_limit(MEMORY_ENV, MEMORY_DEFAULT_MIB, MIB)


def work_limit() -> int:
    """Element operations the NPU model may spend on one run (``EDGEDEPLOY_NPU_WORK_G`` x 10^9, default 20)."""
    return _env_limit(WORK_ENV, WORK_DEFAULT_G, 10**9)


@dataclass(frozen=True)
class Cost:
    """What running a leaf costs: bytes per case and fixed, bytes of every operation's output per case, work."""

    where: str
    per_case: int  # the memory regions plus the largest operation's working set
    fixed: int  # what does not grow with the cases (element offsets, decoded weights)
    outputs: int  # every operation's output feature map, in its own element size
    work: int  # element operations per case

    def _case(self, keep_outputs: bool, reference: int) -> int:
        # verify keeps each operation's output, and TFLite's reference run every tensor of each case (``reference``
        # bytes), twice while it stacks them
        return self.per_case + (self.outputs + 2 * reference if keep_outputs else 0)

    def bytes_for(self, cases: int, keep_outputs: bool, reference: int = 0) -> int:
        return self.fixed + cases * self._case(keep_outputs, reference)

    def max_cases(self, keep_outputs: bool, reference: int = 0) -> int:
        by_memory = (memory_limit() - self.fixed) // max(self._case(keep_outputs, reference), 1)
        return max(0, min(by_memory, work_limit() // max(self.work, 1)))

    def over(self, cases: int, keep_outputs: bool, reference: int = 0) -> str | None:
        """Why ``cases`` cases are too many (memory or work, with the figures), or None."""
        need, mem = self.bytes_for(cases, keep_outputs, reference), memory_limit()
        if need > mem:
            return f"about {need / MIB:,.0f} MiB for {cases:,} cases, over the memory limit of {mem / MIB:,.0f} MiB"
        work, lim = cases * self.work, work_limit()
        if work > lim:
            return f"about {work:,} element operations for {cases:,} cases, over the work limit of {lim:,}"
        return None


def leaf_cost(leaf: Leaf, ops: list[Operation]) -> Cost:
    """The cost of running ``leaf`` (its decoded ``ops``), or :class:`NpuModelError` naming the declared size that
    breaks a limit for a single case."""
    where = str(leaf.source)
    mem = memory_limit()
    regions = _region_sizes(leaf, where, mem)
    per_op = [(op, *_operation(op, regions, where)) for op in ops if op.kind != "DMA"]
    per_case = sum(regions.values()) + max((c for _, c, _, _, _ in per_op), default=0)
    fixed = max((f for _, _, f, _, _ in per_op), default=0)
    outputs = sum(o for _, _, _, o, _ in per_op)
    work = sum(w for _, _, _, _, w in per_op)
    worst = max(per_op, key=lambda t: t[1] + t[2], default=None)
    if worst is not None and fixed + per_case + outputs > mem:
        raise NpuModelError(f"{where}: {worst[0].title} needs about {(worst[1] + worst[2]) / MIB:,.0f} MiB for one "
                            f"case (the regions and all outputs {(sum(regions.values()) + outputs) / MIB:,.0f} "
                            f"MiB), over the NPU model's memory limit of {mem / MIB:,.0f} MiB",
                            f"{FIX}, or raise {MEMORY_ENV}")
    lim = work_limit()
    if work > lim:
        heavy = max(per_op, key=lambda t: t[4])
        raise NpuModelError(f"{where}: one case takes about {work:,} element operations ({heavy[0].title}: "
                            f"{heavy[4]:,}), over the NPU model's work limit of {lim:,}", f"{FIX}, or raise {WORK_ENV}")
    return Cost(where, per_case, fixed, outputs, work)


def _region_sizes(leaf: Leaf, where: str, mem: int) -> dict[int, int]:
    """Bytes per case of each region as the NPU model sets them up, each checked against the memory limit."""
    def refuse(what: str) -> None:
        raise NpuModelError(f"{where}: {what}, over the NPU model's memory limit of {mem / MIB:,.0f} MiB",
                            f"{FIX}, or raise {MEMORY_ENV}")

    arena, arena_from = leaf.scratch_size, f"the scratch tensor declares {leaf.scratch_size:,} bytes"
    for what, size in ((arena_from, arena), ("the fast scratch tensor declares "
                                             f"{leaf.scratch_fast_size:,} bytes", leaf.scratch_fast_size)):
        if size < 0:
            raise NpuModelError(f"{where}: {what}", "compile the model again with Vela")
        if size > mem:
            refuse(what)
    for kind, tensors in (("input", leaf.inputs), ("output", leaf.outputs)):
        for t in tensors:
            if any(int(d) < 1 for d in t.shape) or t.dtype not in DTYPES:
                raise NpuModelError(f"{where}: {kind} '{t.name}' declares shape {list(t.shape)} of {t.dtype}",
                                    "compile the model again with Vela")
            end = t.address + t.nbytes
            what = f"{kind} '{t.name}' at arena offset {t.address:,} ends at {end:,}"
            if t.address < 0 or end > mem:
                refuse(what)
            if t.region == REGION_SCRATCH and end > arena:
                arena, arena_from = end, what
    sizes = {REGION_WEIGHTS: len(leaf.weights), REGION_SCRATCH: arena,
             REGION_SCRATCH_FAST: max(leaf.scratch_fast_size, 0), -1: max(leaf.shram_bytes, 2048)}
    if sum(sizes.values()) > mem:
        refuse(f"{arena_from} ({sum(sizes.values()):,} bytes with the other regions)")
    return sizes


def _element_size(op: Operation, prefix: str) -> int:
    prec = op.reg(f"{prefix}_PRECISION")
    sizes, bits = (OFM_SIZES, (prec >> 1) & 0x3) if prefix == "OFM" else (IFM_SIZES, (prec >> 2) & 0x3)
    return sizes.get(bits, 4)


def _fits(op: Operation, prefix: str, shape: tuple[int, int, int], regions: dict[int, int], where: str,
          fields: str) -> int:
    """Bytes of a feature map of ``shape``; refused when it holds more than its region (each element needs its own
    bytes there)."""
    size = _element_size(op, prefix)
    region = op.reg(f"{prefix}_REGION")
    nbytes = shape[0] * shape[1] * shape[2] * size
    # an Ethos-U85 feature map in the chaining buffer (storage 2) or none (3) takes no region's bytes
    in_memory = op.registers is None or (op.reg(f"{prefix}_PRECISION") >> 14) & 0x3 < 2
    if in_memory and region in regions and nbytes > regions[region]:
        raise NpuModelError(f"{where}: {op.title}: {prefix} is {'x'.join(map(str, shape))} {8 * size}-bit elements "
                            f"({nbytes:,} bytes; {fields}), more than region {region} holds ({regions[region]:,} "
                            "bytes)", FIX)
    return nbytes


def _operation(op: Operation, regions: dict[int, int], where: str) -> tuple[int, int, int, int]:
    """(working bytes per case, fixed bytes, output bytes per case, element operations per case) of one operation."""
    oh, ow, od = ofm_shape(op)
    out_bytes = _fits(op, "OFM", (oh, ow, od), regions, where, "OFM_HEIGHT_M1, OFM_WIDTH_M1, OFM_DEPTH_M1")
    out = oh * ow * od
    if op.kind == "ELEMENTWISE":
        ins = _fits(op, "IFM", (oh, ow, od), regions, where, "the OFM's size") // _element_size(op, "IFM")
        flags = op.r0.get("IFM2_BROADCAST", 0)
        scalar = 8 if op.registers is not None else 128  # the U85's broadcast flags, or the U55's
        if op.sub_op not in ("CLZ", "ABS", "LRELU") and not flags & scalar:  # a second feature map, not a scalar
            second = (1 if flags & 1 else oh, 1 if flags & 2 else ow, 1 if flags & 4 else od)
            ins += _fits(op, "IFM2", second, regions, where, "the OFM's size and IFM2_BROADCAST") // \
                _element_size(op, "IFM2")
        return F64 * 8 * out, F64 * 4 * (ins + out), out_bytes, 32 * out + 2 * ins
    if op.kind == "RESIZE":  # the U85's: reads its IFM once, writes each output element once
        read = (op.reg("IFM_HEIGHT0_M1") + 1, op.reg("IFM_WIDTH0_M1") + 1, od)
        ins = _fits(op, "IFM", read, regions, where, "IFM_HEIGHT0_M1, IFM_WIDTH0_M1 and the OFM's depth") // \
            _element_size(op, "IFM")
        return F64 * 4 * (ins + out), F64 * 4 * ins, out_bytes, 32 * out + ins
    k = kernel(op)
    positions = k.height * k.width
    if positions > KERNEL_POSITIONS:
        raise NpuModelError(f"{where}: {op.title}: a {k.height}x{k.width} kernel (KERNEL_HEIGHT_M1, KERNEL_WIDTH_M1) "
                            f"has {positions:,} positions, over the limit of {KERNEL_POSITIONS:,}", FIX)
    top, bottom, left, right = _padding(op)
    ih = (oh - 1) * k.stride_y + (k.height - 1) * k.dilation_y + 1 - top - bottom
    iw = (ow - 1) * k.stride_x + (k.width - 1) * k.dilation_x + 1 - left - right
    depthwise = op.kind == "DEPTHWISE"
    depth = od if depthwise or op.kind == "POOL" else op.reg("IFM_DEPTH_M1") + 1
    if op.kind == "POOL" and op.sub_op == "REDUCE_SUM":
        depth = op.reg("IFM_DEPTH_M1") + 1
    if ih <= 0 or iw <= 0:
        raise NpuModelError(f"{where}: {op.title}: the padding (IFM_PAD_*) leaves no input ({ih}x{iw})", FIX)
    up = op.r0.get("IFM_UPSCALE", 0) != 0
    read = ((ih + 1) // 2, (iw + 1) // 2, depth) if up else (ih, iw, depth)
    fields = "from the OFM's size, KERNEL_*, KERNEL_STRIDE and IFM_PAD_*"
    _fits(op, "IFM", read, regions, where, f"{'half ' if up else ''}{fields}")
    n_read = read[0] * read[1] * read[2]
    padded = (ih + top + bottom) * (iw + left + right) * depth
    taps = positions if op.kind == "POOL" and op.sub_op in ("MAX", "AVERAGE") else 2
    per_case = F64 * (2 * n_read + ih * iw * depth + padded + (taps + 6) * out)
    if op.kind == "POOL":
        return per_case, F64 * 4 * n_read, out_bytes, positions * out + n_read + 32 * out
    weights = od * positions * (1 if depthwise else depth)
    fixed = F64 * (6 * weights + 4 * n_read)
    return per_case, fixed, out_bytes, weights * oh * ow + n_read + 32 * out + positions * out
