"""What the user asks of a leaf: sizes, requirements and regression tolerances."""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import UsageError
from edgedeploy.config.requirements import (  # noqa: F401  (the one size reader)
    REQUIREMENT_NAMES, SIZE_UNITS, check_requirements, parse_size,
)
from edgedeploy.config.keys import read_toml


@dataclass(frozen=True)
class Tolerance:
    """How much worse a metric may get before the regression gate fails: an amount, relative (%) or absolute."""

    amount: float
    relative: bool  # True: percent of the old value; False: in the metric's own unit

    def allowed(self, old: float) -> float:
        return abs(old) * self.amount / 100.0 if self.relative else self.amount

    def __str__(self) -> str:
        return f"{self.amount:g}%" if self.relative else f"{self.amount:g}"


# What the regression gate compares: name -> (row value key, higher is better, label, unit).
GATED = {
    "accuracy": ("int8_accuracy_pct", True, "int8 accuracy", "%"),
    "flash": ("compiled_model_bytes", False, "flash (compiled model)", "B"),
    "sram": ("sram_bytes", False, "SRAM", "B"),
    "cycles": ("total_cycles", False, "total cycles", "cycles"),
    # a leaf judged by another metric than accuracy (MSE, PSNR ...): its direction is in the cell
    "metric": ("int8_metric", True, "int8 metric", ""),
}
DEFAULT_TOLERANCES = {
    "accuracy": Tolerance(0.5, False),
    "flash": Tolerance(1.0, True),
    "sram": Tolerance(1.0, True),
    "cycles": Tolerance(2.0, True),
    "metric": Tolerance(1.0, True),
}
# as the options say it: accuracy=0.5,flash=1%,sram=1%,cycles=2% (the metric's applies to a leaf judged by one)
DEFAULT_TOLERANCE_TEXT = ",".join(f"{k}={t}" for k, t in DEFAULT_TOLERANCES.items() if k != "metric")


def parse_tolerances(text: str | None) -> dict[str, Tolerance]:
    """``accuracy=0.5,flash=1%,sram=1KiB,cycles=2%`` over the defaults; accuracy is in percentage points."""
    out = dict(DEFAULT_TOLERANCES)
    if not text:
        return out
    for part in (p.strip() for p in text.split(",") if p.strip()):
        name, sep, value = part.partition("=")
        name, value = name.strip().lower(), value.strip()
        if not sep or name not in GATED:
            raise UsageError(
                f"--tolerance item '{part}' is not NAME=VALUE with NAME one of {', '.join(GATED)}",
                f"e.g. --tolerance {DEFAULT_TOLERANCE_TEXT}",
            )
        try:
            if value.endswith("%"):
                if name == "accuracy":
                    raise UsageError(
                        f"--tolerance accuracy={value}: accuracy tolerance is in percentage points",
                        "write it without %, e.g. accuracy=0.5",
                    )
                amount, relative = float(value[:-1]), True
            elif name in ("flash", "sram"):
                amount, relative = float(parse_size(value, f"--tolerance {name}")), False
            else:
                amount, relative = float(value), False
        except ValueError:
            raise UsageError(f"--tolerance {name}={value} is not a number", "e.g. cycles=2% or accuracy=0.5") from None
        if amount < 0 or not math.isfinite(amount):
            raise UsageError(f"--tolerance {name}={value} is {'negative' if amount < 0 else 'not a finite number'}",
                             "use a finite tolerance >= 0")
        out[name] = Tolerance(amount, relative)
    return out




@dataclass(frozen=True)
class Requirements:
    """What the user needs; None means no limit."""

    max_accuracy_drop: float | None = None  # percentage points of int8 accuracy below the ptq leaf
    max_metric_drop: float | None = None  # the leaf's metric worse than the ptq leaf's, in its unit (any task)
    max_flash: int | None = None  # bytes of the compiled model (what firmware stores in flash)
    max_sram: int | None = None  # bytes, Vela's SRAM estimate
    max_latency_ms: float | None = None
    max_npu_cycles: int | None = None  # Vela's NPU cycle estimate
    sources: tuple[str, ...] = ()

    KEYS = REQUIREMENT_NAMES  # the fields above, in the order of edgedeploy.config.requirements.REQUIREMENTS

    def given(self) -> dict[str, float | int]:
        return {k: getattr(self, k) for k in self.KEYS if getattr(self, k) is not None}

    def over(self, base: "Requirements") -> "Requirements":
        """These requirements, falling back to ``base`` for those not set here."""
        values = {k: getattr(self, k) if getattr(self, k) is not None else getattr(base, k) for k in self.KEYS}
        sources = tuple(s for s in (*self.sources, *base.sources) if s)
        return Requirements(**values, sources=sources)

    def to_dict(self) -> dict[str, Any]:
        return {**{k: getattr(self, k) for k in self.KEYS}, "sources": list(self.sources)}


def requirements_from_project(path: Path) -> Requirements:
    """The ``[requirements]`` table of an ``edgedeploy.toml`` project file (empty when it has none)."""
    path = Path(path)
    data = read_toml(path, "project file", UsageError)  # a missing, unreadable or malformed file is one error
    return requirements_from_table(data.get("requirements"), path)


def requirements_from_table(table: Any, path: Path) -> Requirements:
    """The ``[requirements]`` table ``table`` of the project file ``path``, already read (None: it has none)."""
    if table is None:
        return Requirements()
    if not isinstance(table, dict):
        raise UsageError(f"{path}: key `requirements` must be a table", "write it as [requirements]")
    unknown = sorted(set(table) - set(Requirements.KEYS))
    if unknown:
        raise UsageError(
            f"{path}: key `requirements.{unknown[0]}` is not known",
            f"allowed keys: {', '.join(Requirements.KEYS)}",
        )
    values = check_requirements(table, f"{path}: key `requirements.{{name}}`", UsageError,
                                "fix the project file (sizes: bytes or a string like \"512KiB\")")
    return Requirements(**values, sources=(f"{path} [requirements]",))
