"""Rendering a report document as a terminal table, JSON, CSV, Markdown or a self-contained HTML page.

Every format is made from the same document (:func:`edgedeploy.report.build_report`)
with the same number formatting, so they show the same numbers. The HTML page
embeds its plots as base64 PNG images; matplotlib is imported only to draw them.
"""

from __future__ import annotations

import base64
import csv
import html
import io
import json
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from .report import (
    ALL_COLUMNS,
    JUDGMENT_COLUMNS,
    KEY_COLUMNS,
    PALETTE_LIMIT,
    VALUE_COLUMNS,
    Column,
    value_of,
)

FORMATS = ("table", "json", "csv", "markdown", "html")

# --------------------------------------------------------------------------- cells


def fmt_value(value: Any, kind: str) -> str:
    """How every human-readable format shows a value of ``kind``."""
    if value is None:
        return "n/a"
    if kind == "pct":
        return f"{value:.2f}"
    if kind == "pts":
        return f"{value:+.2f}"
    if kind in ("bytes", "count"):
        return f"{int(round(value)):,}"
    if kind == "ratio":
        return f"{value:.3f}"
    if kind == "ms":
        return f"{value:.4f}"
    if kind == "rate":
        return f"{value:,.1f}"
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
        if meets is None:
            return "n/a"
        if meets:
            return "yes"
        missed = [n for n, c in row.get("requirements", {}).items() if c.get("met") is not True]
        return "no: " + ", ".join(missed)
    if key == "recommended":
        return "yes" if row.get("recommended") else ""
    raise KeyError(key)


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
    if cell.get("value") is None and notes is not None:
        text += f" [{notes.mark(cell.get('unavailable') or 'not recorded')}]"
    return text


# --------------------------------------------------------------------------- JSON and CSV


def render_json(doc: Mapping[str, Any]) -> str:
    return json.dumps(doc, indent=2, default=str) + "\n"


def render_csv(doc: Mapping[str, Any]) -> str:
    """One line per row; numbers exactly as in the JSON, unavailable cells empty and explained in the last column."""
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow([c.key for c in ALL_COLUMNS] + ["unavailable"])
    for row in doc["rows"]:
        line: list[Any] = [row["leaf"], row.get("target") or "", "" if row.get("level") is None else row["level"]]
        missing = []
        for c in VALUE_COLUMNS:
            cell = row["values"][c.key]
            v = cell.get("value")
            line.append("" if v is None else repr(v) if isinstance(v, float) else v)
            if v is None:
                missing.append(f"{c.key}: {cell.get('unavailable', 'not recorded')}")
        line += [judgment_text(row, c.key) for c in JUDGMENT_COLUMNS]
        line.append("; ".join(missing))
        writer.writerow(line)
    return buf.getvalue()


# --------------------------------------------------------------------------- shared prose


def _req_text(doc: Mapping[str, Any]) -> list[str]:
    req = doc["requirements"]
    given = {k: v for k, v in req.items() if k != "sources" and v is not None}
    if not given:
        return ["none set (a board target must still fit its memory)"]
    shown = []
    for k, v in given.items():
        if k in ("max_flash", "max_sram"):
            shown.append(f"{k} = {int(v):,} B")
        elif k == "max_latency_ms":
            shown.append(f"{k} = {v:g} ms")
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


# --------------------------------------------------------------------------- Markdown


