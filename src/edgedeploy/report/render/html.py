"""The report document as one self-contained HTML page (plots embedded, no network)."""

from __future__ import annotations

import functools
import html
from typing import Any, Callable, Mapping, Sequence

from ..columns import metric_only, quality_name, shown_columns
from .cells import COMPRESSION_HEADERS, _comparison_lines, _compression_rows, _req_text, cell_text, Footnotes
from .text import LAYER_HEADERS, npu_layer_tables
from ..node_times import TIME_HEADERS, TIME_NOTE, time_rows
from .plots import plot_accuracy_vs, plot_flash_vs_cycles, plot_layer_cycles, plot_weight_stages


CSS = """
body { font-family: system-ui, -apple-system, "Segoe UI", Roboto, sans-serif; margin: 24px; color: #1d1d1f; }
h1 { font-size: 22px; } h2 { font-size: 18px; margin-top: 28px; border-bottom: 1px solid #ddd; }
table { border-collapse: collapse; font-size: 12px; margin: 8px 0; }
th, td { border: 1px solid #ccc; padding: 3px 6px; }
th { background: #f2f2f2; position: sticky; top: 0; }
td.num { text-align: right; font-variant-numeric: tabular-nums; white-space: nowrap; }
td.key { white-space: nowrap; }
tr.recommended td { background: #e8f6e8; font-weight: 600; }
.scroll { overflow-x: auto; max-width: 100%; }
.bad { color: #b00020; } .ok { color: #1b7f2a; } .muted { color: #666; }
img { max-width: 100%; border: 1px solid #eee; margin: 6px 0; }
code { background: #f5f5f5; padding: 1px 3px; }
"""


def _h(text: Any) -> str:
    return html.escape(str(text))


def _html_table(headers: Sequence[str], rows: Sequence[Sequence[str]], numeric: Sequence[bool],
                row_classes: Sequence[str] | None = None, keys: int = 1) -> str:
    out = ["<div class='scroll'><table><thead><tr>"]
    out += [f"<th>{_h(h)}</th>" for h in headers]
    out.append("</tr></thead><tbody>")
    for i, row in enumerate(rows):
        cls = f" class='{row_classes[i]}'" if row_classes and row_classes[i] else ""
        cells = []
        for j, (c, num) in enumerate(zip(row, numeric)):
            kind = "num" if num else "key" if j < keys else ""
            cells.append(f"<td class='{kind}'>{_h(c)}</td>" if kind else f"<td>{_h(c)}</td>")
        out.append(f"<tr{cls}>" + "".join(cells) + "</tr>")
    out.append("</tbody></table></div>")
    return "".join(out)


def _img(b64: str, alt: str) -> str:
    return f"<img alt='{_h(alt)}' src='data:image/png;base64,{b64}'>"


NO_PLOT_INPUTS = "the report document carries no plot inputs (build it with build_report(..., html=True))"


def render_html(doc: Mapping[str, Any]) -> str:
    """One self-contained page: tables, judgments and plots embedded as base64 PNG (no network).

    A pure function of the report document: the per-layer and weight plots use what
    ``build_report(..., html=True)`` gathered under ``doc["html"]``.
    """
    notes = Footnotes()
    parts = ["<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'>",
             f"<title>edgedeploy report: {_h(doc['run_dir'])}</title><style>{CSS}</style></head><body>"]
    parts.append(f"<h1>edgedeploy report: <code>{_h(doc['run_dir'])}</code></h1>")
    parts.append(f"<p class='muted'>Manifest <code>{_h(doc['manifest']['path'])}</code> (sha256 "
                 f"<code>{_h(doc['manifest']['sha256'][:16])}…</code>), edgedeploy {_h(doc['edgedeploy_version'])}, "
                 + _h(", ".join(f"{k} {v}" for k, v in doc["tools"].items())) + f", written {_h(doc['created'])}.</p>")
    parts += _judgments(doc, notes)
    parts += _plots(doc)
    parts += _diagnostics(doc)
    parts.append("<h2>Notes</h2><ul>" + "".join(f"<li>{_h(n)}</li>" for n in doc["notes"]) + "</ul>")
    if notes.reasons:
        parts.append("<h2>Unavailable values</h2><ul>" + "".join(
            f"<li>[{i}] unavailable: {_h(r)}</li>" for i, r in enumerate(notes.reasons, 1)) + "</ul>")
    parts.append("</body></html>\n")
    return "".join(parts)


def _judgments(doc: Mapping[str, Any], notes: Footnotes) -> list[str]:
    """Requirements, recommendations, the results table, the Pareto fronts and the comparison."""
    parts = ["<h2>Requirements</h2><ul>" + "".join(f"<li>{_h(t)}</li>" for t in _req_text(doc)) + "</ul>"]
    parts.append("<h2>Recommendation</h2><ul>")
    for r in doc["recommendations"].values():
        cls = "ok" if r.get("leaf") else "bad"
        parts.append(f"<li class='{cls}'>{_h(r['message'])}</li>")
    parts.append("</ul>")
    parts.append("<h2>Results</h2>")
    cols = shown_columns(doc)
    numeric = [c.kind != "text" for c in cols]
    parts.append(_html_table([c.header for c in cols],
                             [[cell_text(r, c, notes) for c in cols] for r in doc["rows"]], numeric,
                             ["recommended" if r.get("recommended") else "" for r in doc["rows"]], keys=3))
    parts.append("<h2>Pareto front (per target)</h2><ul>")
    for t, p in doc["pareto"].items():
        parts.append(f"<li>{_h(t)}: <b>{_h(', '.join(p['front']) or 'none')}</b> "
                     f"<span class='muted'>({_h(p['note'])})</span></li>")
    parts.append("</ul>")
    cmp_lines = _comparison_lines(doc)
    if cmp_lines:
        parts.append("<h2>Comparison</h2><ul>" + "".join(
            f"<li class='{'bad' if t.startswith('REGRESSION') else ''}'>{_h(t)}</li>" for t in cmp_lines) + "</ul>")
    return parts


