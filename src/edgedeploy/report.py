"""Judging saved results: variants × targets, requirements, recommendation, regressions.

The reporter reads only a run's manifest and the files it names; it never runs
a tool. :func:`build_report` turns the stage records into one row per
(leaf, target) and adds judgments (fits the board, Pareto front, meets the
requirements, recommended leaf, compression diagnostics). The result is a
versioned JSON document; every other format is rendered from that document
(:mod:`edgedeploy.report_render`), so all formats show the same numbers.
"""

from __future__ import annotations

import math
import re
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Mapping

from . import __version__
from .errors import InvalidInputError, RegressionError, UsageError
from .fsutil import sha256_file
from .manifest import Manifest, StageRecord, now_iso

SCHEMA = "edgedeploy.report"
SCHEMA_VERSION = 1

# --------------------------------------------------------------------------- the deployment tree

# Levels of the deployment tree, least optimized first. The recommendation takes
# the least-optimized leaf that meets every requirement and that no other such
# leaf beats on accuracy, flash and latency at once. A name ending in one of LEVEL_SUFFIXES has the level of its base
# (``pruned_ptq`` is ``pruned``; ``pcqat_palette`` is ``pcqat``).
LEAF_LEVELS: dict[str, int] = {
    "ptq": 0,
    "qat": 1,
    "pruned": 2,
    "clustered": 2,
    "pqat": 3,
    "cqat": 3,
    "pruned_clustered": 3,
    "pcqat": 4,
}
LEVEL_SUFFIXES = ("_palette", "_ptq")
REFERENCE_LEAF = "ptq"
# Leaves whose weights were clustered, so Vela's palette encoding should apply to them.
CLUSTERED_LEAVES = frozenset({"clustered", "cqat", "pruned_clustered", "pcqat"})

# Vela's weight encoder keeps a palette of at most 32 distinct values per weight stream.
PALETTE_LIMIT = 32


def base_leaf(name: str) -> str:
    for suffix in LEVEL_SUFFIXES:
        if name.endswith(suffix) and name[: -len(suffix)] in LEAF_LEVELS:
            return name[: -len(suffix)]
    return name


def leaf_level(name: str) -> int | None:
    """The tree level of a leaf name, or None for a variant that is not a tree leaf (an imported .tflite)."""
    return LEAF_LEVELS.get(base_leaf(name))


def is_clustered_leaf(name: str) -> bool:
    return base_leaf(name) in CLUSTERED_LEAVES or name.endswith("_palette")


# --------------------------------------------------------------------------- sizes and tolerances

_SIZE_RE = re.compile(r"^\s*(?P<num>\d+(?:\.\d+)?)\s*(?P<unit>[A-Za-z]*)\s*$")
SIZE_UNITS = {
    "": 1, "b": 1,
    "kib": 1024, "mib": 1024**2, "gib": 1024**3,
    "kb": 1000, "mb": 1000**2, "gb": 1000**3,
}  # fmt: skip


def parse_size(text: str | int | float, what: str = "size") -> int:
    """Bytes from ``123``, ``512KiB``, ``2MiB``, ``1.5MB`` (KiB/MiB/GiB are powers of 1024, kB/MB/GB of 1000)."""
    if isinstance(text, bool):
        raise UsageError(f"{what} is {text!r}", "give a number of bytes or a size like 512KiB or 2MiB")
    if isinstance(text, (int, float)):
        if text < 0:
            raise UsageError(f"{what} is {text}", "give a non-negative size")
        return int(round(text))
    m = _SIZE_RE.match(str(text))
    unit = m.group("unit").lower() if m else None
    if not m or unit not in SIZE_UNITS:
        raise UsageError(
            f"{what} is '{text}'",
            "give a number of bytes or a size like 512KiB, 2MiB (powers of 1024) or 64kB, 1MB (powers of 1000)",
        )
    return int(round(float(m.group("num")) * SIZE_UNITS[unit]))


@dataclass(frozen=True)
class Tolerance:
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
}
DEFAULT_TOLERANCES = {
    "accuracy": Tolerance(0.5, False),
    "flash": Tolerance(1.0, True),
    "sram": Tolerance(1.0, True),
    "cycles": Tolerance(2.0, True),
}
DEFAULT_TOLERANCE_TEXT = "accuracy=0.5,flash=1%,sram=1%,cycles=2%"


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
        if amount < 0 or math.isnan(amount):
            raise UsageError(f"--tolerance {name}={value} is negative", "use a tolerance >= 0")
        out[name] = Tolerance(amount, relative)
    return out


# --------------------------------------------------------------------------- requirements


@dataclass(frozen=True)
class Requirements:
    """What the user needs; None means no limit."""

    max_accuracy_drop: float | None = None  # percentage points of int8 accuracy below the ptq leaf
    max_flash: int | None = None  # bytes of the compiled model (what firmware stores in flash)
    max_sram: int | None = None  # bytes, Vela's SRAM estimate
    max_latency_ms: float | None = None
    max_npu_cycles: int | None = None  # Vela's NPU cycle estimate
    sources: tuple[str, ...] = ()

    KEYS = ("max_accuracy_drop", "max_flash", "max_sram", "max_latency_ms", "max_npu_cycles")

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
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise UsageError(f"project file {path} does not exist", "check the path given to --project") from None
    except tomllib.TOMLDecodeError as exc:
        raise UsageError(f"{path}: not valid TOML ({exc})", "fix the syntax") from exc
    table = data.get("requirements")
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
    values: dict[str, Any] = {}
    for key in ("max_accuracy_drop", "max_latency_ms"):
        if key in table:
            v = table[key]
            if isinstance(v, bool) or not isinstance(v, (int, float)) or v < 0:
                raise UsageError(f"{path}: key `requirements.{key}` is {v!r}; it must be a number >= 0",
                                 "fix the project file")
            values[key] = float(v)
    if "max_npu_cycles" in table:
        v = table["max_npu_cycles"]
        if isinstance(v, bool) or not isinstance(v, int) or v < 0:
            raise UsageError(f"{path}: key `requirements.max_npu_cycles` is {v!r}; it must be an integer >= 0",
                             "fix the project file")
        values["max_npu_cycles"] = v
    for key in ("max_flash", "max_sram"):
        if key in table:
            try:
                values[key] = parse_size(table[key], f"{path}: key `requirements.{key}`")
            except UsageError as exc:
                raise UsageError(exc.message, "use bytes or a string like \"512KiB\" in the project file") from None
    return Requirements(**values, sources=(f"{path} [requirements]",))


