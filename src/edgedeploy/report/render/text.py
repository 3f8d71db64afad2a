"""The report document as terminal tables (rich)."""

from __future__ import annotations

import io
from typing import Any, Mapping, Sequence

from edgedeploy.report.levels import PALETTE_LIMIT
from edgedeploy.core.units import fmt_bytes, fmt_count
from ..columns import Column, columns_of, quality_name
from .walk_text import walk_lines
from ..node_times import TIME_HEADERS, TIME_NOTE, time_rows
from .cells import _comparison_lines, _req_text, cell_text, Footnotes, uncompiled_requirement_lines


ACCURACY_KEYS = ("float_accuracy_pct", "int8_accuracy_pct", "int8_accuracy_delta_pts", "tflite_bytes",
                 "gzip_bytes")
MEMORY_KEYS = ("leaf", "level", "encoded_weights_bytes", "encoded_weights_ratio", "compiled_model_bytes", "vela_flash_bytes",
               "sram_bytes", "dram_bytes", "fits_board")
SPEED_KEYS = ("leaf", "npu_cycles", "npu_cycles_ratio", "npu_macs", "npu_macs_ratio", "compute_bound_pct", "total_cycles", "npu_clock_mhz", "latency_ms", "inferences_per_s",
              "mac_utilization_pct", "cpu_operators", "pareto", "meets_requirements", "recommended")


LAYER_HEADERS = ("Layer", "Operator", "Encoded weights (B)", "Vela distinct values", "int8 distinct values",
                 f"Within palette (≤ {PALETTE_LIMIT})", "Zero weights (%)", "Weight-read cycles", "NPU cycles")


def npu_layer_tables(doc: Mapping[str, Any]) -> list[tuple[str, list[list[str]]]]:
    """(title, rows) per variant and target of Vela's per-layer weight facts (compiled with --debug-db)."""

    tables = []
    for variant, per_target in doc.get("npu_weights", {}).items():
        for target, facts in per_target.items():
            s = facts.get("summary", {})
            title = (f"{variant} on {target}: NPU weights per layer (Vela debug database; "
                     f"{fmt_bytes(s.get('encoded_weight_bytes'))} encoded, {fmt_count(s.get('weight_read_cycles'))} "
                     f"weight-read cycles, {s.get('layers_over_palette', 0)} of {s.get('layers', 0)} layers "
                     f"over the palette)")
            rows = [[r["layer"], str(r.get("operator") or "?"), fmt_bytes(r.get("encoded_weight_bytes"), False),
                     fmt_count(r.get("vela_distinct_weights")), fmt_count(r.get("int8_distinct")),
                     "n/a" if r.get("within_palette") is None else ("yes" if r["within_palette"] else "no"),
                     "n/a" if r.get("int8_zero_fraction") is None else f"{100 * r['int8_zero_fraction']:.1f}",
                     fmt_count(r.get("weight_read_cycles")), fmt_count(r.get("npu_cycles"))]
                    for r in facts.get("layers", [])]
            tables.append((title, rows))
    return tables


