"""Cell and prose text shared by every format, so all formats show the same numbers."""

from __future__ import annotations

from typing import Any, Mapping

from edgedeploy.config.requirements import REQUIREMENTS
from edgedeploy.core.units import NA, fmt_bytes, fmt_count, fmt_in_unit, fmt_number, fmt_pct
from edgedeploy.report.levels import PALETTE_LIMIT
from ..columns import JUDGMENT_COLUMNS, KEY_COLUMNS, Column, task_metric


def fmt_value(value: Any, kind: str) -> str:
    """How every human-readable format shows a value of ``kind`` in a column whose header names its unit."""
    if value is None:
        return NA
    if kind in ("pct", "pts"):
        return fmt_pct(value, sign=kind == "pts")
    if kind == "bytes":
        return fmt_bytes(value, unit=False)
    if kind == "count":
        return fmt_count(value)
    if kind == "ratio":
        return f"{value:.3f}"
    if kind == "ms":
        return f"{value:.4f}"
    if kind == "rate":
        return fmt_number(value, 1)
    if kind == "mhz":
        return f"{value:g}"
    return str(value)


def judgment_text(row: Mapping[str, Any], key: str) -> str:
    if key == "fits_board":
        return row["fit"]["text"]
    if key == "pareto":
        return {True: "yes", False: "no", None: "n/a"}[row.get("pareto")]
    if key == "meets_requirements":
        meets = row.get("meets_requirements")
        if not row.get("target") and row.get("requirements"):  # compiled for no target: judged without one
            checks = row["requirements"]
            if meets is False:
                return "no: " + ", ".join(n for n, c in checks.items() if c.get("met") is False)
            met = [n for n, c in checks.items() if c.get("met") is True]
            return "yes" if meets else "not compiled" + (f"; meets {', '.join(met)}" if met else "")
        if meets is None:
            return "n/a"
        if meets:
            return "yes"
        missed = [n for n, c in row.get("requirements", {}).items() if c.get("met") is not True]
        return "no: " + ", ".join(missed)
    if key == "recommended":
        return "yes" if row.get("recommended") else ""
    raise KeyError(key)


def uncompiled_requirement_lines(doc: Mapping[str, Any]) -> list[str]:
    """One line per leaf compiled for no target: the requirements judged without one, the rest not compiled."""
    lines = []
    for r in doc["rows"]:
        if r.get("target") or not r.get("requirements"):
            continue
        parts = []
        for name, c in r["requirements"].items():
            if c.get("met") is None:
                parts.append(f"{name}: {c.get('why', 'cannot be judged')}")
            else:  # (+ 0.0: the ptq leaf's own drop is -0.0)
                parts.append(f"{name} {'met' if c['met'] else 'missed'} "
                             f"({fmt_in_unit(c['value'] + 0.0, c.get('unit', ''))}; {c['label']})")
        lines.append(f"{r['leaf']} ({judgment_text(r, 'meets_requirements')}): " + "; ".join(parts))
    return lines


def key_text(row: Mapping[str, Any], key: str) -> str:
    if key == "leaf":
        return row["leaf"]
    if key == "target":
        return row.get("target") or "—"
    if key == "level":
        return "—" if row.get("level") is None else str(row["level"])
    raise KeyError(key)


class Footnotes:
    """Numbered reasons for unavailable values, shared by a whole document."""

    def __init__(self) -> None:
        self.reasons: list[str] = []

    def mark(self, reason: str) -> int:
        if reason not in self.reasons:
            self.reasons.append(reason)
        return self.reasons.index(reason) + 1


def cell_text(row: Mapping[str, Any], col: Column, notes: Footnotes | None = None) -> str:
    if col in KEY_COLUMNS:
        return key_text(row, col.key)
    if col in JUDGMENT_COLUMNS:
        return judgment_text(row, col.key)
    cell = row["values"][col.key]
    text = fmt_value(cell.get("value"), col.kind)
    if col.kind == "metric" and cell.get("value") is not None:  # a leaf judged by its task's metric (e.g. MSE)
        text = f"{cell['value']:.4g}{(' ' + cell['unit']) if cell.get('unit') else ''} {cell.get('metric', '')}".strip()
    elif col.kind == "named_metric" and cell.get("value") is not None:  # the header names the metric and its unit
        text = f"{cell['value']:.4g}"
    if cell.get("value") is None and notes is not None:
        text += f" [{notes.mark(cell.get('unavailable') or 'not recorded')}]"
    return text


def _req_text(doc: Mapping[str, Any]) -> list[str]:
    req = doc["requirements"]
    given = {k: v for k, v in req.items() if k != "sources" and v is not None}
    if not given:
        return ["none set (a board target must still fit its memory)"]
    shown = []
    for k, v in given.items():
        symbol = REQUIREMENTS[k].symbol if k in REQUIREMENTS else "pts"
        if symbol in ("B", "cycles"):
            shown.append(f"{k} = {fmt_in_unit(v, symbol)}")
        elif symbol == "ms":
            shown.append(f"{k} = {v:g} ms")
        elif symbol == "":  # the leaf's own metric, in its unit
            named = task_metric(doc.get("rows", []))
            metric, unit = named if named else ("metric", "")
            shown.append(f"{k} = {v:g}{' ' + unit if unit else ''} (int8 {metric} worse than the ptq leaf's"
                         + (")" if named else ", in its own unit)"))
        else:
            shown.append(f"{k} = {v:g} pts (int8 accuracy below the ptq leaf)")
    src = req.get("sources") or []
    return shown + ([f"from: {', '.join(src)}"] if src else [])


def _compression_rows(doc: Mapping[str, Any]) -> list[dict[str, str]]:
    out = []
    for leaf, c in doc.get("compression", {}).items():
        if c.get("status") == "unavailable":
            out.append({"leaf": leaf, "status": "unavailable", "tensors": "n/a", "max_tensor": "n/a",
                        "max_channel": "n/a", "zeros": "n/a", "note": c.get("note", "")})
            continue
        out.append({
            "leaf": leaf,
            "status": c["status"],
            "tensors": str(c["weight_tensors"]),
            "max_tensor": str(c["max_distinct_values"]),
            "max_channel": str(c["max_distinct_per_channel"]),
            "zeros": f"{100.0 * c['zero_fraction']:.1f}",
            "note": c.get("note", ""),
        })
    return out


COMPRESSION_HEADERS = (
    ("leaf", "Leaf"),
    ("status", "Clustering in Vela's encoding"),
    ("tensors", "Weight tensors"),
    ("max_tensor", f"Max distinct int8 values per tensor (palette ≤ {PALETTE_LIMIT})"),
    ("max_channel", "Max distinct per output channel"),
    ("zeros", "Zero weights (%)"),
    ("note", "Note"),
)


def _comparison_lines(doc: Mapping[str, Any]) -> list[str]:
    comp = doc.get("comparison")
    if not comp:
        return []
    head = (f"against {comp['against']} (tolerances: "
            + ", ".join(f"{k}={v}" for k, v in comp["tolerances"].items()) + "): "
            + ("no regression" if comp["passed"] else f"{len(comp['regressions'])} regression(s)"))
    lines = [head]
    lines += [f"REGRESSION {r['text']}" for r in comp["regressions"]]
    lines += [f"changed {c['text']}" for c in comp["changes"]]
    lines += [f"added {a}" for a in comp["added"]]
    return lines
