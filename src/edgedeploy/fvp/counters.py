"""The metrics of one FVP run: the PMU counters the runner printed (mode ``simulated``), the FVP's
``--stat`` block, and how far Vela's estimate was from the simulated cycles."""

from __future__ import annotations

import re
from typing import Any

from edgedeploy.core.manifest import Metric, StageRecord
from edgedeploy.config.targets import Target
from .parse import FvpLog


def _beat_metric_name(counter: str) -> str:
    m = re.fullmatch(r"(?P<bus>[A-Z0-9]+)_(?P<dir>RD|WR)_DATA_BEAT_(?:RECEIVED|WRITTEN)", counter)
    if m:
        return f"{m['bus'].lower()}_{'read' if m['dir'] == 'RD' else 'write'}_beats"
    return f"{counter.lower()}_beats"


def fvp_metrics(console: FvpLog, target: Target, compiled: StageRecord | None) -> dict[str, Metric]:
    """Metrics of one run: simulated counters, host timings and the estimate-vs-simulation gap."""
    none = "the runner printed no Ethos-U PMU counters"

    def sim(value: Any, unit: str, reason: str = none) -> Metric:
        return Metric(value, unit, "simulated") if value is not None else Metric.missing(unit, "simulated", reason)

    m: dict[str, Metric] = {
        "npu_active_cycles": sim(console.npu_active_cycles, "cycles"),
        "npu_idle_cycles": sim(console.npu_idle_cycles, "cycles"),
        "npu_total_cycles": sim(console.npu_total_cycles, "cycles"),
    }
    for counter, value in console.beats.items():
        m[_beat_metric_name(counter)] = Metric(value, "beats", "simulated")
    m["npu_read_beats"] = sim(console.read_beats, "beats")
    m["npu_write_beats"] = sim(console.write_beats, "beats")
    total = console.npu_total_cycles
    m["npu_latency_ms"] = sim(None if total is None else total / target.npu_hz * 1e3, "ms")
    m["arena_used_bytes"] = sim(console.arena_used_bytes, "B", "the runner printed no tensor arena use")
    stats = console.stats
    no_stat = "the FVP printed no --stat block"
    m["sim_time_s"] = sim(stats.simulated_time_s if stats else None, "s", no_stat)
    m["cpu_instructions"] = sim(stats.instructions if stats else None, "count", no_stat)
    m["host_wall_time_s"] = (
        Metric(stats.wall_time_s, "s", "measured")
        if stats and stats.wall_time_s is not None
        else Metric.missing("s", "measured", no_stat)
    )
    est = compiled.metric("total_cycles") if compiled is not None else None
    est_npu = compiled.metric("npu_cycles") if compiled is not None else None
    m["vela_total_cycles"] = (
        Metric(est, "cycles", "estimated")
        if est is not None
        else Metric.missing("cycles", "estimated", "no Vela estimate")
    )
    m["vela_npu_cycles"] = (
        Metric(est_npu, "cycles", "estimated")
        if est_npu is not None
        else Metric.missing("cycles", "estimated", "no Vela estimate")
    )
    if est and total:
        m["cycles_estimate_error_pct"] = Metric(100.0 * (float(est) - total) / total, "%", "computed")
        m["cycles_simulated_to_estimated"] = Metric(total / float(est), "ratio", "computed")
    else:
        reason = "no simulated NPU cycles" if not total else "no Vela total_cycles estimate"
        m["cycles_estimate_error_pct"] = Metric.missing("%", "computed", reason)
        m["cycles_simulated_to_estimated"] = Metric.missing("ratio", "computed", reason)
    return m
