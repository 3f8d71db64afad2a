"""Plots of a report document as base64 PNG; matplotlib is imported only to draw them."""

from __future__ import annotations

import base64
import io
from typing import Any, Mapping, Sequence

from ..columns import value_of


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


def plot_accuracy_vs(doc: Mapping[str, Any], x_key: str, x_label: str, per_target: bool,
                     y: tuple[str, str] = ("int8_accuracy_pct", "int8 accuracy (%)")) -> str | None:
    """The leaves' int8 quality (``y``: row value and axis label; accuracy unless given) against ``x_key``."""
    y_key, y_label = y
    rows = [r for r in doc["rows"] if r.get("target") and value_of(r["values"].get(y_key)) is not None
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
            _scatter(ax, [r for r in rows if r["target"] == t], x_key, x_label, t, y)
        for ax in list(axes.flat)[n:]:
            ax.set_visible(False)
    else:
        fig, ax = plt.subplots(figsize=(10, 5.5))
        labels: dict[str, tuple[float, float]] = {}
        for i, t in enumerate(targets):
            group = [r for r in rows if r["target"] == t]
            ax.scatter([value_of(r["values"][x_key]) for r in group],
                       [value_of(r["values"][y_key]) for r in group],
                       marker=MARKERS[i % len(MARKERS)], s=60, label=t, alpha=0.7)
            for r in group:  # one label per leaf, at its leftmost point
                px, py = value_of(r["values"][x_key]), value_of(r["values"][y_key])
                if r["leaf"] not in labels or px < labels[r["leaf"]][0]:
                    labels[r["leaf"]] = (px, py)
        _annotate(ax, [(x, y, leaf) for leaf, (x, y) in labels.items()])
        ax.set_xlabel(x_label)
        ax.set_ylabel(y_label)
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


def _scatter(ax, rows: list[Mapping[str, Any]], x_key: str, x_label: str, title: str,
             y: tuple[str, str] = ("int8_accuracy_pct", "int8 accuracy (%)")) -> None:
    xs = [value_of(r["values"][x_key]) for r in rows]
    ys = [value_of(r["values"][y[0]]) for r in rows]
    colors = ["tab:green" if r.get("recommended") else "tab:blue" if r.get("pareto") else "tab:gray" for r in rows]
    ax.scatter(xs, ys, c=colors, s=60)
    _annotate(ax, [(x, y, r["leaf"] + (" (recommended)" if r.get("recommended") else ""))
                   for r, x, y in zip(rows, xs, ys)])
    ax.set_title(title, fontsize=10)
    ax.set_xlabel(x_label)
    ax.set_ylabel(y[1])
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
