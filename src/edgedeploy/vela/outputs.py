"""Vela backend: argument lists and parsers of Vela's output.

Vela itself runs in the worker processes of :mod:`edgedeploy.vela.pool`,
never in the main process, through :mod:`edgedeploy.vela.runner`. The argument builders and parsers here are pure
functions, tested on recorded Vela output.
"""

from __future__ import annotations

import csv
import io
import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from edgedeploy.vela import worker as vela_worker
from edgedeploy.errors import ToolFailedError
from edgedeploy.core.manifest import Metric
from edgedeploy.config.targets import Target

OPTIMISE_CHOICES = ("Performance", "Size")
KIB = 1024


_VERSION: list[str] = []  # the installed Vela's version, once known
_ASKED: list = []  # a worker's answer on its way (ask_vela_version)


def ask_vela_version(pool: Any) -> None:
    """Have a worker of ``pool`` read Vela's version now; :func:`vela_version` takes its answer later."""
    if not _VERSION and not _ASKED:
        _ASKED.append(pool.call(vela_worker.installed_vela_version))


def vela_version(pool: Any = None) -> str:
    """The installed Vela's version, read once.

    Read by a worker when one was asked (:func:`ask_vela_version`) or ``pool`` is given: the workers have
    imported Vela, which read its own version, so this process need not load ``importlib.metadata``."""
    if not _VERSION:
        if not _ASKED and pool is not None:
            ask_vela_version(pool)
        answer = None
        if _ASKED:
            try:
                answer = _ASKED.pop().result()
            except Exception:  # noqa: BLE001 - a worker that died: read it here
                answer = None
        _VERSION.append(answer or vela_worker.installed_vela_version())
    return _VERSION[0]


# --------------------------------------------------------------------------- arguments


def build_vela_args(
    model: Path,
    target: Target,
    output_dir: Path,
    optimise: str = "Performance",
    extra: tuple[str, ...] = (),
) -> list[str]:
    """Vela's command-line arguments (without the program name) for one compile."""
    return [
        str(model),
        "--accelerator-config",
        target.accelerator_config,
        "--config",
        str(target.vela_ini_path()),
        "--system-config",
        target.vela.system_config,
        "--memory-mode",
        target.vela.memory_mode,
        "--optimise",
        optimise,
        "--output-dir",
        str(output_dir),
        "--verbose-performance",
        "--show-cpu-operations",
        *extra,
    ]


# --------------------------------------------------------------------------- parsers


def _number(text: str) -> float | None:
    try:
        value = float(text)
    except (TypeError, ValueError):
        return None
    return None if math.isnan(value) or math.isinf(value) else value


def _rows(text: str, what: str) -> list[dict[str, Any]]:
    try:
        return list(csv.DictReader(io.StringIO(text.replace("\0", ""), newline="")))
    except csv.Error as exc:
        raise ToolFailedError(f"Vela's {what} is not readable CSV ({exc})", "re-run the compile; read vela.log") from exc


def _cells(row: dict[Any, Any], keep_nan_text: bool) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, raw in row.items():
        if not isinstance(key, str) or not isinstance(raw, str):  # a short or long row
            continue
        num = _number(raw)
        if num is None and keep_nan_text and raw.strip().lower() in ("nan", "inf", "-inf"):
            out[key.strip()] = None
        else:
            out[key.strip()] = num if num is not None else raw.strip()
    return out


def parse_summary_csv(text: str) -> dict[str, Any]:
    """The single data row of Vela's ``*_summary_*.csv``: numbers as floats (NaN -> None), text kept."""
    rows = _rows(text, "summary CSV")
    if len(rows) != 1:
        raise ToolFailedError(f"expected one data row in Vela's summary CSV, found {len(rows)}",
                              "re-run the compile; read vela.log")
    return _cells(rows[0], keep_nan_text=True)


def parse_per_layer_csv(text: str) -> list[dict[str, Any]]:
    """Rows of Vela's ``*_per-layer.csv`` (``--verbose-performance``), numbers converted."""
    return [_cells(row, keep_nan_text=False) for row in _rows(text, "per-layer CSV")]


_WARNING_RE = re.compile(r"^Warning \(supported operators\) operator: (?P<op>[A-Z0-9_]+), ofm: '(?P<name>.*)'$")
_CPU_RE = re.compile(r"^\s*CPU: (?P<op>\S+) = (?P<name>.*?)(?: \(outputs \[[^\]]*\]\))?$")


@dataclass(frozen=True)
class CpuOperator:
    op: str
    name: str
    reason: str

    def to_dict(self) -> dict[str, str]:
        return {"op": self.op, "name": self.name, "reason": self.reason}