def _md_escape(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _md_table(headers: Sequence[str], rows: Sequence[Sequence[str]], right: Sequence[bool]) -> list[str]:
    out = ["| " + " | ".join(_md_escape(h) for h in headers) + " |",
           "|" + "|".join("---:" if r else ":---" for r in right) + "|"]
    out += ["| " + " | ".join(_md_escape(c) for c in row) + " |" for row in rows]
    return out


def render_markdown(doc: Mapping[str, Any]) -> str:
    notes = Footnotes()
    lines = [f"# edgedeploy report: {doc['run_dir']}", ""]
    lines.append(f"Manifest `{doc['manifest']['path']}` (sha256 `{doc['manifest']['sha256'][:16]}…`), "
                 f"edgedeploy {doc['edgedeploy_version']}, "
                 + ", ".join(f"{k} {v}" for k, v in doc["tools"].items()) + f", written {doc['created']}.")
    lines += ["", "## Requirements", ""] + [f"- {t}" for t in _req_text(doc)]
    lines += ["", "## Recommendation", ""]
    lines += [f"- {r['message']}" for r in doc["recommendations"].values()] or ["- no target compiled"]
    if doc.get("walk"):
        from .walk_text import walk_lines

        lines += ["", "## Walk", ""] + [f"- {line}" for line in walk_lines(doc["walk"])]
    lines += ["", "## Results", ""]
    right = [False, False, False] + [True] * len(VALUE_COLUMNS) + [False] * len(JUDGMENT_COLUMNS)
    lines += _md_table([c.header for c in ALL_COLUMNS],
                       [[cell_text(r, c, notes) for c in ALL_COLUMNS] for r in doc["rows"]], right)
    lines += ["", "## Pareto front (per target)", ""]
    for t, p in doc["pareto"].items():
        lines.append(f"- {t}: {', '.join(p['front']) or 'none'} ({p['note']})")
    lines += ["", "## Compression diagnostics", ""]
    comp = _compression_rows(doc)
    if comp:
        lines += _md_table([h for _, h in COMPRESSION_HEADERS],
                           [[r[k] for k, _ in COMPRESSION_HEADERS] for r in comp],
                           [False, False, True, True, True, True, False])
    else:
        lines.append("- not computed")
    cmp_lines = _comparison_lines(doc)
    if cmp_lines:
        lines += ["", "## Comparison", ""] + [f"- {t}" for t in cmp_lines]
    lines += ["", "## Notes", ""] + [f"- {n}" for n in doc["notes"]]
    if notes.reasons:
        lines += ["", "## Unavailable values", ""]
        lines += [f"- [{i}] unavailable: {r}" for i, r in enumerate(notes.reasons, 1)]
    return "\n".join(lines) + "\n"


# --------------------------------------------------------------------------- terminal table

ACCURACY_KEYS = ("float_accuracy_pct", "int8_accuracy_pct", "int8_accuracy_delta_pts", "tflite_bytes",
                 "gzip_bytes")
MEMORY_KEYS = ("leaf", "level", "encoded_weights_bytes", "encoded_weights_ratio", "compiled_model_bytes", "vela_flash_bytes",
               "sram_bytes", "dram_bytes", "fits_board")
SPEED_KEYS = ("leaf", "npu_cycles", "total_cycles", "npu_clock_mhz", "latency_ms", "inferences_per_s",
              "mac_utilization_pct", "cpu_operators", "pareto", "meets_requirements", "recommended")


LAYER_HEADERS = ("Layer", "Operator", "Encoded weights (B)", "Vela distinct values", "int8 distinct values",
                 f"Within palette (≤ {PALETTE_LIMIT})", "Zero weights (%)", "Weight-read cycles", "NPU cycles")


def npu_layer_tables(doc: Mapping[str, Any]) -> list[tuple[str, list[list[str]]]]:
    """(title, rows) per variant and target of Vela's per-layer weight facts (compiled with --debug-db)."""

    def num(v: Any) -> str:
        return "n/a" if v is None else f"{v:,}"

    tables = []
    for variant, per_target in doc.get("npu_weights", {}).items():
        for target, facts in per_target.items():
            s = facts.get("summary", {})
            title = (f"{variant} on {target}: NPU weights per layer (Vela debug database; "
                     f"{num(s.get('encoded_weight_bytes'))} B encoded, {num(s.get('weight_read_cycles'))} "
                     f"weight-read cycles, {s.get('layers_over_palette', 0)} of {s.get('layers', 0)} layers "
                     f"over the palette)")
            rows = [[r["layer"], str(r.get("operator") or "?"), num(r.get("encoded_weight_bytes")),
                     num(r.get("vela_distinct_weights")), num(r.get("int8_distinct")),
                     "n/a" if r.get("within_palette") is None else ("yes" if r["within_palette"] else "no"),
                     "n/a" if r.get("int8_zero_fraction") is None else f"{100 * r['int8_zero_fraction']:.1f}",
                     num(r.get("weight_read_cycles")), num(r.get("npu_cycles"))] for r in facts.get("layers", [])]
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
    cols = {c.key: c for c in ALL_COLUMNS}
    acc_cols = [cols["leaf"], cols["level"]] + [cols[k] for k in ACCURACY_KEYS]
    console.print(_rich_table("Accuracy and file size of each leaf", acc_cols,
                              [[cell_text(r, c, notes) for c in acc_cols] for r in by_leaf.values()]))
    for target, t in doc["targets"].items():
        mem = t.get("memory")
        hz = t.get("npu_hz")
        title = f"{target}: {t.get('accelerator_config') or 'unknown NPU'}" + (f" at {hz / 1e6:g} MHz" if hz else "")
        if mem:
            title += (f", board SRAM {mem['sram_bytes']:,} B, flash {mem['flash_bytes']:,} B, "
                      f"runtime margin {mem['runtime_margin_bytes']:,} B")
        for part, keys in (("memory", MEMORY_KEYS), ("speed and judgment", SPEED_KEYS)):
            chosen = [cols[k] for k in keys]
            cells = [[cell_text(r, c, notes) for c in chosen] for r in doc["rows"] if r.get("target") == target]
            console.print(_rich_table(f"{title} — {part}", chosen, cells))
    for title, rows in npu_layer_tables(doc):
        console.print(_plain_table(title, LAYER_HEADERS, rows, right=[False, False] + [True] * 7))
    uncompiled = [r["leaf"] for r in doc["rows"] if not r.get("target")]
    if uncompiled:
        console.print(f"Not compiled for any target: {', '.join(uncompiled)}", markup=False)
    console.print("Requirements: " + "; ".join(_req_text(doc)))
    for r in doc["recommendations"].values():
        console.print(("Recommendation " if r.get("leaf") else "No recommendation ") + r["message"])
    if doc.get("walk"):
        from .walk_text import walk_lines

        for line in walk_lines(doc["walk"]):
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


# --------------------------------------------------------------------------- plots


def _png(fig) -> str:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100, bbox_inches="tight")
    import matplotlib.pyplot as plt

    plt.close(fig)
    return base64.b64encode(buf.getvalue()).decode("ascii")