# --------------------------------------------------------------------------- values


def val(value: Any, unit: str, mode: str) -> dict[str, Any]:
    return {"value": value, "unit": unit, "mode": mode}


def na(unit: str, mode: str, reason: str) -> dict[str, Any]:
    return {"value": None, "unit": unit, "mode": mode, "unavailable": reason}


def value_of(cell: Mapping[str, Any] | None) -> Any:
    return None if cell is None else cell.get("value")


@dataclass(frozen=True)
class Column:
    key: str
    header: str  # with the unit
    unit: str
    kind: str  # how it is shown: text, pct, pts, bytes, count, ratio, ms, rate, mhz


# Row values in the order they are shown. Keys carry their unit, so CSV headers do too.
VALUE_COLUMNS: tuple[Column, ...] = (
    Column("float_accuracy_pct", "Float acc (%)", "%", "pct"),
    Column("int8_accuracy_pct", "Int8 acc (%)", "%", "pct"),
    Column("int8_accuracy_delta_pts", "Δ int8 vs ptq (pts)", "pts", "pts"),
    Column("tflite_bytes", "TFLite (B)", "B", "bytes"),
    Column("gzip_bytes", "gzip (B)", "B", "bytes"),
    Column("encoded_weights_bytes", "NPU-encoded weights (B)", "B", "bytes"),
    Column("encoded_weights_ratio", "Weights vs ptq (×)", "ratio", "ratio"),
    Column("compiled_model_bytes", "Flash: compiled model (B)", "B", "bytes"),
    Column("vela_flash_bytes", "Vela flash estimate (B)", "B", "bytes"),
    Column("sram_bytes", "SRAM (B)", "B", "bytes"),
    Column("dram_bytes", "DRAM (B)", "B", "bytes"),
    Column("npu_cycles", "NPU cycles", "cycles", "count"),
    Column("total_cycles", "Total cycles", "cycles", "count"),
    Column("npu_clock_mhz", "NPU clock (MHz)", "MHz", "mhz"),
    Column("latency_ms", "Latency (ms)", "ms", "ms"),
    Column("inferences_per_s", "Inferences/s (1/s)", "1/s", "rate"),
    Column("mac_utilization_pct", "MAC util (%)", "%", "rate"),
    Column("cpu_operators", "CPU ops", "count", "count"),
)
KEY_COLUMNS: tuple[Column, ...] = (
    Column("leaf", "Leaf", "", "text"),
    Column("target", "Target", "", "text"),
    Column("level", "Level", "", "text"),
)
JUDGMENT_COLUMNS: tuple[Column, ...] = (
    Column("fits_board", "Fits board", "", "text"),
    Column("pareto", "Pareto front", "", "text"),
    Column("meets_requirements", "Meets requirements", "", "text"),
    Column("recommended", "Recommended", "", "text"),
)
ALL_COLUMNS = KEY_COLUMNS + VALUE_COLUMNS + JUDGMENT_COLUMNS

# Vela metrics copied from compile records: row key -> (manifest metric, unit).
VELA_METRICS = {
    "encoded_weights_bytes": ("encoded_weights_bytes", "B"),
    "vela_flash_bytes": ("flash_bytes", "B"),
    "sram_bytes": ("sram_bytes", "B"),
    "dram_bytes": ("dram_bytes", "B"),
    "npu_cycles": ("npu_cycles", "cycles"),
    "total_cycles": ("total_cycles", "cycles"),
    "latency_ms": ("latency_ms", "ms"),
    "inferences_per_s": ("inferences_per_second", "1/s"),
    "mac_utilization_pct": ("mac_utilization", "%"),
    "cpu_operators": ("cpu_operators", "count"),
}


def from_metric(rec: StageRecord, name: str, unit: str, mode: str, missing: str) -> dict[str, Any]:
    m = rec.metrics.get(name)
    if m is None:
        return na(unit, mode, missing)
    if m.value is None:
        return na(m.unit or unit, m.mode or mode, m.unavailable or missing)
    return val(m.value, m.unit or unit, m.mode or mode)


# --------------------------------------------------------------------------- gathering rows


@dataclass
class _Variant:
    name: str
    accuracy: StageRecord | None = None  # convert/<leaf>
    imported: StageRecord | None = None  # import/<variant>
    compiles: list[StageRecord] = field(default_factory=list)

    @property
    def level(self) -> int | None:
        return leaf_level(self.name) if self.imported is None or self.accuracy is not None else None

    @property
    def source(self) -> StageRecord | None:
        return self.accuracy or self.imported


def _variants(manifest: Manifest) -> list[_Variant]:
    found: dict[str, _Variant] = {}
    for rec in manifest.records.values():
        if not rec.variant or rec.stage not in ("convert", "import", "compile"):
            continue
        v = found.setdefault(rec.variant, _Variant(rec.variant))
        if rec.stage == "convert":
            v.accuracy = rec
        elif rec.stage == "import":
            v.imported = rec
        else:
            v.compiles.append(rec)

    def order(v: _Variant) -> tuple:
        level = v.level
        return (level is None, level if level is not None else 0, v.name)

    return sorted(found.values(), key=order)


