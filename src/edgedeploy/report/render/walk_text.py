"""The walk record of a run (``info.walk`` in its manifest) as lines of text, for the CLI and the report."""

from __future__ import annotations

from typing import Any, Mapping

from edgedeploy.core.units import fmt_seconds


def _verdict(leaf: str, per_target: Mapping[str, Any]) -> str:
    parts = []
    for target, v in per_target.items():
        costs = ", costs more than ptq" if v.get("over_reference") else ""  # (the report names the layers why)
        if v.get("meets") is None:
            parts.append(f"{target}: no requirements{costs}")
            continue
        misses = [name for name, c in v.get("requirements", {}).items() if c.get("met") is not True]
        parts.append(f"{target}: " + ("meets" if v["meets"] else "misses " + ", ".join(misses or [v.get("why", "?")]))
                     + costs)
    return f"{leaf} ({'; '.join(parts)})"


def walk_lines(record: Mapping[str, Any] | None) -> list[str]:
    """One line per level visited, then how the walk ended; no lines when the run was not a walk."""
    if not record:
        return []
    lines = []
    for lv in record.get("levels", []):
        trained = ", ".join(lv.get("nodes_trained", [])) or "nothing new"
        if lv.get("nodes_reused"):
            trained += f" (reused {', '.join(lv['nodes_reused'])})"
        leaves = "; ".join(_verdict(leaf, v) for leaf, v in lv.get("verdicts", {}).items())
        lines.append(f"level {lv['level']}: trained {trained}; {leaves} [{fmt_seconds(lv.get('seconds', 0))}]")
    end = "met" if record.get("stopped") == "met" else "exhausted"
    lines.append(f"stopped ({end}) after {fmt_seconds(record.get('seconds', 0))}: {record.get('message', '')}")
    return lines
