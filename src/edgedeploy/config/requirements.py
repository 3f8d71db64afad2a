"""Requirement limits (largest accuracy drop, flash, SRAM, latency, NPU cycles): one validator for all of them.

The same checks apply wherever a limit comes from: a command-line flag (``report``, ``optimize --walk``,
``compile --walk``), the ``[requirements]`` table of a project file, or the requirements a walk recorded in a
run's manifest. A limit is a finite number within :data:`REQUIREMENTS`; NaN, infinities, a number too large to mean
anything and a negative size are one error naming where the value came from.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any, Mapping

from edgedeploy.errors import EdgeDeployError, UsageError
from edgedeploy.core.files import short


@dataclass(frozen=True)
class Requirement:
    """One limit a user may set: its bounds, what it limits in a report row, and how it is described."""

    kind: type  # float or int
    low: float
    high: float
    low_open: bool  # True: the value must be above ``low``; False: at least ``low``
    unit: str  # in words, for the bounds
    symbol: str  # as values are written (edgedeploy.core.units.fmt_in_unit): pts, B, ms, cycles; "" own unit
    column: str  # the report row value it limits
    sign: int  # -1 where the row value is a gain (the accuracy delta) and the limit a loss
    label: str  # what it limits, in a check's label ("{reference}": the reference leaf)
    what: str  # the project file key's description

    def allowed(self) -> str:
        what = "an integer" if self.kind is int else "a number"
        low = f"above {_num(self.low)}" if self.low_open else f"from {_num(self.low)}"
        to = "up to" if self.low_open else "to"
        return f"{what} {low} {to} {_num(self.high)} ({self.unit})"


def _num(value: float) -> str:
    if float(value).is_integer():
        v = int(value)
        return f"2**{v.bit_length() - 1}" if v >= 2**20 and v & (v - 1) == 0 else f"{v:,}"
    return f"{value:g}"


# Every requirement, in the order options, project keys and reports list them: the one table of their names,
# bounds (docs/reference/project.md and docs/files.md list them) and meaning.
REQUIREMENTS: dict[str, Requirement] = {
    "max_accuracy_drop": Requirement(float, 0.0, 100.0, False, "percentage points", "pts", "int8_accuracy_delta_pts",
                                     -1, "int8 accuracy drop vs {reference}",
                                     "int8 accuracy points below the ptq leaf"),
    "max_metric_drop": Requirement(float, 0.0, 1e12, False, "the metric's own unit", "", "int8_metric_drop", 1,
                                   "int8 metric drop vs {reference}",
                                   "the leaf's metric (MSE, PSNR ...) worse than the ptq leaf's, in its unit"),
    "max_flash": Requirement(int, 0, 2**40, True, "bytes", "B", "compiled_model_bytes", 1, "flash (compiled model)",
                             "bytes of the compiled model, e.g. 512KiB (1 B to 1 TiB)"),
    "max_sram": Requirement(int, 0, 2**40, True, "bytes", "B", "sram_bytes", 1, "SRAM",
                            "bytes of Vela's SRAM estimate, e.g. 256KiB (1 B to 1 TiB)"),
    "max_latency_ms": Requirement(float, 0.0, 3_600_000.0, True, "milliseconds", "ms", "latency_ms", 1, "latency",
                                  "milliseconds per inference"),
    "max_npu_cycles": Requirement(int, 0, 2**53, True, "cycles", "cycles", "npu_cycles", 1, "NPU cycles",
                                  "NPU cycles per inference (Vela's estimate)"),
}
REQUIREMENT_NAMES = tuple(REQUIREMENTS)
SIZE_KEYS = ("max_flash", "max_sram")

_SIZE_RE = re.compile(r"^\s*(?P<num>\d+(?:\.\d+)?)\s*(?P<unit>[A-Za-z]*)\s*$")
SIZE_UNITS = {
    "": 1, "b": 1,
    "kib": 1024, "mib": 1024**2, "gib": 1024**3,
    "kb": 1000, "mb": 1000**2, "gb": 1000**3,
}  # fmt: skip
# The largest size any text or number may give (far beyond any memory; keeps the arithmetic exact).
SIZE_LIMIT = 2**53


def parse_size(text: str | int | float, what: str = "size") -> int:
    """Bytes from ``123``, ``512KiB``, ``2MiB``, ``1.5MB`` (KiB/MiB/GiB are powers of 1024, kB/MB/GB of 1000)."""
    hint = "give a number of bytes or a size like 512KiB or 2MiB"
    if isinstance(text, bool):
        raise UsageError(f"{what} is {text!r}", hint)
    if isinstance(text, (int, float)):
        if isinstance(text, float) and not math.isfinite(text):
            raise UsageError(f"{what} is {text}", "give a finite size")
        if text < 0:
            raise UsageError(f"{what} is {short(str(text), 60)}", "give a non-negative size")
        if text > SIZE_LIMIT:
            raise UsageError(f"{what} is {short(str(text), 60)}", f"give a size of at most 2**53 bytes; {hint}")
        return int(round(text))
    m = _SIZE_RE.match(str(text))
    unit = m.group("unit").lower() if m else None
    if not m or unit not in SIZE_UNITS:
        raise UsageError(
            f"{what} is '{short(str(text), 60)}'",
            "give a number of bytes or a size like 512KiB, 2MiB (powers of 1024) or 64kB, 1MB (powers of 1000)",
        )
    value = float(m.group("num")) * SIZE_UNITS[unit]  # a 400-digit number is inf here
    if not math.isfinite(value) or value > SIZE_LIMIT:
        raise UsageError(f"{what} is '{short(str(text), 60)}'", f"give a size of at most 2**53 bytes; {hint}")
    return int(round(value))


def check_requirement(name: str, value: Any, where: str, error: type[EdgeDeployError] = UsageError,
                      hint: str | None = None) -> int | float:
    """``value`` of the limit ``name`` (a key of :data:`REQUIREMENTS`) as a number within its bounds, or ``error``
    saying ``where`` the value came from (``--max-flash``, ``FILE: key `requirements.max_flash```) and what is
    allowed. Sizes may be text (``512KiB``)."""
    bound = REQUIREMENTS[name]
    if name in SIZE_KEYS and isinstance(value, str):
        try:
            value = parse_size(value, where)
        except UsageError as exc:
            raise error(f"{exc.message}; it must be {bound.allowed()}, or a size like 512KiB or 2MiB",
                        hint or exc.hint) from None
    shown = short(repr(value), 60)

    def fail(what: str) -> EdgeDeployError:
        return error(f"{where} is {shown}; it must be {what}", hint or "give a value within those bounds")

    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise fail(bound.allowed())
    if isinstance(value, float) and not math.isfinite(value):
        raise fail(f"a finite number: {bound.allowed()}")
    if bound.kind is int and isinstance(value, float):
        if not value.is_integer():
            raise fail(bound.allowed())
    too_low = value <= bound.low if bound.low_open else value < bound.low
    if too_low or value > bound.high:
        raise fail(bound.allowed())
    return int(value) if bound.kind is int else float(value)


def check_requirements(values: Mapping[str, Any], where: str = "--{flag}", error: type[EdgeDeployError] = UsageError,
                       hint: str | None = None) -> dict[str, Any]:
    """The limits of ``values`` that are not None, each through :func:`check_requirement`. ``{name}`` and ``{flag}`` in
    ``where`` become the limit's name (``max_flash``) and flag (``max-flash``), to say where a bad value came from."""
    out: dict[str, int | float] = {}
    for name, value in values.items():
        if value is None:
            continue
        shown = where.replace("{name}", short(str(name), 60)).replace("{flag}", short(str(name), 60).replace("_", "-"))
        if name not in REQUIREMENTS:
            raise error(f"{shown} is not a known requirement", f"allowed: {', '.join(REQUIREMENT_NAMES)}")
        out[name] = check_requirement(name, value, shown, error, hint)
    return out