def int8_model_path(manifest: Manifest, rec: StageRecord | None) -> Path | None:
    """The int8 .tflite a convert or import record wrote."""
    if rec is None or rec.status == "failed":
        return None
    art = rec.output("int8_model") or next((a for a in rec.outputs if a.path.endswith(".tflite")), None)
    if art is not None:
        return manifest.resolve(art)
    guess = manifest.run_dir / rec.id / "model_int8.tflite"
    return guess if guess.is_file() else None


def _accuracy_values(v: _Variant, ref: _Variant | None) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    acc = v.accuracy
    if acc is None:
        why = (
            f"no accuracy: {v.name} was imported from a .tflite (no convert/{v.name} record)"
            if v.imported is not None
            else f"no accuracy: no convert/{v.name} record"
        )
        out["float_accuracy_pct"] = na("%", "measured", why)
        out["int8_accuracy_pct"] = na("%", "measured", why)
        out["tflite_bytes"] = (
            from_metric(v.imported, "tflite_bytes", "B", "measured", "not recorded")
            if v.imported is not None
            else na("B", "measured", why)
        )
        out["gzip_bytes"] = na("B", "measured", f"no gzip size: no convert/{v.name} record")
    elif acc.status == "failed":
        why = f"convert/{v.name} failed: {acc.error}"
        for key, unit in (("float_accuracy_pct", "%"), ("int8_accuracy_pct", "%"), ("tflite_bytes", "B"),
                          ("gzip_bytes", "B")):
            out[key] = na(unit, "measured", why)
    else:
        why = f"convert/{v.name} recorded no value"
        out["float_accuracy_pct"] = from_metric(acc, "float_accuracy", "%", "measured", why)
        out["int8_accuracy_pct"] = from_metric(acc, "int8_accuracy", "%", "measured", why)
        out["tflite_bytes"] = from_metric(acc, "tflite_bytes", "B", "measured", why)
        out["gzip_bytes"] = from_metric(acc, "gzip_bytes", "B", "measured", why)
    # The difference against the ptq leaf (negative: this leaf lost accuracy).
    mine = value_of(out["int8_accuracy_pct"])
    if ref is None or ref.accuracy is None:
        out["int8_accuracy_delta_pts"] = na("pts", "computed", f"no {REFERENCE_LEAF} leaf with an accuracy in this run")
        return out
    ref_int8 = mine if ref is v else value_of(_accuracy_values(ref, None)["int8_accuracy_pct"])
    if mine is None:
        out["int8_accuracy_delta_pts"] = na("pts", "computed", out["int8_accuracy_pct"]["unavailable"])
    elif ref_int8 is None:
        out["int8_accuracy_delta_pts"] = na("pts", "computed", f"the {REFERENCE_LEAF} leaf has no int8 accuracy")
    else:
        out["int8_accuracy_delta_pts"] = val(mine - ref_int8, "pts", "computed")
    return out


def _compile_values(rec: StageRecord | None, manifest: Manifest, v: _Variant) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    if rec is None:
        why = f"not compiled: no compile/{v.name}/<target> record"
    elif rec.status == "failed":
        why = f"{rec.id} failed: {rec.error}"
    else:
        why = ""
    for key, (metric, unit) in VELA_METRICS.items():
        out[key] = na(unit, "estimated", why) if why else from_metric(rec, metric, unit, "estimated",
                                                                       f"{rec.id} recorded no {metric}")
    if why:
        out["compiled_model_bytes"] = na("B", "measured", why)
        out["npu_clock_mhz"] = na("MHz", "computed", why)
        return out
    art = rec.output("vela_model")
    out["compiled_model_bytes"] = (
        val(art.bytes, "B", "measured") if art is not None else na("B", "measured", f"{rec.id} names no Vela model")
    )
    target = manifest.targets.get(rec.target or "") or {}
    hz = target.get("npu_hz")
    out["npu_clock_mhz"] = (
        val(hz / 1e6, "MHz", "computed") if hz else na("MHz", "computed", f"no clock for {rec.target} in the manifest")
    )
    return out


def _fit(row_values: Mapping[str, Any], target: Mapping[str, Any] | None, target_name: str) -> dict[str, Any]:
    """Whether a compiled leaf fits the board's memory; NPU-only targets have no memory to fit."""
    mem = (target or {}).get("memory")
    if not target or target.get("kind") != "board" or not mem:
        return {"applies": False, "fits": None, "text": "n/a",
                "note": f"{target_name} is an NPU configuration, not a board: no memory sizes to fit"}
    sram, model = value_of(row_values["sram_bytes"]), value_of(row_values["compiled_model_bytes"])
    margin = int(mem.get("runtime_margin_bytes") or 0)
    sram_cap, flash_cap = int(mem["sram_bytes"]), int(mem["flash_bytes"])
    out: dict[str, Any] = {
        "applies": True,
        "board_sram_bytes": sram_cap,
        "board_flash_bytes": flash_cap,
        "runtime_margin_bytes": margin,
        "sram_needed_bytes": None if sram is None else sram + margin,
        "flash_needed_bytes": model,
    }
    if sram is None or model is None:
        out.update(fits=None, text="unknown", note="not compiled for this board")
        return out
    problems = []
    if sram + margin > sram_cap:
        problems.append(f"SRAM {sram:,} B + {margin:,} B runtime margin exceeds {sram_cap:,} B "
                        f"by {sram + margin - sram_cap:,} B")
    if model > flash_cap:
        problems.append(f"compiled model {model:,} B exceeds {flash_cap:,} B flash by {model - flash_cap:,} B")
    out["fits"] = not problems
    out["text"] = "yes" if not problems else "no"
    out["note"] = "; ".join(problems) if problems else (
        f"SRAM {sram:,} B + {margin:,} B runtime margin ≤ {sram_cap:,} B; "
        f"compiled model {model:,} B ≤ {flash_cap:,} B flash"
    )
    dram = value_of(row_values["dram_bytes"])
    if dram:
        out["note"] += f"; DRAM use ({dram:,} B) not checked: the target file gives no DRAM size"
    return out