def _pyplot():
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    return plt


MARKERS = "osD^v<>ph*"


def plot_accuracy_vs(doc: Mapping[str, Any], x_key: str, x_label: str, per_target: bool) -> str | None:
    rows = [r for r in doc["rows"] if r.get("target") and value_of(r["values"]["int8_accuracy_pct"]) is not None
            and value_of(r["values"][x_key]) is not None]
    if not rows:
        return None
    plt = _pyplot()
    targets = sorted({r["target"] for r in rows})
    if per_target:
        n = len(targets)
        ncols = min(2, n)
        nrows = (n + ncols - 1) // ncols
        fig, axes = plt.subplots(nrows, ncols, figsize=(6.5 * ncols, 4.2 * nrows), squeeze=False)
        for ax, t in zip(axes.flat, targets):
            _scatter(ax, [r for r in rows if r["target"] == t], x_key, x_label, t)
        for ax in list(axes.flat)[n:]:
            ax.set_visible(False)
    else:
        fig, ax = plt.subplots(figsize=(10, 5.5))
        labels: dict[str, tuple[float, float]] = {}
        for i, t in enumerate(targets):
            group = [r for r in rows if r["target"] == t]
            ax.scatter([value_of(r["values"][x_key]) for r in group],
                       [value_of(r["values"]["int8_accuracy_pct"]) for r in group],
                       marker=MARKERS[i % len(MARKERS)], s=60, label=t, alpha=0.7)
            for r in group:  # one label per leaf, at its leftmost point
                x, y = value_of(r["values"][x_key]), value_of(r["values"]["int8_accuracy_pct"])
                if r["leaf"] not in labels or x < labels[r["leaf"]][0]:
                    labels[r["leaf"]] = (x, y)
        _annotate(ax, [(x, y, leaf) for leaf, (x, y) in labels.items()])
        ax.set_xlabel(x_label)
        ax.set_ylabel("int8 accuracy (%)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8, title="target", bbox_to_anchor=(1.02, 1), loc="upper left")
    fig.tight_layout()
    return _png(fig)


def _annotate(ax, points: Sequence[tuple[float, float, str]]) -> None:
    """Label points; leaves at the same spot share one label."""
    spots: dict[tuple[float, float], list[str]] = {}
    for x, y, label in points:
        spots.setdefault((x, y), []).append(label)
    for (x, y), labels in spots.items():
        ax.annotate(", ".join(dict.fromkeys(labels)), (x, y), fontsize=8, xytext=(4, 4), textcoords="offset points")


def _scatter(ax, rows: list[Mapping[str, Any]], x_key: str, x_label: str, title: str) -> None:
    xs = [value_of(r["values"][x_key]) for r in rows]
    ys = [value_of(r["values"]["int8_accuracy_pct"]) for r in rows]
    colors = ["tab:green" if r.get("recommended") else "tab:blue" if r.get("pareto") else "tab:gray" for r in rows]
    ax.scatter(xs, ys, c=colors, s=60)
    _annotate(ax, [(x, y, r["leaf"] + (" (recommended)" if r.get("recommended") else ""))
                   for r, x, y in zip(rows, xs, ys)])
    ax.set_title(title, fontsize=10)
    ax.set_xlabel(x_label)
    ax.set_ylabel("int8 accuracy (%)")
    ax.grid(alpha=0.3)


def plot_flash_vs_cycles(doc: Mapping[str, Any]) -> str | None:
    rows = [r for r in doc["rows"] if r.get("target") and value_of(r["values"]["compiled_model_bytes"]) is not None
            and value_of(r["values"]["total_cycles"]) is not None]
    if not rows:
        return None
    plt = _pyplot()
    targets = sorted({r["target"] for r in rows})
    n = len(targets)
    ncols = min(2, n)
    nrows = (n + ncols - 1) // ncols
    fig, axes = plt.subplots(nrows, ncols, figsize=(6.5 * ncols, 4.2 * nrows), squeeze=False)
    for ax, t in zip(axes.flat, targets):
        group = [r for r in rows if r["target"] == t]
        xs = [value_of(r["values"]["compiled_model_bytes"]) / 1024 for r in group]
        ys = [value_of(r["values"]["total_cycles"]) for r in group]
        colors = ["tab:green" if r.get("recommended") else "tab:blue" if r.get("pareto") else "tab:gray"
                  for r in group]
        ax.scatter(xs, ys, c=colors, s=60)
        _annotate(ax, [(x, y, r["leaf"]) for r, x, y in zip(group, xs, ys)])
        ax.set_title(t, fontsize=10)
        ax.set_xlabel("flash: compiled model (KiB)")
        ax.set_ylabel("total cycles")
        ax.grid(alpha=0.3)
    for ax in list(axes.flat)[n:]:
        ax.set_visible(False)
    fig.tight_layout()
    return _png(fig)


def plot_layer_cycles(layers: Sequence[Mapping[str, Any]], title: str, limit: int = 60) -> str | None:
    """Horizontal bars of Vela's per-layer cycle estimate, in network order (the costliest ``limit`` layers)."""
    indexed = [(i, l) for i, l in enumerate(layers) if isinstance(l.get("Op Cycles"), (int, float))]
    if not indexed:
        return None
    zero = sum(1 for _, l in indexed if not l["Op Cycles"])
    indexed = [(i, l) for i, l in indexed if l["Op Cycles"]] or indexed
    if zero:
        title += f"; {zero} layers with 0 cycles (fused or free) left out"
    if len(indexed) > limit:
        keep = {i for i, _ in sorted(indexed, key=lambda il: -il[1]["Op Cycles"])[:limit]}
        indexed = [(i, l) for i, l in indexed if i in keep]
        title += f" (the {limit} costliest of {len(layers)} layers)"
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(10, 0.6 + 0.22 * len(indexed)))
    labels = [f"{i}: {l.get('NNG Operator') or l.get('Original Operator', '?')}" for i, l in indexed]
    cycles = [l["Op Cycles"] for _, l in indexed]
    colors = ["tab:orange" if str(l.get("Target", "NPU")).upper() != "NPU" else "tab:blue" for _, l in indexed]
    ax.barh(range(len(indexed)), cycles, color=colors)
    ax.set_yticks(range(len(indexed)), labels, fontsize=7)
    ax.invert_yaxis()
    ax.set_xlabel("cycles (Vela per-layer estimate; blue NPU, orange CPU)")
    ax.set_title(title, fontsize=10)
    ax.grid(axis="x", alpha=0.3)
    fig.tight_layout()
    return _png(fig)