def _plots(doc: Mapping[str, Any]) -> list[str]:
    """The plots, each embedded or listed as left out with the reason."""
    inputs = doc.get("html")
    parts = ["<h2>Plots</h2>"]
    skipped: list[str] = []

    def add(title: str, make: Callable[[], str | None], reason: str) -> None:
        try:
            b64 = make()
        except Exception as exc:  # a plot that cannot be drawn must not lose the report
            b64, reason = None, f"{type(exc).__name__}: {exc}"
        if b64:
            parts.append(f"<h3>{_h(title)}</h3>" + _img(b64, title))
        else:
            skipped.append(f"{title}: {reason}")

    if metric_only(doc["rows"]):  # a regression or reconstruction run: its task metric takes accuracy's place
        label = quality_name(doc["rows"])
        unit = next((r["values"]["int8_metric"].get("unit") for r in doc["rows"] if r.get("values")), "")
        y = ("int8_metric", f"int8 {label}" + (f" ({unit})" if unit else ""))
        what, no_acc = label, f"no leaf has a measured {label}"
    else:
        y = ("int8_accuracy_pct", "int8 accuracy (%)")
        what = "Accuracy"
        no_acc = "no leaf has a measured accuracy (a run compiled from a .tflite has none; `edgedeploy optimize` measures it)"
    add(f"{what} vs NPU-encoded weights", lambda: plot_accuracy_vs(
        doc, "encoded_weights_bytes", "NPU-encoded weights (B, Vela)", per_target=False, y=y), no_acc)
    add(f"{what} vs latency, per target", lambda: plot_accuracy_vs(
        doc, "latency_ms", "latency (ms at the target's NPU clock)", per_target=True, y=y), no_acc)
    add("Flash vs total cycles, per target (blue: Pareto front, green: recommended)",
        lambda: plot_flash_vs_cycles(doc), "nothing was compiled")
    for t, rec in doc["recommendations"].items():
        leaf = rec.get("leaf")
        if not leaf:
            skipped.append(f"Per-layer cycles on {t}: no recommended leaf")
            continue
        if inputs is None:
            skipped.append(f"Per-layer cycles on {t}: {NO_PLOT_INPUTS}")
            continue
        layers = inputs["layer_cycles"].get(t) or []
        add(f"Per-layer cycles of the recommended leaf {leaf} on {t}",
            functools.partial(plot_layer_cycles, layers, f"{leaf} on {t}"),
            "the compile record has no per-layer data")
    ws = inputs["weight_stages"] if inputs is not None else {"stages": [], "layer": None, "unavailable": NO_PLOT_INPUTS}
    stages, layer, why = ws["stages"], ws["layer"], ws["unavailable"]
    if stages:
        add("Weight density of a sample kernel through the stages", lambda: plot_weight_stages(stages, layer or "?"),
            "no weights")
    else:
        skipped.append(f"Weight density through the stages: {why}")
    if skipped:
        parts.append("<p>Plots left out:</p><ul>" + "".join(f"<li class='muted'>{_h(s)}</li>" for s in skipped)
                     + "</ul>")
    return parts


def _diagnostics(doc: Mapping[str, Any]) -> list[str]:
    """Compression diagnostics (per leaf, with each tensor's values) and the NPU weights per layer."""
    parts = ["<h2>Compression diagnostics</h2>"]
    comp = _compression_rows(doc)
    if comp:
        parts.append(_html_table([h for _, h in COMPRESSION_HEADERS],
                                 [[r[k] for k, _ in COMPRESSION_HEADERS] for r in comp],
                                 [False, False, True, True, True, True, False]))
        for leaf, c in doc.get("compression", {}).items():
            if c.get("tensors"):
                parts.append(f"<details><summary>{_h(leaf)}: per-tensor values</summary>")
                parts.append(_html_table(
                    ["Tensor", "Operator", "Shape", "Distinct int8 values", "Max per output channel",
                     "Zero weights (%)"],
                    [[t["tensor"], t["op"], "×".join(map(str, t["shape"])), str(t["distinct_values"]),
                      str(t["max_distinct_per_channel"]), f"{100 * t['zero_fraction']:.1f}"] for t in c["tensors"]],
                    [False, False, False, True, True, True]))
                parts.append("</details>")
    else:
        parts.append("<p class='muted'>not computed</p>")
    layer_tables = npu_layer_tables(doc)
    if layer_tables:
        parts.append("<h2>NPU weights per layer</h2>")
        for title, rows in layer_tables:
            parts.append(f"<details><summary>{_h(title)}</summary>")
            parts.append(_html_table(list(LAYER_HEADERS), rows, [False, False] + [True] * 7))
            parts.append("</details>")
    times = time_rows(doc)
    if times:
        parts.append(f"<h2>Time by step of each node</h2><p class='muted'>{_h(TIME_NOTE)}</p>")
        parts.append(_html_table(list(TIME_HEADERS), times, [False, False, True, True, True, True], keys=2))
    return parts