def render_table(doc: Mapping[str, Any], width: int = 200) -> str:
    """Rich tables: accuracy and file sizes per leaf, then one table of Vela results per target."""
    from rich.console import Console

    notes = Footnotes()
    console = Console(file=io.StringIO(), width=width, record=True, no_color=True, highlight=False)
    by_leaf: dict[str, Mapping[str, Any]] = {}
    for r in doc["rows"]:
        by_leaf.setdefault(r["leaf"], r)
    cols = {c.key: c for c in columns_of(doc)}
    acc_cols = [cols["leaf"], cols["level"]] + [cols[k] for k in ACCURACY_KEYS]
    if "int8_other_metrics" in cols:  # a classifier's other outputs (a box regressor beside it)
        acc_cols.insert(-2, cols["int8_other_metrics"])
    if "int8_metric" in cols:  # leaves judged by their task's metric (MSE, PSNR, AUC ...) instead of accuracy
        acc_cols = [cols["leaf"], cols["level"]] + [cols[k] for k in ("float_metric", "int8_metric", "int8_metric_drop",
                                                                      "int8_other_metrics", "tflite_bytes", "gzip_bytes")]
    quality = quality_name(doc["rows"])  # "accuracy", or the task metric the leaves are judged by ("MSE")
    console.print(_rich_table(f"{quality[:1].upper()}{quality[1:]} and file size of each leaf", acc_cols,
                              [[cell_text(r, c, notes) for c in acc_cols] for r in by_leaf.values()]))
    for target, t in doc["targets"].items():
        mem = t.get("memory")
        hz = t.get("npu_hz")
        title = f"{target}: {t.get('accelerator_config') or 'unknown NPU'}" + (f" at {hz / 1e6:g} MHz" if hz else "")
        if mem:
            title += (f", board SRAM {fmt_bytes(mem['sram_bytes'])}, flash {fmt_bytes(mem['flash_bytes'])}, "
                      f"runtime margin {fmt_bytes(mem['runtime_margin_bytes'])}")
        for part, keys in (("memory", MEMORY_KEYS), ("speed and judgment", SPEED_KEYS)):
            chosen = [cols[k] for k in keys]
            cells = [[cell_text(r, c, notes) for c in chosen] for r in doc["rows"] if r.get("target") == target]
            console.print(_rich_table(f"{title} — {part}", chosen, cells))
    for title, rows in npu_layer_tables(doc):
        console.print(_plain_table(title, LAYER_HEADERS, rows, right=[False, False] + [True] * 7))
    times = time_rows(doc)
    if times:
        console.print(_plain_table(f"Time by step of each node ({TIME_NOTE})", TIME_HEADERS, times,
                                   right=[False, False, True, True, True, True]))
    uncompiled = [r["leaf"] for r in doc["rows"] if not r.get("target")]
    if uncompiled:
        console.print(f"Not compiled for any target: {', '.join(uncompiled)}", markup=False)
    for line in uncompiled_requirement_lines(doc):
        console.print(f"Requirements of {line}", markup=False)
    console.print("Requirements: " + "; ".join(_req_text(doc)))
    for r in doc["recommendations"].values():
        console.print(("Recommendation " if r.get("leaf") else "No recommendation ") + r["message"])
    for line in walk_lines(doc.get("walk")):
        console.print(f"Walk {line}", markup=False)
    for t, p in doc["pareto"].items():
        console.print(f"Pareto front on {t}: {', '.join(p['front']) or 'none'} ({p['note']})", markup=False)
    for leaf, c in doc.get("compression", {}).items():
        if c.get("status") in ("lost", "kept", "unavailable"):
            console.print(f"Compression {leaf}: {c['note']}", markup=False)
    for line in _comparison_lines(doc):
        console.print(f"Comparison {line}", markup=False)
    for n in doc["notes"]:
        console.print(f"Note: {n}", markup=False)
    for i, reason in enumerate(notes.reasons, 1):
        console.print(f"[{i}] unavailable: {reason}")
    return console.export_text()


def _rich_table(title: str, columns: Sequence[Column], rows: Sequence[Sequence[str]]):
    return _plain_table(title, [c.header for c in columns], rows, [c.kind != "text" for c in columns])


def _plain_table(title: str, headers: Sequence[str], rows: Sequence[Sequence[str]], right: Sequence[bool]):
    """A table whose cells never break (each column is at least as wide as its widest cell); headers wrap."""
    from rich.table import Table

    table = Table(title=title, title_justify="left")
    for i, header in enumerate(headers):
        widest = max([len(r[i]) for r in rows] + [len(w) for w in header.split()])
        table.add_column(header, justify="right" if right[i] else "left", min_width=widest, overflow="fold")
    for r in rows:
        table.add_row(*r)
    return table