def plot_weight_stages(stages: Sequence[tuple[str, Any]], layer: str) -> str:
    import numpy as np

    plt = _pyplot()
    fig, axes = plt.subplots(1, len(stages), figsize=(4 * len(stages), 3.4), squeeze=False)
    for ax, (label, values) in zip(axes[0], stages):
        flat = np.asarray(values, dtype=np.float64).ravel()
        ax.hist(flat, bins=80, density=True, color="tab:blue")
        zeros = 100.0 * np.count_nonzero(flat == 0) / flat.size
        ax.set_title(f"{label}\n{np.unique(flat).size} distinct, {zeros:.1f}% zero", fontsize=9)
        ax.set_xlabel("weight value")
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel("density")
    fig.suptitle(f"Weights of '{layer}' through the stages", fontsize=10)
    fig.tight_layout()
    return _png(fig)


# --------------------------------------------------------------------------- weights through the stages

STAGE_CHAIN = (("baseline",), ("pruned",), ("pruned_clustered", "clustered"))
INT8_CHAIN = ("pruned_clustered", "pcqat", "clustered", "cqat", "pruned", "pqat", "qat", "ptq")


def _keras_file(manifest, rec) -> Path | None:
    for a in rec.outputs:
        if a.path.endswith((".h5", ".keras")):
            return manifest.resolve(a)
    for name in ("model.keras", "model.h5"):
        p = manifest.run_dir / rec.id / name
        if p.is_file():
            return p
    return None


