"""Where each node of the tree spent its time: the steps its optimize record names (``details["time_by_step"]``,
written by :mod:`edgedeploy.core.steptime`), as facts for the report document and as rows for its renderers."""

from __future__ import annotations

from typing import Any, Mapping

from edgedeploy.core.manifest import Manifest
from edgedeploy.core.units import fmt_number, fmt_pct

TIME_HEADERS = ("Node", "Step", "Wall (s)", "Processor (s)", "Calls", "Share of the node (%)")
TIME_NOTE = ("each step's own time: a step inside another (search/candidate_vela) is not counted in the outer "
             "one; processor time is the edgedeploy process's (all its threads), Vela's workers show in wall time "
             "only; other is what no step names")


def node_times(manifest: Manifest) -> dict[str, Any]:
    """Per optimize node that recorded its steps: those steps, its other time and its total (as recorded)."""
    out = {}
    for rec in manifest.records.values():
        times = rec.details.get("time_by_step") if rec.stage == "optimize" and rec.status != "failed" else None
        if rec.variant and isinstance(times, Mapping) and isinstance(times.get("total"), Mapping):
            out[rec.variant] = dict(times)
    return out


def _table(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}  # (a hand-edited value of another kind shows as n/a)


def _seconds(fact: Any) -> float | None:
    value = _table(fact).get("value")
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def time_rows(doc: Mapping[str, Any]) -> list[list[str]]:
    """One row per step of each node, then its other time and its total."""
    rows = []
    for node, times in (doc.get("node_times") or {}).items():
        total = _seconds(_table(times.get("total")).get("wall"))
        named = [(str(s), _table(t)) for s, t in _table(times.get("steps")).items()]
        named += [("other", _table(times.get("other"))), ("total", _table(times.get("total")))]
        for step, t in named:
            wall, cpu = _seconds(t.get("wall")), _seconds(t.get("processor"))
            share = "" if wall is None or not total or total < 0 else fmt_pct(100 * wall / total, 1)
            rows.append([node, step, fmt_number(wall, 2), fmt_number(cpu, 2), str(t.get("calls", "")), share])
    return rows
