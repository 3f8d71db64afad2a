"""A sweep's comparing report document (``edgedeploy.sweep_report``) in every format; a pure function of it."""

from __future__ import annotations

import csv
import io
import json
from typing import Any, Mapping

from .cells import _req_text
from edgedeploy.core.units import fmt_bytes, fmt_count, fmt_number, fmt_pct

HEADERS = ("Model", "Leaf", "Target", "Quality", "Vs own ptq", "Flash (B)", "SRAM (B)", "Total cycles",
           "Latency (ms)", "Meets requirements", "Model's pick", "Front", "Overall pick")
RIGHT = (False, False, False, True, True, True, True, True, True, False, False, False, False)


def _v(row: Mapping[str, Any], key: str) -> Any:
    return (row["values"].get(key) or {}).get("value")


def _yes(value: Any) -> str:
    return "n/a" if value is None else ("yes" if value else "no")


def quality_text(row: Mapping[str, Any]) -> tuple[str, str]:
    """The row's quality and its difference against its own model's ptq leaf, as text."""
    acc = _v(row, "int8_accuracy_pct")
    if acc is not None:
        delta = _v(row, "int8_accuracy_delta_pts")
        return f"{fmt_pct(acc, unit='%')} acc", fmt_pct(delta, sign=True, unit="pts")
    cell = row["values"].get("int8_metric") or {}
    if cell.get("value") is not None:
        drop = _v(row, "int8_metric_drop")
        return f"{cell['value']:.4g} {cell.get('metric', '')}".strip(), "n/a" if drop is None else f"{-drop:+.4g}"
    return "n/a", "n/a"


def table_rows(doc: Mapping[str, Any]) -> list[list[str]]:
    out = []
    for r in doc["rows"]:
        quality, delta = quality_text(r)
        out.append([r["model"], r["leaf"], r["target"], quality, delta, fmt_bytes(_v(r, "compiled_model_bytes"), False),
                    fmt_bytes(_v(r, "sram_bytes"), False), fmt_count(_v(r, "total_cycles")),
                    fmt_number(_v(r, "latency_ms"), 3),
                    _yes(r.get("meets_requirements")), "yes" if r.get("recommended") else "",
                    _yes(r.get("front")), "yes" if r.get("overall") else ""])
    return out


def model_lines(doc: Mapping[str, Any]) -> list[str]:
    """One line per model: status, what it is judged by and on which data, its own pick per target."""
    lines = []
    for m in doc["models"]:
        measure = (m.get("measure") or {}).get("name", "no quality measured")
        data = (m.get("data") or {}).get("path")
        picks = "; ".join(f"{t}: {r.get('leaf') or 'none'}" for t, r in (m.get("recommendations") or {}).items())
        text = f"{m['name']} ({m.get('status')}): {m['run_dir']}, judged by {measure}"
        text += f" on {data}" if data else ""
        text += f"; recommends {picks}" if picks else ""
        if m.get("walk"):
            text += f"; walk {m['walk'].get('stopped')}: {m['walk'].get('message')}"
        if m.get("error"):
            text += f"; failed (exit {m['error'].get('exit_code')}): {m['error'].get('message')}"
        lines.append(text)
    return lines


def comparison_lines(doc: Mapping[str, Any]) -> list[str]:
    comp = doc.get("comparison")
    if not comp:
        return []
    lines = [f"per model, against {comp['against']}: "
             + ("no regression" if comp["passed"] else f"{len(comp['regressions'])} regression(s)")]
    lines += [f"REGRESSION {r['text']}" for r in comp["regressions"]]
    for name, c in comp.get("per_model", {}).items():
        lines += [f"changed {name}: {x['text']}" for x in c.get("changes", [])]
    lines += [f"added model {name}" for name in comp.get("added", [])]
    return lines


def _overall_lines(doc: Mapping[str, Any]) -> list[str]:
    return [o["message"] for o in doc["overall"].values()] or ["nothing was compiled"]


def render_sweep_table(doc: Mapping[str, Any], width: int = 200) -> str:
    from rich.console import Console

    from .text import _plain_table

    console = Console(file=io.StringIO(), width=width, record=True, no_color=True, highlight=False)
    console.print(f"Sweep {doc['run_dir']}: {len(doc['models'])} models", markup=False)
    console.print(_plain_table("Models x leaves x targets", HEADERS, table_rows(doc), RIGHT))
    for line in model_lines(doc):
        console.print(f"Model {line}", markup=False)
    console.print("Requirements: " + "; ".join(_req_text(doc)), markup=False)
    for line in _overall_lines(doc):
        console.print(f"Overall {line}", markup=False)
    for line in comparison_lines(doc):
        console.print(f"Comparison {line}", markup=False)
    for n in doc["notes"]:
        console.print(f"Note: {n}", markup=False)
    return console.export_text()