# --------------------------------------------------------------------------- judgments


def pareto_front(points: Mapping[str, tuple[float, ...]]) -> set[str]:
    """Names of the points no other point dominates; every objective is to be minimised."""
    front = set()
    for name, p in points.items():
        dominated = any(
            all(a <= b for a, b in zip(q, p)) and any(a < b for a, b in zip(q, p))
            for other, q in points.items()
            if other != name
        )
        if not dominated:
            front.add(name)
    return front


def _pareto(rows: list[dict[str, Any]], target: str) -> dict[str, Any]:
    compiled = [r for r in rows if value_of(r["values"]["compiled_model_bytes"]) is not None
                and value_of(r["values"]["total_cycles"]) is not None]
    with_acc = [r for r in compiled if value_of(r["values"]["int8_accuracy_pct"]) is not None]
    if with_acc:
        objectives = ["int8_accuracy_pct (max)", "compiled_model_bytes (min)", "total_cycles (min)"]
        pts = {r["leaf"]: (-value_of(r["values"]["int8_accuracy_pct"]), value_of(r["values"]["compiled_model_bytes"]),
                           value_of(r["values"]["total_cycles"])) for r in with_acc}
        note = "accuracy against flash against total cycles"
        missing = [r for r in compiled if r not in with_acc]
        for r in missing:
            r["pareto"] = None
            r["pareto_note"] = "unavailable: no accuracy for this leaf"
        if missing:
            note += f"; {len(missing)} leaf(s) without an accuracy left out"
    else:
        objectives = ["compiled_model_bytes (min)", "total_cycles (min)"]
        pts = {r["leaf"]: (value_of(r["values"]["compiled_model_bytes"]), value_of(r["values"]["total_cycles"]))
               for r in compiled}
        note = "flash against total cycles only: no leaf has a measured accuracy"
    front = pareto_front(pts)
    for r in compiled:
        if r["leaf"] in pts:
            r["pareto"] = r["leaf"] in front
    return {"target": target, "objectives": objectives, "front": sorted(front, key=lambda n: _leaf_order(n)),
            "note": note}


def _leaf_order(name: str) -> tuple:
    level = leaf_level(name)
    return (level is None, level if level is not None else 0, name)


# Requirement -> (row value, sign applied to it, unit, label): a requirement holds when sign * value <= limit.
REQUIREMENT_VALUES = {
    "max_accuracy_drop": ("int8_accuracy_delta_pts", -1, "pts", f"int8 accuracy drop vs {REFERENCE_LEAF}"),
    "max_flash": ("compiled_model_bytes", 1, "B", "flash (compiled model)"),
    "max_sram": ("sram_bytes", 1, "B", "SRAM"),
    "max_latency_ms": ("latency_ms", 1, "ms", "latency"),
    "max_npu_cycles": ("npu_cycles", 1, "cycles", "NPU cycles"),
}


def _check_requirements(row: dict[str, Any], req: Requirements) -> None:
    checks: dict[str, dict[str, Any]] = {}
    for name, limit in req.given().items():
        key, sign, unit, label = REQUIREMENT_VALUES[name]
        cell = row["values"][key]
        value = None if value_of(cell) is None else sign * value_of(cell)
        check: dict[str, Any] = {"label": f"{label} ≤ {_fmt_limit(limit, unit)}", "limit": limit, "value": value,
                                 "unit": unit}
        if value is None:
            check.update(met=None, why=f"cannot be judged: {cell.get('unavailable', 'unavailable')}")
        else:
            met = value <= limit
            check["met"] = met
            if not met:
                check["excess"] = value - limit
                check["excess_pct"] = 100.0 * (value - limit) / limit if limit else None
        checks[name] = check
    fit = row["fit"]
    if fit["applies"]:
        checks["fits_board"] = {"label": f"fits {row['target']}", "met": fit["fits"], "why": fit["note"],
                                "unit": "", "limit": None, "value": None}
        if fit["fits"] is False:
            over = [
                (fit["sram_needed_bytes"] or 0) - fit["board_sram_bytes"],
                (fit["flash_needed_bytes"] or 0) - fit["board_flash_bytes"],
            ]
            checks["fits_board"]["excess"] = max(o for o in over if o > 0)
            checks["fits_board"]["unit"] = "B"
    row["requirements"] = checks
    row["meets_requirements"] = all(c["met"] is True for c in checks.values()) if checks else None


def _shortfall(check: Mapping[str, Any]) -> float:
    """How far a requirement is missed, relative to its limit (inf when it cannot be judged)."""
    if check["met"] is True:
        return 0.0
    if check["met"] is None:
        return math.inf
    limit = check.get("limit")
    excess = check.get("excess") or 0.0
    return excess / limit if limit else excess


def _describe_miss(name: str, check: Mapping[str, Any], leaf: str) -> str:
    if check["met"] is None:
        return f"{name}: {leaf} {check.get('why', 'cannot be judged')}"
    if name == "fits_board":
        return f"{name}: {leaf} does not fit ({check['why']})"
    unit = check["unit"]
    pct = check.get("excess_pct")
    return (
        f"{name} {_fmt_limit(check['limit'], unit)}: closest is {leaf} with {_fmt_limit(check['value'], unit)}, "
        f"over by {_fmt_limit(check['excess'], unit)}" + (f" ({pct:.1f}%)" if pct is not None else "")
    )


def _fmt_limit(v: Any, unit: str) -> str:
    if v is None:
        return "n/a"
    if unit == "B":
        return f"{int(round(v)):,} B"
    if unit == "ms":
        return f"{v:.4g} ms"
    if unit == "pts":
        return f"{v:.2f} pts"
    if unit == "cycles":
        return f"{int(round(v)):,} cycles"
    return f"{v:g} {unit}".strip()


