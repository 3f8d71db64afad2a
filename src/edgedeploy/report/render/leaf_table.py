"""What ``edgedeploy optimize`` prints: the leaves of one tree run as a JSON document and as a terminal table.

:func:`leaves_json` reads the convert records of the run (metrics, preservation notes, warnings); :func:`leaves_table`
is a pure function of that document, so the table and ``--json`` show the same numbers.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rich.table import Table

OPTIMIZE_SCHEMA = "edgedeploy.optimize"
OPTIMIZE_SCHEMA_VERSION = 1


def _keras_layer(tensor: str) -> str:
    """``model/quant_conv2d/Conv2D`` (an int8 kernel's tensor) -> ``conv2d``."""
    parts = tensor.split("/")
    return (parts[1] if len(parts) > 1 else tensor).removeprefix("quant_")


def leaves_json(outcome: Any) -> dict[str, Any]:
    """The leaves of a tree run (an ``OptimizeOutcome``; ``outcome.leaves``: leaf -> its convert record) as the
    versioned JSON document of ``edgedeploy optimize --json``: metrics, differences against the ptq leaf,
    preservation notes, warnings."""
    from edgedeploy import __version__

    base = outcome.leaves.get("ptq")
    base_gzip = base.metric("gzip_bytes") if base else None
    base_acc = base.metric("int8_accuracy") if base else None
    leaves = []
    for leaf, rec in outcome.leaves.items():
        m = {k: v.to_dict() for k, v in rec.metrics.items()}
        gz, acc = rec.metric("gzip_bytes"), rec.metric("int8_accuracy")
        judged = rec.details.get("metric")  # a leaf judged by another metric than accuracy (edgedeploy.config.task)
        extra = {}
        if judged:
            mine, theirs = rec.metric(f"int8_{judged['key']}"), base.metric(f"int8_{judged['key']}") if base else None
            extra = {"metric": judged, "delta_int8_metric_vs_ptq": None if mine is None or theirs is None
                     else round(mine - theirs, 6)}
        kept = [r for r in rec.details.get("preservation", []) if r["status"] not in ("ok",)]
        # palette leaves check 2:4 on their int8 file only: name the layers that check left out, too
        kept += [{**r, "layer": _keras_layer(r["layer"])} for r in rec.details.get("pattern_2of4", [])
                 if r["status"] == "left out" and _keras_layer(r["layer"]) not in {k["layer"] for k in kept}]
        leaves.append({
            "leaf": leaf,
            "node": rec.details.get("node"),
            "metrics": m,
            "delta_int8_accuracy_vs_ptq": None if base_acc is None or acc is None else round(acc - base_acc, 3),
            "gzip_compression_vs_ptq_pct": None if not base_gzip or gz is None else round(100 * (1 - gz / base_gzip), 2),
            "int8_model": rec.output("int8_model").path,
            "preservation_notes": kept,
            "warnings": rec.warnings,
            **extra,
        })
    return {"schema": OPTIMIZE_SCHEMA, "schema_version": OPTIMIZE_SCHEMA_VERSION, "edgedeploy_version": __version__,
            "run_dir": str(outcome.run_dir), "leaves": leaves}


def leaves_table(doc: dict[str, Any]) -> Table:
    """The document of :func:`leaves_json` as a rich table headed by the task's metric (accuracy, MSE, PSNR ...)."""
    from rich.table import Table

    from ..columns import metric_label
    from edgedeploy.core.units import fmt_bytes, fmt_number, fmt_pct

    judged = next((leaf["metric"] for leaf in doc["leaves"] if leaf.get("metric")), None)
    name = metric_label(judged["name"]) if judged else "accuracy"  # the task's metric: MSE, PSNR ...
    unit = (f" ({judged['unit']})" if judged["unit"] else "") if judged else " (%)"
    t = Table(title=f"Deployment tree leaves ({name} on the evaluation split"
              + (", lower is better)" if judged and not judged["higher_is_better"] else ")"), title_justify="left")
    for h in ("Leaf", f"Float {name}{unit}", f"Int8 {name}{unit}", "Δ vs ptq", "TFLite (B)", "gzip (B)",
              "gzip vs ptq (%)", "Notes"):
        t.add_column(h, justify="left" if h in ("Leaf", "Notes") else "right")
    for leaf in doc["leaves"]:
        m = leaf["metrics"]
        notes = {f"{r['layer']}: {r['status']}" for r in leaf["preservation_notes"] if r["status"] != "not optimized"}
        depthwise = any(r["status"] == "not optimized" for r in leaf["preservation_notes"])
        text = "; ".join(sorted(notes)[:3]) + ("; depthwise kept dense (TFMOT)" if depthwise else "")
        key, digits, delta = "accuracy", 2, leaf["delta_int8_accuracy_vs_ptq"]
        if leaf.get("metric"):
            key, digits, delta = leaf["metric"]["key"], 4, leaf.get("delta_int8_metric_vs_ptq")
        t.add_row(leaf["leaf"], fmt_number(m.get(f"float_{key}", {}).get("value"), digits),
                  fmt_number(m.get(f"int8_{key}", {}).get("value"), digits),
                  fmt_number(delta, digits), fmt_bytes(m["tflite_bytes"]["value"], unit=False),
                  fmt_bytes(m["gzip_bytes"]["value"], unit=False), fmt_pct(leaf["gzip_compression_vs_ptq_pct"], 1),
                  text.strip("; "))
    return t