def render_sweep_markdown(doc: Mapping[str, Any]) -> str:
    from .markdown import _md_table, md_code, md_text

    lines = [f"# edgedeploy sweep report: {md_text(doc['run_dir'])}", "",
             f"Sweep record `{md_code(doc['sweep'].get('path'))}`, edgedeploy {md_text(doc['edgedeploy_version'])}, "
             f"written {md_text(doc['created'])}.", "", "## Requirements", ""]
    lines += [f"- {md_text(t)}" for t in _req_text(doc)]
    lines += ["", "## Overall recommendation", ""] + [f"- {md_text(t)}" for t in _overall_lines(doc)]
    lines += ["", "## Models", ""] + [f"- {md_text(t)}" for t in model_lines(doc)]
    lines += ["", "## Models x leaves x targets", ""] + _md_table(HEADERS, table_rows(doc), RIGHT)
    cmp_lines = comparison_lines(doc)
    if cmp_lines:
        lines += ["", "## Comparison", ""] + [f"- {md_text(t)}" for t in cmp_lines]
    lines += ["", "## Notes", ""] + ([f"- {md_text(n)}" for n in doc["notes"]] or ["- none"])
    return "\n".join(lines) + "\n"


def render_sweep_html(doc: Mapping[str, Any]) -> str:
    from .html import CSS, _h, _html_table

    parts = ["<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'>",
             f"<title>edgedeploy sweep report: {_h(doc['run_dir'])}</title><style>{CSS}</style></head><body>",
             f"<h1>edgedeploy sweep report: <code>{_h(doc['run_dir'])}</code></h1>",
             f"<p class='muted'>Sweep record <code>{_h(doc['sweep'].get('path'))}</code>, edgedeploy "
             f"{_h(doc['edgedeploy_version'])}, written {_h(doc['created'])}.</p>",
             "<h2>Requirements</h2><ul>" + "".join(f"<li>{_h(t)}</li>" for t in _req_text(doc)) + "</ul>",
             "<h2>Overall recommendation</h2><ul>"]
    for o in doc["overall"].values():
        parts.append(f"<li class='{'ok' if o.get('leaf') else 'bad'}'>{_h(o['message'])}</li>")
    parts.append("</ul><h2>Models</h2><ul>" + "".join(f"<li>{_h(t)}</li>" for t in model_lines(doc)) + "</ul>")
    parts.append("<h2>Models x leaves x targets</h2>")
    parts.append(_html_table(HEADERS, table_rows(doc), RIGHT,
                             ["recommended" if r.get("overall") else "" for r in doc["rows"]], keys=3))
    parts += _plots(doc)
    cmp_lines = comparison_lines(doc)
    if cmp_lines:
        parts.append("<h2>Comparison</h2><ul>" + "".join(
            f"<li class='{'bad' if t.startswith('REGRESSION') else ''}'>{_h(t)}</li>" for t in cmp_lines) + "</ul>")
    parts.append("<h2>Notes</h2><ul>" + "".join(f"<li>{_h(n)}</li>" for n in doc["notes"]) + "</ul>")
    parts.append("</body></html>\n")
    return "".join(parts)


def _plots(doc: Mapping[str, Any]) -> list[str]:
    """Accuracy against flash, and flash against cycles, of every (model, leaf) per target (green: the overall pick,
    blue: on the front); a plot that cannot be drawn is named instead."""
    from .html import _h, _img
    from .plots import plot_accuracy_vs, plot_flash_vs_cycles

    pairs = {"rows": [{**r, "leaf": f"{r['model']}/{r['leaf']}", "recommended": r.get("overall"),
                       "pareto": r.get("front")} for r in doc["rows"]]}
    parts = ["<h2>Plots</h2>"]
    for title, make in (("Accuracy vs flash, per target", lambda: plot_accuracy_vs(
            pairs, "compiled_model_bytes", "flash: compiled model (B)", per_target=True)),
            ("Flash vs total cycles, per target", lambda: plot_flash_vs_cycles(pairs))):
        try:
            b64, why = make(), "no row has the values it plots"
        except Exception as exc:  # a plot that cannot be drawn must not lose the report
            b64, why = None, f"{type(exc).__name__}: {exc}"
        parts.append(f"<h3>{_h(title)}</h3>" + _img(b64, title) if b64 else f"<p class='muted'>{_h(title)}: "
                     f"{_h(why)}</p>")
    return parts


def render_sweep_csv(doc: Mapping[str, Any]) -> str:
    """One line per (model, leaf, target); numbers exactly as in the JSON, unavailable cells empty."""
    from ..sweep_report import ROW_KEYS

    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(["model", "leaf", "target", "level", *ROW_KEYS, "meets_requirements", "recommended", "front",
                     "overall"])
    for r in doc["rows"]:
        values = [_v(r, k) for k in ROW_KEYS]
        writer.writerow([r["model"], r["leaf"], r["target"], "" if r.get("level") is None else r["level"],
                         *("" if v is None else repr(v) if isinstance(v, float) else v for v in values),
                         _yes(r.get("meets_requirements")), _yes(r.get("recommended")), _yes(r.get("front")),
                         _yes(r.get("overall"))])
    return buf.getvalue()


def render_sweep(doc: Mapping[str, Any], fmt: str, width: int = 200) -> str:
    if fmt == "json":
        return json.dumps(dict(doc), indent=2, default=str) + "\n"
    if fmt == "csv":
        return render_sweep_csv(doc)
    if fmt == "markdown":
        return render_sweep_markdown(doc)
    if fmt == "html":
        return render_sweep_html(doc)
    if fmt == "table":
        return render_sweep_table(doc, width)
    raise ValueError(fmt)