def _recommend(rows: list[dict[str, Any]], target: str, req: Requirements) -> dict[str, Any]:
    """The least-optimized leaf meeting the requirements that no other meeting leaf beats on accuracy, flash and
    latency at once (:mod:`edgedeploy.recommend`); in a level prefer accuracy, then smaller flash."""
    candidates = [r for r in rows if value_of(r["values"]["total_cycles"]) is not None]
    base = {"target": target, "requirements": req.given()}
    if not candidates:
        return {**base, "leaf": None, "met": False, "judged": False,
                "message": f"no leaf was compiled for {target}; nothing to recommend",
                "unmet": []}
    groups: dict[Any, list[dict[str, Any]]] = {}
    for r in candidates:
        groups.setdefault(r["level"], []).append(r)

    def preference(r: dict[str, Any]) -> tuple:
        acc = value_of(r["values"]["int8_accuracy_pct"])
        return (-(acc if acc is not None else -math.inf), value_of(r["values"]["compiled_model_bytes"]), r["leaf"])

    meeting = [r for r in candidates if r["meets_requirements"] in (True, None)]
    if meeting:  # the least-optimized meeting leaf that no other meeting leaf beats on every axis
        from .recommend import choose

        choice = choose(meeting)
        best, level = choice.row, choice.row["level"]
        best["recommended"] = True
        names = ", ".join(sorted(r["leaf"] for r in groups[level]))
        what = ", ".join(c["label"] for c in best["requirements"].values()) or "no requirements set"
        if level is None:
            why = f"not a leaf of the deployment tree (an imported model); meets: {what}"
        else:
            why = (f"level {level} ({names}) is the least-optimized level with a leaf meeting every "
                   f"requirement ({what}) that no other such leaf beats on accuracy, flash and latency at once")
        if len(groups[level]) > 1:
            why += "; chosen within the level for the best int8 accuracy, then the smallest flash"
        why += choice.why()
        return {**base, "leaf": best["leaf"], "level": level, "met": True, "judged": True,
                "passed_over": choice.beaten,
                "message": f"{target}: recommend {best['leaf']} — {why}", "unmet": []}
    # Nothing meets everything: say which requirement nothing meets, and by how much.
    names = sorted({n for r in candidates for n in r["requirements"]})
    unmet = []
    for name in names:
        checks = [(r, r["requirements"][name]) for r in candidates if name in r["requirements"]]
        if any(c["met"] is True for _, c in checks):
            continue
        r, c = min(checks, key=lambda rc: (_shortfall(rc[1]), preference(rc[0])))
        unmet.append({"requirement": name, "closest_leaf": r["leaf"], "limit": c.get("limit"),
                      "value": c.get("value"), "excess": c.get("excess"), "excess_pct": c.get("excess_pct"),
                      "unit": c.get("unit"), "text": _describe_miss(name, c, r["leaf"])})
    closest = min(candidates, key=lambda r: (sum(_shortfall(c) for c in r["requirements"].values()), preference(r)))
    misses = [_describe_miss(n, c, closest["leaf"]) for n, c in closest["requirements"].items() if c["met"] is not True]
    if unmet:
        message = f"{target}: no leaf meets " + "; ".join(u["text"] for u in unmet)
    else:
        message = (f"{target}: each requirement is met by some leaf but no leaf meets all of them; closest is "
                   f"{closest['leaf']}, which misses " + "; ".join(misses))
    return {**base, "leaf": None, "met": False, "judged": True, "closest_leaf": closest["leaf"],
            "closest_misses": misses, "message": message, "unmet": unmet}


# --------------------------------------------------------------------------- compression diagnostics


# Output-channel axis of the weights of each operator (TFLite layouts: OHWI, 1HWO, OI).
OUTPUT_CHANNEL_AXIS = {"CONV_2D": 0, "DEPTHWISE_CONV_2D": 3, "FULLY_CONNECTED": 0, "TRANSPOSE_CONV": 0,
                       "CONV_3D": 4}


def weight_diagnostics(model_path: Path) -> list[dict[str, Any]]:
    """Distinct int8 values per weight tensor (and per output channel) and the zero fraction."""
    import numpy as np

    from .tflite_model import read_weight_tensors

    out = []
    for w in read_weight_tensors(model_path):
        if w.dtype not in ("int8", "uint8", "int16"):
            continue
        values = w.values()
        # The output-channel axis: the quantized dimension when per-channel, else the operator's layout.
        axis = w.quantized_dimension if len(w.scale) > 1 else OUTPUT_CHANNEL_AXIS.get(w.op, 0)
        axis = axis if 0 <= axis < values.ndim else 0
        per_channel = np.moveaxis(values, axis, 0).reshape(values.shape[axis], -1)
        counts = [int(np.unique(ch).size) for ch in per_channel]
        out.append(
            {
                "tensor": w.name,
                "op": w.op,
                "shape": list(w.shape),
                "distinct_values": int(np.unique(values).size),
                "max_distinct_per_channel": max(counts) if counts else 0,
                "output_channels": int(values.shape[axis]),
                "zero_fraction": float(np.count_nonzero(values == 0) / values.size) if values.size else 0.0,
                "elements": int(values.size),
            }
        )
    return out