def keras_kernels(path: Path) -> dict[str, Any]:
    """Weight arrays of rank >= 2 in a Keras ``.h5`` or ``.keras`` file, by their path in the file (needs h5py)."""
    import zipfile

    import h5py
    import numpy as np

    found: dict[str, Any] = {}

    def visit(root) -> None:
        group = root["model_weights"] if "model_weights" in root else root

        def take(name, obj):
            if isinstance(obj, h5py.Dataset) and obj.ndim >= 2 and "optimizer" not in name:
                found[name] = np.asarray(obj[()])

        group.visititems(take)

    if Path(path).suffix == ".keras":
        with zipfile.ZipFile(path) as zf, zf.open("model.weights.h5") as fh:
            with h5py.File(io.BytesIO(fh.read()), "r") as f:
                visit(f)
    else:
        with h5py.File(path, "r") as f:
            visit(f)
    return found


def _segments(name: str) -> set[str]:
    out = set()
    for part in name.replace(";", "/").split("/"):
        out.add(part)
        for prefix in ("prune_low_magnitude_", "cluster_", "quant_"):
            if part.startswith(prefix):
                out.add(part[len(prefix):])
    return out


def weight_stages(manifest) -> tuple[list[tuple[str, Any]], str | None, str | None]:
    """Weights of one sample kernel through baseline → pruned → clustered → int8 (or why they are unavailable)."""
    import numpy as np

    optimize = {r.variant: r for r in manifest.find(stage="optimize") if r.status != "failed" and r.variant}
    models = {node: _keras_file(manifest, rec) for node, rec in optimize.items()}
    models = {k: v for k, v in models.items() if v is not None and v.is_file()}
    if "baseline" not in models:
        return [], None, ("no optimize/baseline record with a Keras model in this run "
                          "(it was compiled from a .tflite, or optimize did not save the baseline)")
    try:
        import h5py  # noqa: F401
    except ImportError:
        return [], None, "reading Keras weights needs h5py, which is not installed"
    base = keras_kernels(models["baseline"])
    if not base:
        return [], None, f"{models['baseline']} holds no kernel of rank >= 2"
    sample_path = max(base, key=lambda k: base[k].size)
    layer = sample_path.split("/")[0]
    stages: list[tuple[str, Any]] = [("baseline (float)", base[sample_path])]
    for names in STAGE_CHAIN[1:]:
        node = next((n for n in names if n in models), None)
        if node is None:
            continue
        kernels = keras_kernels(models[node])
        match = [v for k, v in kernels.items() if layer in _segments(k) and v.size == base[sample_path].size]
        if match:
            stages.append((f"{node} (float)", max(match, key=lambda v: v.size)))
    from .report import int8_model_path
    from .tflite_model import read_weight_tensors

    for leaf in INT8_CHAIN:
        recs = manifest.find(stage="convert", variant=leaf)
        path = int8_model_path(manifest, recs[0]) if recs else None
        if path is None or not path.is_file():
            continue
        tensors = [w for w in read_weight_tensors(path) if w.dtype == "int8"]
        same = [w for w in tensors if int(np.prod(w.shape)) == base[sample_path].size]
        named = [w for w in same if layer in _segments(w.name)]
        pick = named[0] if named else (same[0] if len(same) == 1 else None)
        if pick is not None:
            values = pick.values().astype(np.float64)
            if len(pick.scale) > 1:
                axis = pick.quantized_dimension
                shape = [1] * values.ndim
                shape[axis] = len(pick.scale)
                values = values * np.asarray(pick.scale).reshape(shape)
            elif pick.scale:
                values = values * pick.scale[0]
            stages.append((f"int8 of {leaf} (dequantized)", values))
        break
    return stages, layer, None


