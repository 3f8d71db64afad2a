"""Decode a register command stream into operations, each with the register values in force when it starts.

The U55/U65 command and register codes are Vela's own (``ethosu.vela.ethos_u55_regs``), imported when a stream
is decoded; the Ethos-U85's, in the same word layout, are in :mod:`edgedeploy.npu.u85_commands`. A word is
``code | mode | param << 16``: mode 0 is a 16-bit command (cmd0, an operation or a 16-bit register), mode 0x4000
adds a 32-bit payload word (cmd1, an address, length, stride or scale).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import lru_cache
from types import SimpleNamespace
from typing import Any

from ..errors import NpuModelError
from . import u85_commands

PAYLOAD32 = 0x4000
MODE_MASK = 0xC000
CODE_MASK = 0x03FF
OPERATIONS = ("NPU_OP_CONV", "NPU_OP_DEPTHWISE", "NPU_OP_POOL", "NPU_OP_ELEMENTWISE", "NPU_OP_DMA_START")
# Commands with no effect on results: waits, interrupts, the PMU and what only steers timing or SHRAM layout.
NO_RESULT = {"NPU_OP_STOP", "NPU_OP_IRQ", "NPU_OP_DMA_WAIT", "NPU_OP_KERNEL_WAIT", "NPU_OP_PMU_MASK"}
# Operations per stream: each keeps a copy of the registers in force (about 3 KB). Vela's streams for the MLPerf
# Tiny models hold 50 to 120; a stream of more is refused before its copies grow without bound.
OPERATIONS_LIMIT = 65_536


@lru_cache(maxsize=1)
def regs() -> SimpleNamespace:
    """Vela's register definitions, with code -> name tables."""
    try:
        from ethosu.vela.ethos_u55_regs import ethos_u55_regs as r
    except ImportError as exc:  # pragma: no cover - Vela is a dependency
        from ..errors import ToolMissingError

        raise ToolMissingError("Vela (ethos-u-vela) is not installed", "pip install ethos-u-vela==5.2.0") from exc
    return SimpleNamespace(
        module=r,
        family="Ethos-U55/U65",
        operations=OPERATIONS,
        no_result=NO_RESULT,
        cmd0={m.value: m.name for m in r.cmd0},
        cmd1={m.value: m.name for m in r.cmd1},
        pooling={m.value: m.name for m in r.pooling_mode},
        elementwise={m.value: m.name for m in r.elementwise_mode},
        rounding={m.value: m.name for m in r.rounding},
        activation=r.activation,
    )


@dataclass
class Operation:
    """One NPU operation: its kind, its parameter, the word it sits at and the registers in force."""

    index: int  # position among the stream's operations (DMA included)
    kind: str  # CONV, DEPTHWISE, POOL, ELEMENTWISE, DMA
    param: int  # the operation command's parameter (pooling or elementwise mode, DMA channel/mode)
    word: int  # word offset of the operation command in the stream
    r0: dict[str, int]  # 16-bit registers by name (NPU_SET_ prefix dropped)
    r1: dict[str, int]  # 32-bit registers by name (payload word, plus param << 32 for 40-bit addresses)
    # the register set the stream was decoded with (None: the U55/U65's)
    registers: SimpleNamespace | None = field(default=None, repr=False, compare=False)

    @property
    def sub_op(self) -> str:
        r = self.registers or regs()
        if self.kind == "POOL":
            return r.pooling.get(self.param, f"pooling mode {self.param}")
        if self.kind == "ELEMENTWISE":
            return r.elementwise.get(self.param, f"elementwise mode {self.param}")
        return ""

    @property
    def title(self) -> str:
        return f"operation {self.index} ({self.kind}{' ' + self.sub_op if self.sub_op else ''}, word {self.word})"

    def reg(self, name: str) -> int:
        """A 16-bit register's value; one that was never set stops the model with its name."""
        if name in self.r0:
            return self.r0[name]
        raise NpuModelError(f"{self.title}: register NPU_SET_{name} was never set", "compile the model again with Vela")

    def reg32(self, name: str) -> int:
        if name in self.r1:
            return self.r1[name]
        raise NpuModelError(f"{self.title}: register NPU_SET_{name} was never set", "compile the model again with Vela")

    def signed(self, name: str) -> int:
        v = self.reg(name)
        return v - 0x10000 if v & 0x8000 else v


def decode(words: tuple[int, ...] | list[int], where: str = "command stream",
           registers: SimpleNamespace | None = None) -> list[Operation]:
    """The operations of a command stream, in order; an unknown or unmodelled command stops with its name.

    ``registers`` is the register set (:func:`regs` for the U55/U65, the default;
    :func:`edgedeploy.npu.u85_commands.registers` for the U85)."""
    r = registers or regs()
    tagged = registers
    r0: dict[str, int] = {}
    r1: dict[str, int] = {}
    ops: list[Operation] = []
    i = 0
    n = len(words)
    while i < n:
        word = words[i]
        code, mode, param = word & CODE_MASK, word & MODE_MASK, word >> 16
        if mode == PAYLOAD32:
            name = r.cmd1.get(code)
            if name is None or i + 1 >= n:
                what = f"an unknown 32-bit command {code:#x}" if name is None else "cut short"
                raise NpuModelError(f"{where}: word {i} is {what}",
                                    "the stream is corrupt or from a newer NPU; compile again with Vela 5.2")
            if name.startswith("NPU_OP_"):  # the U85's branch: control flow inside the stream
                raise NpuModelError(f"{where}: word {i} is {name}, which is not modelled",
                                    "compile the model again with Vela 5.2 (it writes no branches)")
            r1[name.removeprefix("NPU_SET_")] = words[i + 1] | (param << 32)
            i += 2
            continue
        if mode != 0:
            raise NpuModelError(f"{where}: word {i} ({word:#010x}) has an unknown payload mode",
                                "the stream is corrupt; compile again with Vela 5.2")
        name = r.cmd0.get(code)
        if name is None:
            raise NpuModelError(f"{where}: word {i} is an unknown command {code:#x}",
                                "the stream is corrupt or from a newer NPU; compile again with Vela 5.2")
        if name in r.operations:
            if len(ops) == OPERATIONS_LIMIT:
                raise NpuModelError(f"{where}: word {i} starts operation {len(ops):,}, over the limit of "
                                    f"{OPERATIONS_LIMIT:,} operations per stream",
                                    "the stream is corrupt; compile again with Vela 5.2")
            kind = name.removeprefix("NPU_OP_").removesuffix("_START")
            ops.append(Operation(len(ops), kind, param, i, dict(r0), dict(r1), tagged))
        elif name == "NPU_OP_STOP":
            break
        elif name not in r.no_result:
            r0[name.removeprefix("NPU_SET_")] = param
        i += 1
    return ops


def decode_for(product: int, words: tuple[int, ...] | list[int], where: str = "command stream") -> list[Operation]:
    """Decode a stream with the register set of the NPU ``product`` the driver payload names."""
    return decode(words, where, u85_commands.registers() if product == u85_commands.PRODUCT else None)


def counts(ops: list[Operation]) -> dict[str, int]:
    """How many operations of each kind (as Vela's ``--verbose-register-command-stream`` counts them)."""
    found: dict[str, int] = {}
    for op in ops:
        found[op.kind] = found.get(op.kind, 0) + 1
    return found


def describe(op: Operation) -> dict[str, Any]:
    """The registers of one operation, for a report."""
    return {"index": op.index, "kind": op.kind, "sub_op": op.sub_op, "word": op.word, **op.r0,
            **{k: v for k, v in op.r1.items()}}