def parse_cpu_operators(stdout: str) -> list[CpuOperator]:
    """Operators Vela placed on the CPU, with Vela's reason for each.

    Reasons come from Vela's "Warning (supported operators)" blocks (the
    TFLite operator type); the "CPU: ..." lines of the network summary list
    what actually stayed on the CPU.
    """
    lines = stdout.splitlines()
    reasons: dict[str, tuple[str, str]] = {}
    i = 0
    while i < len(lines):
        m = _WARNING_RE.match(lines[i].strip())
        if m:
            text: list[str] = []
            j = i + 1
            while j < len(lines) and lines[j].strip() and not _WARNING_RE.match(lines[j].strip()):
                if not lines[j].startswith("#"):
                    text.append(lines[j].strip().removeprefix("Reason: "))
                j += 1
            reasons[m.group("name")] = (m.group("op"), " ".join(text))
            i = j
        else:
            i += 1
    found: list[CpuOperator] = []
    for line in lines:
        m = _CPU_RE.match(line)
        if m:
            name = m.group("name")
            op, reason = reasons.get(name, (m.group("op"), "Vela gave no reason"))
            found.append(CpuOperator(op, name, reason or "Vela gave no reason"))
    if not found:  # summary lines absent (older Vela): fall back to the warnings alone
        found = [CpuOperator(op, name, reason) for name, (op, reason) in reasons.items()]
    return found


_COUNT_RE = re.compile(r"^(CPU|NPU) operators = (\d+)")


def parse_operator_counts(stdout: str) -> dict[str, int]:
    counts = {}
    for line in stdout.splitlines():
        m = _COUNT_RE.match(line.strip())
        if m:
            counts[m.group(1).lower()] = int(m.group(2))
    return counts


def summary_metrics(summary: dict[str, Any], target: Target, layers: list[dict[str, Any]]) -> dict[str, Metric]:
    """Metrics with units from Vela's summary, converted where they are parsed (KiB -> bytes)."""

    def est(value: Any, unit: str) -> Metric:
        if value is None:
            return Metric.missing(unit, "estimated", "Vela reported no value (nan)")
        return Metric(value, unit, "estimated")

    def number(key: str) -> float | None:
        v = summary.get(key)  # text where a number belongs counts as no value
        return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) else None

    def kib(key: str) -> Metric:
        v = number(key)
        return est(None if v is None else int(round(v * KIB)), "B")

    def integer(key: str, unit: str) -> Metric:
        v = number(key)
        return est(None if v is None else int(v), unit)

    m: dict[str, Metric] = {
        "sram_bytes": kib("sram_memory_used"),
        "dram_bytes": kib("dram_memory_used"),
        "on_chip_flash_bytes": kib("on_chip_flash_memory_used"),
        "off_chip_flash_bytes": kib("off_chip_flash_memory_used"),
        "original_weights_bytes": integer("total_original_weights", "B"),
        "encoded_weights_bytes": integer("total_npu_encoded_weights", "B"),
        "npu_cycles": integer("cycles_npu", "cycles"),
        "total_cycles": integer("cycles_total", "cycles"),
        "macs": integer("nn_macs", "MAC"),
        "vela_core_clock_hz": integer("core_clock", "Hz"),
        "vela_inference_time_s": est(number("inference_time"), "s"),
        "vela_inferences_per_second": est(number("inferences_per_second"), "1/s"),
    }
    flash = sum(number(k) or 0 for k in ("on_chip_flash_memory_used", "off_chip_flash_memory_used"))
    m["flash_bytes"] = Metric(int(round(flash * KIB)), "B", "estimated")
    cycles = number("cycles_total")
    macs = number("nn_macs")
    if cycles:
        latency = cycles / target.npu_hz
        m["latency_ms"] = Metric(latency * 1e3, "ms", "estimated")
        m["inferences_per_second"] = Metric(1.0 / latency, "1/s", "estimated")
        if macs is not None:
            m["mac_utilization"] = Metric(100.0 * macs / (cycles * target.macs_per_cycle), "%", "estimated")
        else:
            m["mac_utilization"] = Metric.missing("%", "estimated", "Vela reported no MAC count")
    else:
        for key, unit in (("latency_ms", "ms"), ("inferences_per_second", "1/s"), ("mac_utilization", "%")):
            m[key] = Metric.missing(unit, "estimated", "Vela reported no cycle count")
    m["layers"] = Metric(len(layers), "count", "estimated")
    return m


def find_vela_outputs(out_dir: Path, model_stem: str) -> dict[str, Path]:
    """The files Vela wrote for ``model_stem`` into ``out_dir``, by role: ``vela_model``, ``per_layer_csv``,
    ``summary_csv`` and ``debug_db``, those that exist."""
    found = {
        "vela_model": out_dir / f"{model_stem}_vela.tflite",
        "per_layer_csv": out_dir / f"{model_stem}_per-layer.csv",
    }
    summaries = sorted(out_dir.glob(f"{model_stem}_summary_*.csv"))
    if summaries:
        found["summary_csv"] = summaries[0]
    found["debug_db"] = out_dir / f"{model_stem}_debug.xml"  # --enable-debug-db
    return {k: v for k, v in found.items() if v.is_file()}