# --------------------------------------------------------------------------- HTML

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


def render_html(doc: Mapping[str, Any], manifest=None) -> str:
    """One self-contained page: tables, judgments and plots embedded as base64 PNG (no network)."""
    from .manifest import Manifest

    if manifest is None:
        manifest = Manifest.load(Path(doc["run_dir"]))
    notes = Footnotes()
    parts = ["<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'>",
             f"<title>edgedeploy report: {_h(doc['run_dir'])}</title><style>{CSS}</style></head><body>"]
    parts.append(f"<h1>edgedeploy report: <code>{_h(doc['run_dir'])}</code></h1>")
    parts.append(f"<p class='muted'>Manifest <code>{_h(doc['manifest']['path'])}</code> (sha256 "
                 f"<code>{_h(doc['manifest']['sha256'][:16])}…</code>), edgedeploy {_h(doc['edgedeploy_version'])}, "
                 + _h(", ".join(f"{k} {v}" for k, v in doc["tools"].items())) + f", written {_h(doc['created'])}.</p>")
    parts.append("<h2>Requirements</h2><ul>" + "".join(f"<li>{_h(t)}</li>" for t in _req_text(doc)) + "</ul>")
    parts.append("<h2>Recommendation</h2><ul>")
    for r in doc["recommendations"].values():
        cls = "ok" if r.get("leaf") else "bad"
        parts.append(f"<li class='{cls}'>{_h(r['message'])}</li>")
    parts.append("</ul>")
    parts.append("<h2>Results</h2>")
    numeric = [c.kind != "text" for c in ALL_COLUMNS]
    parts.append(_html_table([c.header for c in ALL_COLUMNS],
                             [[cell_text(r, c, notes) for c in ALL_COLUMNS] for r in doc["rows"]], numeric,
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
    parts.append("<h2>Plots</h2>")
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

    no_acc = "no leaf has a measured accuracy (a run compiled from a .tflite has none; `edgedeploy optimize` measures it)"
    add("Accuracy vs NPU-encoded weights", lambda: plot_accuracy_vs(
        doc, "encoded_weights_bytes", "NPU-encoded weights (B, Vela)", per_target=False), no_acc)
    add("Accuracy vs latency, per target", lambda: plot_accuracy_vs(
        doc, "latency_ms", "latency (ms at the target's NPU clock)", per_target=True), no_acc)
    add("Flash vs total cycles, per target (blue: Pareto front, green: recommended)",
        lambda: plot_flash_vs_cycles(doc), "nothing was compiled")
    for t, rec in doc["recommendations"].items():
        leaf = rec.get("leaf")
        if not leaf:
            skipped.append(f"Per-layer cycles on {t}: no recommended leaf")
            continue
        row = next(r for r in doc["rows"] if r["leaf"] == leaf and r.get("target") == t)
        crec = manifest.records.get(row["stages"]["compile"] or "")
        layers = (crec.details.get("layers") if crec else None) or []
        add(f"Per-layer cycles of the recommended leaf {leaf} on {t}",
            lambda layers=layers, leaf=leaf, t=t: plot_layer_cycles(layers, f"{leaf} on {t}"),
            "the compile record has no per-layer data")
    stages, layer, why = _safe_weight_stages(manifest)
    if stages:
        add("Weight density of a sample kernel through the stages", lambda: plot_weight_stages(stages, layer or "?"),
            "no weights")
    else:
        skipped.append(f"Weight density through the stages: {why}")
    if skipped:
        parts.append("<p>Plots left out:</p><ul>" + "".join(f"<li class='muted'>{_h(s)}</li>" for s in skipped)
                     + "</ul>")
    parts.append("<h2>Compression diagnostics</h2>")
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
    parts.append("<h2>Notes</h2><ul>" + "".join(f"<li>{_h(n)}</li>" for n in doc["notes"]) + "</ul>")
    if notes.reasons:
        parts.append("<h2>Unavailable values</h2><ul>" + "".join(
            f"<li>[{i}] unavailable: {_h(r)}</li>" for i, r in enumerate(notes.reasons, 1)) + "</ul>")
    parts.append("</body></html>\n")
    return "".join(parts)


def _safe_weight_stages(manifest) -> tuple[list, str | None, str | None]:
    try:
        return weight_stages(manifest)
    except Exception as exc:  # an unreadable optional model must not lose the report
        return [], None, f"could not read the stage models ({type(exc).__name__}: {exc})"


def render(doc: Mapping[str, Any], fmt: str, width: int = 200) -> str:
    if fmt == "json":
        return render_json(doc)
    if fmt == "csv":
        return render_csv(doc)
    if fmt == "markdown":
        return render_markdown(doc)
    if fmt == "html":
        return render_html(doc)
    if fmt == "table":
        return render_table(doc, width)
    raise ValueError(fmt)