def _compression(manifest: Manifest, variants: Iterable[_Variant]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for v in variants:
        path = int8_model_path(manifest, v.source)
        entry: dict[str, Any] = {"leaf": v.name, "clustered_leaf": is_clustered_leaf(v.name),
                                 "palette_limit": PALETTE_LIMIT}
        if path is None or not path.is_file():
            entry.update(model=None, tensors=[], status="unavailable",
                         note=f"unavailable: no int8 model of {v.name} in this run"
                         + (f" ({path} is missing)" if path is not None else ""))
            out[v.name] = entry
            continue
        try:
            tensors = weight_diagnostics(path)
        except InvalidInputError as exc:
            entry.update(model=_shown(manifest, path), tensors=[], status="unavailable",
                         note=f"unavailable: {exc.one_line()}")
            out[v.name] = entry
            continue
        for t in tensors:
            t["palette_ok_per_tensor"] = t["distinct_values"] <= PALETTE_LIMIT
            t["palette_ok_per_channel"] = t["max_distinct_per_channel"] <= PALETTE_LIMIT
        over_channel = [t for t in tensors if not t["palette_ok_per_channel"]]
        over_tensor = [t for t in tensors if not t["palette_ok_per_tensor"]]
        total = sum(t["elements"] for t in tensors)
        zeros = sum(t["zero_fraction"] * t["elements"] for t in tensors)
        entry.update(
            model=_shown(manifest, path),
            tensors=tensors,
            weight_tensors=len(tensors),
            max_distinct_values=max((t["distinct_values"] for t in tensors), default=0),
            max_distinct_per_channel=max((t["max_distinct_per_channel"] for t in tensors), default=0),
            zero_fraction=zeros / total if total else 0.0,
            tensors_over_limit_per_tensor=len(over_tensor),
            tensors_over_limit_per_channel=len(over_channel),
        )
        if not entry["clustered_leaf"]:
            entry["status"] = "not clustered"
            entry["note"] = (f"{len(over_tensor)} of {len(tensors)} weight tensors have more than {PALETTE_LIMIT} "
                             "distinct int8 values (expected for a leaf that was not clustered)")
        elif over_channel:
            worst = max(over_channel, key=lambda t: t["max_distinct_per_channel"])
            entry["status"] = "lost"
            entry["survives_per_channel"] = False
            entry["note"] = (
                f"clustering did not survive into Vela's encoding: {len(over_channel)} of {len(tensors)} weight "
                f"tensors have output channels with more than {PALETTE_LIMIT} distinct int8 values (up to "
                f"{worst['max_distinct_per_channel']} in '{_short(worst['tensor'])}'), so Vela cannot palette-encode them"
            )
        elif over_tensor:
            worst = max(over_tensor, key=lambda t: t["distinct_values"])
            entry["status"] = "lost"
            entry["survives_per_channel"] = True
            entry["note"] = (
                f"clustering did not survive into Vela's encoding: it holds per output channel (at most "
                f"{entry['max_distinct_per_channel']} values), but per-channel scales (and folded batch norms) "
                f"give {len(over_tensor)} of {len(tensors)} weight tensors more than {PALETTE_LIMIT} distinct int8 "
                f"values (up to {worst['distinct_values']} in '{_short(worst['tensor'])}'), more than the palette of a weight "
                "stream that spans several output channels can hold"
            )
        else:
            entry["status"] = "kept"
            entry["survives_per_channel"] = True
            entry["note"] = (f"every weight tensor has at most {entry['max_distinct_values']} distinct int8 values "
                             f"(≤ {PALETTE_LIMIT}): Vela can palette-encode them")
        _npu_weights(entry, v)
        out[v.name] = entry
    return out


def _npu_weights(entry: dict[str, Any], v: _Variant) -> None:
    """Per target, the NPU weight facts of Vela's debug database (compiled with ``debug_db``), if recorded."""
    found = {rec.target: rec.details["npu_weights"] for rec in sorted(v.compiles, key=lambda r: r.target or "")
             if rec.status != "failed" and rec.details.get("npu_weights")}
    if not found:
        return
    entry["npu_weights"] = found
    shown = []
    for target, facts in found.items():
        s = facts["summary"]
        cycles = s.get("weight_read_cycles")
        shown.append(f"{target} {s['encoded_weight_bytes']:,} B encoded in {s['layers']} layers"
                     + (f", {cycles:,} weight-read cycles" if cycles is not None else "")
                     + (f", {s['layers_over_palette']} layers over the palette" if s.get("layers_over_palette") else ""))
    entry["note"] = f"{entry['note']}; Vela's debug database: " + "; ".join(shown)


LAYER_KEYS = ("operator", "encoded_weight_bytes", "vela_distinct_weights", "int8_distinct", "within_palette",
              "int8_zero_fraction", "weight_read_cycles", "npu_cycles")


def npu_weight_layers(variants: Iterable[_Variant]) -> dict[str, dict[str, Any]]:
    """Per variant and target, Vela's per-layer NPU weight facts (compiles run with ``--debug-db``)."""
    out: dict[str, dict[str, Any]] = {}
    for v in variants:
        for rec in sorted(v.compiles, key=lambda r: r.target or ""):
            facts = rec.details.get("npu_weights") if rec.status != "failed" else None
            if not facts:
                continue
            layers = [{"layer": _layer_label(row.get("tensor") or row.get("name") or "?"),
                       **{k: row.get(k) for k in LAYER_KEYS}} for row in facts.get("layers", [])]
            out.setdefault(v.name, {})[rec.target] = {"summary": facts.get("summary", {}), "layers": layers}
    return out


_KERNEL_SUFFIXES = ("/Conv2D", "/depthwise", "/MatMul", "/conv2d_transpose", "/Conv2DBackpropInput", "/Conv3D")


def _layer_label(tensor: str) -> str:
    """The part of a fused weight tensor's name that names its layer (``…/depthwise``, ``…/Conv2D``), else the first."""
    parts = tensor.split(";")
    named = next((p for p in parts if p.endswith(_KERNEL_SUFFIXES)), parts[0])
    return _short(named)


def _short(name: str, limit: int = 60) -> str:
    """A tensor name as people read it: its first ';'-separated part, cut to ``limit`` characters."""
    first = name.split(";")[0]
    return first if len(first) <= limit else first[: limit - 1] + "…"


def _shown(manifest: Manifest, path: Path) -> str:
    try:
        return str(path.resolve().relative_to(manifest.run_dir.resolve()))
    except ValueError:
        return str(path)


# --------------------------------------------------------------------------- the report


def size_budget_misses(manifest: Manifest, rows: list[dict[str, Any]]) -> list[str]:
    """Palette leaves whose compiled weights exceed the ``[palette] size_budget`` their sweep planned for.

    The sweep plans bytes before palette QAT, which moves them a little (it changes how often each palette
    value occurs: -128 to +64 bytes of 9,568 over nine DS-CNN runs). Each miss is added to its row's warnings
    and returned as a note.
    """
    from .recipe import LEAVES, nodes_for

    sweeps = {rec.variant: rec.details["sweep"] for rec in manifest.records.values()
              if rec.stage == "optimize" and rec.variant and isinstance(rec.details.get("sweep"), Mapping)
              and rec.details["sweep"].get("size")}
    notes = []
    for r in rows:
        leaf_node = LEAVES.get(r["leaf"])
        node = next((n for n in reversed(nodes_for([r["leaf"]])) if n in sweeps), None) if leaf_node else None
        if node is None or r["target"] != sweeps[node].get("target") or not sweeps[node]["size"].get("fits", True):
            continue  # (a plan that could not fit was reported by its optimize stage)
        size, mine = sweeps[node]["size"], value_of(r["values"].get("encoded_weights_bytes"))
        limit = int(float(size["size_budget"]) * int(size["reference_encoded_bytes"]))
        if mine is None or mine <= limit:
            continue
        why = ("palette QAT then moved them; lower [palette] size_budget a little, or take the plan's PTQ leaf "
               f"{node}, which keeps them" if leaf_node != node else "this compile's Vela settings encode them "
               "differently from the sweep's")
        note = (f"{r['leaf']} on {r['target']}: {mine:,} B of NPU-encoded weights, {mine - limit:,} B over its size "
                f"budget ({size['size_budget']:g} x ptq's {int(size['reference_encoded_bytes']):,} B); its plan "
                f"had {int(size['encoded_bytes']):,} B as the sweep encoded them, and {why}")
        r["warnings"].append(note)
        notes.append(note)
    return notes


def build_report(run_dir: Path, requirements: Requirements = Requirements(), *, compression: bool = True) -> dict:
    """The report document of ``run_dir``: rows, judgments and recommendations (schema ``edgedeploy.report``)."""
    manifest = Manifest.load(Path(run_dir))
    variants = _variants(manifest)
    if not variants:
        raise InvalidInputError(
            f"{manifest.path} records no convert, import or compile stage",
            "run `edgedeploy compile` or `edgedeploy optimize` into this folder first",
        )
    ref = next((v for v in variants if v.name == REFERENCE_LEAF and v.accuracy is not None), None)
    rows: list[dict[str, Any]] = []
    notes: list[str] = []
    for v in variants:
        acc_values = _accuracy_values(v, ref)
        compiles = sorted(v.compiles, key=lambda r: r.target or "") or [None]
        for rec in compiles:
            values = {**acc_values, **_compile_values(rec, manifest, v)}
            target = rec.target if rec is not None else None
            row: dict[str, Any] = {
                "leaf": v.name,
                "target": target,
                "level": v.level,
                "kind": "leaf" if v.level is not None else ("imported" if v.imported is not None else "unknown"),
                "stages": {
                    "accuracy": v.accuracy.id if v.accuracy else None,
                    "import": v.imported.id if v.imported else None,
                    "compile": rec.id if rec else None,
                },
                "values": values,
                "pareto": None,
                "recommended": False,
                "cpu_operator_list": (rec.details.get("cpu_operators", []) if rec else []),
                "warnings": list(rec.warnings) if rec else [],
            }
            row["fit"] = _fit(values, manifest.targets.get(target or ""), target or "")
            rows.append(row)
    # Ratio of NPU-encoded weights to the ptq leaf on the same target.
    ptq_weights = {r["target"]: value_of(r["values"]["encoded_weights_bytes"]) for r in rows
                   if r["leaf"] == REFERENCE_LEAF}
    for r in rows:
        mine, theirs = value_of(r["values"]["encoded_weights_bytes"]), ptq_weights.get(r["target"])
        if mine is None:
            r["values"]["encoded_weights_ratio"] = na("ratio", "computed", r["values"]["encoded_weights_bytes"].get(
                "unavailable", "no NPU-encoded weights"))
        elif not theirs:
            r["values"]["encoded_weights_ratio"] = na(
                "ratio", "computed", f"no {REFERENCE_LEAF} leaf compiled for {r['target']} to compare against")
        else:
            r["values"]["encoded_weights_ratio"] = val(mine / theirs, "ratio", "computed")
        r["values"] = {c.key: r["values"][c.key] for c in VALUE_COLUMNS}
    notes += size_budget_misses(manifest, rows)
    targets = sorted({r["target"] for r in rows if r["target"]})
    pareto: dict[str, Any] = {}
    recommendations: dict[str, Any] = {}
    for t in targets:
        group = [r for r in rows if r["target"] == t]
        pareto[t] = _pareto(group, t)
        for r in group:
            _check_requirements(r, requirements)
        recommendations[t] = _recommend(group, t, requirements)
    for r in rows:
        r.setdefault("requirements", {})
        r.setdefault("meets_requirements", None)
        r.setdefault("pareto_note", None)
    for t in targets:
        tdict = manifest.targets.get(t) or {}
        mem = tdict.get("memory")
        if tdict.get("kind") == "board" and mem:
            notes.append(
                f"{t}: fits = Vela SRAM + {mem.get('runtime_margin_bytes', 0):,} B runtime margin ≤ "
                f"{mem['sram_bytes']:,} B board SRAM, and the compiled model ≤ {mem['flash_bytes']:,} B board flash"
            )
    notes.append("Flash is judged on the compiled model (*_vela.tflite), the file firmware stores in flash: it holds "
                 "Vela's weights and command stream and the flatbuffer around them. Vela's own flash estimate is "
                 "shown beside it; it is 0 on systems that read the model from DRAM (see the DRAM column)")
    if ref is None:
        notes.append(f"no {REFERENCE_LEAF} leaf in this run: differences against it are unavailable")
    doc: dict[str, Any] = {
        "schema": SCHEMA,
        "schema_version": SCHEMA_VERSION,
        "edgedeploy_version": __version__,
        "created": now_iso(),
        "run_dir": str(manifest.run_dir),
        "manifest": {"path": str(manifest.path), "sha256": sha256_file(manifest.path)},
        "tools": dict(manifest.tools),
        "targets": {
            t: {k: (manifest.targets.get(t) or {}).get(k)
                for k in ("kind", "description", "accelerator_config", "npu_hz", "memory")}
            for t in targets
        },
        "levels": dict(LEAF_LEVELS),
        "reference_leaf": REFERENCE_LEAF if ref is not None else None,
        "requirements": requirements.to_dict(),
        "columns": [{"key": c.key, "header": c.header, "unit": c.unit} for c in ALL_COLUMNS],
        "rows": rows,
        "pareto": pareto,
        "recommendations": recommendations,
        "walk": manifest.info.get("walk"),  # the level-by-level walk (edgedeploy.walk), when this run was one
        "compression": _compression(manifest, variants) if compression else {},
        "npu_weights": npu_weight_layers(variants),
        "notes": notes,
    }
    return doc


def unmet_targets(doc: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Recommendations where leaves were judged and none met the requirements."""
    return [r for r in doc["recommendations"].values() if r.get("judged") and not r.get("met")]


# --------------------------------------------------------------------------- regression gate


def load_report_json(path: Path) -> dict[str, Any]:
    import json

    path = Path(path)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise InvalidInputError(f"{path} does not exist", "pass a report written by `edgedeploy report --format json`") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise InvalidInputError(f"{path} is not valid JSON ({exc})", "pass a report written with --format json") from exc
    if not isinstance(data, dict) or data.get("schema") != SCHEMA:
        raise InvalidInputError(f"{path} is not an edgedeploy report (schema {SCHEMA})",
                                "write one with `edgedeploy report RUN_DIR --format json --out FILE`")
    if not isinstance(data.get("schema_version"), int) or data["schema_version"] > SCHEMA_VERSION:
        raise InvalidInputError(
            f"{path} has report schema version {data.get('schema_version')}, which this edgedeploy does not "
            f"understand (it reads {SCHEMA_VERSION})",
            "upgrade edgedeploy or write the reference report again",
        )
    if not isinstance(data.get("rows"), list):
        raise InvalidInputError(f"{path} has no rows", "write the reference report again")
    return data


def _fmt_gated(v: float, unit: str) -> str:
    if unit == "%":
        return f"{v:.2f}%"
    return f"{int(round(v)):,}" + (" B" if unit == "B" else "")


def compare_reports(old: Mapping[str, Any], new: Mapping[str, Any], tolerances: Mapping[str, Tolerance],
                    against: str = "") -> dict[str, Any]:
    """What got worse (beyond the tolerance), better or changed between two reports, row by row."""

    def index(doc: Mapping[str, Any]) -> dict[tuple, Mapping[str, Any]]:
        return {(r["leaf"], r.get("target")): r for r in doc["rows"] if r.get("target")}

    old_rows, new_rows = index(old), index(new)
    regressions, changes = [], []
    for key in sorted(old_rows, key=lambda k: (k[1] or "", _leaf_order(k[0]))):
        leaf, target = key
        if key not in new_rows:
            regressions.append({"leaf": leaf, "target": target, "metric": None,
                                "text": f"{leaf} on {target}: in {against or 'the reference'} but missing now"})
            continue
        o_vals, n_vals = old_rows[key].get("values", {}), new_rows[key]["values"]
        for name, (vkey, higher_better, label, unit) in GATED.items():
            o, n = value_of(o_vals.get(vkey)), value_of(n_vals.get(vkey))
            if o is None and n is None:
                continue
            base = {"leaf": leaf, "target": target, "metric": name, "old": o, "new": n}
            if n is None:
                regressions.append({**base, "text": f"{leaf} on {target}: {label} was {_fmt_gated(o, unit)}, now "
                                                    f"unavailable ({n_vals.get(vkey, {}).get('unavailable', '')})"})
                continue
            if o is None:
                changes.append({**base, "text": f"{leaf} on {target}: {label} now {_fmt_gated(n, unit)} "
                                                "(unavailable in the reference)"})
                continue
            if n == o:
                continue
            worse_by = (o - n) if higher_better else (n - o)
            tol = tolerances[name]
            rel = f" ({100.0 * (n - o) / o:+.1f}%)" if o else ""
            diff = f"{n - o:+.2f} pts" if unit == "%" else f"{n - o:+,.0f}"
            text = (f"{leaf} on {target}: {label} {_fmt_gated(o, unit)} → {_fmt_gated(n, unit)}, {diff}{rel}")
            if worse_by > tol.allowed(o) + 1e-9:
                regressions.append({**base, "text": f"{text}; worse than the tolerance {name}={tol}"})
            else:
                verdict = "better" if worse_by < 0 else f"within the tolerance {name}={tol}"
                changes.append({**base, "text": f"{text}; {verdict}"})
    added = [f"{leaf} on {target}" for (leaf, target) in new_rows if (leaf, target) not in old_rows]
    return {
        "against": against,
        "against_created": old.get("created"),
        "tolerances": {k: str(t) for k, t in tolerances.items()},
        "passed": not regressions,
        "regressions": regressions,
        "changes": changes,
        "added": added,
    }


def raise_on_regression(comparison: Mapping[str, Any]) -> None:
    regs = comparison["regressions"]
    if not regs:
        return
    shown = "; ".join(r["text"] for r in regs[:3])
    more = f"; and {len(regs) - 3} more" if len(regs) > 3 else ""
    raise RegressionError(
        f"{len(regs)} regression(s) against {comparison['against'] or 'the reference report'}: {shown}{more}",
        "fix the change, or accept it with a wider --tolerance or a new reference report",
    )
