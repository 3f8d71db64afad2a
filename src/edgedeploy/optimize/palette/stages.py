"""The stages of the palette nodes and leaves (dispatched from :mod:`edgedeploy.optimize.registry`)."""

from __future__ import annotations

import json
import time
from dataclasses import replace
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np

from ...errors import InvalidInputError, PreservationError
from edgedeploy.core.files import read_input_text
from edgedeploy.keras.saving import save_model_h5, save_weights_h5
from edgedeploy.config.recipe import PALETTE_PLAN_VERSION
from edgedeploy.config.tree import LEAVES, NODE_TABLE, QAT_NODES
from edgedeploy.optimize.finetune.fit import fine_tune
from ..leaf import FLOAT_MODEL, QAT_WEIGHTS, convert_and_score, leaf_result, start_keras_stage
from ..scoring import float_scores, metrics, task_of
from ..techniques.qat import input_fold_warnings, start_qat_ranges
from .projection import DAMP, PALETTE_LIMIT
from edgedeploy.vela.debugdb import WEIGHT_OPS, layer_of_tensor
from .models import HESSIAN_SAMPLES, _palette_opt, apply_plan, default_plan, fold_batch_norm, kernel_layers, layer_hessians, projection_method, scale_method
from edgedeploy.optimize.palette.sensitivity import sensitivity_sweep, sweep_holdout
from .palette_qat import load_palette_qat, palette_qat_float, palette_qat_of_float, qat_palettes

PLAN_FILE = "palette.json"


def read_plan(folder: Path) -> dict[str, Any]:
    """A palette node's plan file: its per-layer plan and the batch-norm factors folded into its kernels."""
    path = Path(folder) / PLAN_FILE
    if not path.is_file():
        raise InvalidInputError(f"{path} is missing", "re-run `edgedeploy optimize` (the palette node writes it)")
    try:
        doc = json.loads(read_input_text(path, "palette plan", "manifest"))
    except (ValueError, RecursionError) as exc:
        raise InvalidInputError(f"{path} is not valid JSON ({type(exc).__name__})",
                                "re-run `edgedeploy optimize` (the palette node writes it)") from None
    if not isinstance(doc, dict) or doc.get("version") != PALETTE_PLAN_VERSION:
        raise InvalidInputError(f"{path} was written by an older edgedeploy",
                                "re-run `edgedeploy optimize` to redo the palette nodes")
    return doc


def write_plan(folder: Path, node: str, plan: Mapping[str, Any], folded: Mapping[str, Any]) -> Path:
    """Write the plan file :func:`read_plan` reads (``folded``: :func:`fold_batch_norm`'s factors)."""
    path = Path(folder) / PLAN_FILE
    doc = {"version": PALETTE_PLAN_VERSION, "node": node, "plan": dict(plan),
           "batch_norm_factors": {name: np.asarray(f, np.float32).tolist() for name, f in folded.items()}}
    path.write_text(json.dumps(doc, indent=2) + "\n", encoding="utf-8")
    return path


def _fit_data(data, recipe):
    """The data palette QAT trains on: with ``[palette] holdout`` set, the fine-tune split less that slice."""
    if _palette_opt(recipe, "holdout", None) is None:
        return data  # the stage training keeps its own hold-out out of training
    train, _, _ = sweep_holdout(data, recipe)
    soft = getattr(data, "soft_targets", None)
    extra = {"soft_targets": soft[train]} if soft is not None else {}
    if getattr(data, "p_fit", None) is not None:
        extra["p_fit"] = data.p_fit[train]
    return replace(data, x_fit=data.x_fit[train], y_fit=data.y_fit[train], **extra)


def int8_palette_rows(int8: bytes, model, plan: Mapping[str, Mapping[str, Any]], tmp: Path) -> list[dict[str, Any]]:
    """Per weight tensor of the int8 model: its Keras layer, distinct values, zeros (and those of the layer's kernel
    in ``model``, the Keras model it was converted from), and the palette it must fit."""
    from edgedeploy.keras.model import keras_weight_stats
    from edgedeploy.tflite.reader import read_weight_tensors

    path = tmp / "_palette_probe.tflite"
    path.write_bytes(int8)
    try:
        tensors = read_weight_tensors(path)
    finally:
        path.unlink()
    names = [n for n, _ in kernel_layers(model)]
    keras_zeros = {st.layer: round(st.sparsity, 4) for st in keras_weight_stats(model)}
    rows = []
    for t in tensors:
        if t.op not in WEIGHT_OPS or t.dtype != "int8":
            continue
        values = t.values()
        layer = layer_of_tensor(t.name, names)
        setting = plan.get(layer or "", {})
        rows.append({"layer": layer, "op": t.op, "shape": list(t.shape), "scales": len(t.scale),
                     "distinct": int(np.unique(values).size), "sparsity": round(float(np.mean(values == 0)), 4),
                     "clusters": setting.get("clusters"), "target_sparsity": setting.get("sparsity"),
                     "keras_sparsity": keras_zeros.get(layer or "")})
    return rows


def check_palette(node: str, rows: Sequence[dict[str, Any]], tolerance: float) -> tuple[list[dict[str, Any]], list[str]]:
    """Judge int8 weight tensors of a palette leaf: ≤ clusters distinct values per TENSOR, sparsity kept.

    A planned layer's int8 tensor keeps at least the zeros of its Keras kernel (the pruned parent's, which the
    palette node and its QAT keep in every layer they were in, plus the plan's extra sparsity), less
    ``tolerance``. A layer the plan keeps as its parent left it (clusters None) is only held to Vela's palette
    limit (a warning when over it). Returns (rows with status and note, failures).
    """
    failures, out = [], []
    for r in rows:
        r = dict(r)
        problems = []
        if r["clusters"] is not None:
            limit = int(r["clusters"])
            if r["distinct"] > limit:
                problems.append(f"{r['distinct']} distinct int8 values per tensor > {limit}")
            want = max(float(r.get("target_sparsity") or 0.0), float(r.get("keras_sparsity") or 0.0))
            if want > 0 and r["sparsity"] < want - tolerance:
                problems.append(f"sparsity {r['sparsity']:.3f} < target {want:.2f} - {tolerance:.2f}")
            r["status"], r["note"] = ("failed", "; ".join(problems)) if problems else (
                "ok", f"{r['distinct']} ≤ {limit} values per tensor: one palette for Vela")
        elif r["layer"] is None:
            r["status"], r["note"] = "ok", "not a Keras kernel layer"
        else:
            over = r["distinct"] > PALETTE_LIMIT
            r["status"] = "warning" if over else "ok"
            r["note"] = (f"kept as its parent left it: {r['distinct']} values per tensor"
                         + (f" > Vela's palette of {PALETTE_LIMIT}" if over else ""))
        if problems:
            failures.append(f"{node} (int8): layer {r['layer']}: {r['note']}")
        out.append(r)
    return out, failures


def train_node(env, node: str, inputs: Mapping[str, Path], out: Path, data, recipe, loss):
    """The stage of a palette node (the registry's "palette" and "palette_qat" techniques)."""
    from edgedeploy.keras.model import keras_weight_stats
    from edgedeploy.core.manifest import Metric
    from edgedeploy.core.stage import StageResult

    start_keras_stage(recipe.seed)
    t0 = time.perf_counter()
    parent = env.keras.models.load_model(inputs["model"], compile=False)
    details: dict[str, Any] = {"technique": NODE_TABLE[node].technique}
    warnings: list[str] = []
    fit_data = _fit_data(data, recipe)
    if NODE_TABLE[node].technique == "palette":
        result_model, plan, folded = _projected_node(env, node, parent, inputs, out, data, fit_data, recipe, loss,
                                                     details, warnings)
        target, role = out / FLOAT_MODEL, "keras_model"
        save_model_h5(result_model, target)
    else:
        doc = read_plan(Path(inputs["model"]).parent)
        plan, folded = doc["plan"], doc["batch_norm_factors"]
        parent = palette_qat_float(parent, details)  # (the activation ranges start from its layers)
        result_model = palette_qat_of_float(parent, plan, recipe.seed, folded, details)
        warnings.extend(input_fold_warnings(details))
        start_qat_ranges(result_model, parent, data, recipe, details)
        # The same training budget as TFMOT's cluster + QAT path (the cluster stage's epochs plus the QAT
        # stage's), as one run: one warm-up and one decay at the QAT stage's rate. Two runs back to back
        # restart the warm-up halfway, which on ResNet-8 (2 + 2 epochs) undid the first run's progress.
        epochs = recipe.stage("cluster").epochs + recipe.stage("qat").epochs
        one_run = replace(recipe, stage_epochs={**recipe.stage_epochs, "qat": epochs})
        details["training"] = {"qat": fine_tune(env, result_model, fit_data, one_run, "qat", loss, node)}
        details["qat_palettes"] = qat_palettes(parent, plan, recipe.seed)
        details["epochs"] = epochs
        details["trained_in"] = "kernel units before batch-norm folding" if folded else "the kernels as they are"
        target, role = out / QAT_WEIGHTS, "qat_weights"
        save_weights_h5(result_model, target)
    write_plan(out, node, plan, folded)
    details["plan"] = plan
    details["preservation"] = [s.to_dict() for s in keras_weight_stats(result_model)]
    node_metrics = {
        **metrics(data, "float", float_scores(result_model, data)),
        "train_seconds": Metric(round(time.perf_counter() - t0, 2), "s", "measured"),
    }
    return StageResult(outputs={role: target, "palette_plan": out / PLAN_FILE}, metrics=node_metrics, details=details,
                       warnings=warnings)


def _projected_node(env, node: str, parent, inputs: Mapping[str, Path], out: Path, data, fit_data, recipe, loss,
                    details: dict[str, Any], warnings: list[str]) -> tuple[Any, dict[str, Any], dict[str, Any]]:
    """The "palette" node: the parent with batch norm folded and every planned kernel projected onto its palette
    (the plan searched by the sensitivity sweep when the recipe asks); returns the model, the plan and the
    folded batch-norm factors, and fills ``details`` and ``warnings``."""
    from edgedeploy.keras.rewrites import fuse_separate_relu

    model, folded = fold_batch_norm(parent)  # (the baseline node split each SeparableConv2D)
    model, fused = fuse_separate_relu(model, relu6=True)  # palette QAT keeps a relu6 activation (see below)
    details.update(folded_batch_norm=sorted(folded), fused_relu=fused)
    plan = default_plan(model, recipe)
    hessians = _compensation(model, fit_data, recipe, details)
    big = sorted(n for n, p in plan.items() if p["clusters"] is not None and p["clusters"] > PALETTE_LIMIT)
    if big:
        warnings.append(f"{', '.join(big)}: more than {PALETTE_LIMIT} clusters, more values than Vela's palette holds")
    searched = _palette_opt(recipe, "search", False)
    if searched and not task_of(data).classifier:
        searched = False  # the sweep's drop estimate is the rise of the cross-entropy and the accuracy drop
        details["sweep"] = {"off": f"a {task_of(data).kind} model: the sweep judges drops by accuracy and "
                                   "cross-entropy; the plan is the recipe's clusters and [layers] settings"}
        warnings.append(f"[palette] search is off for this {task_of(data).kind} model (see details.sweep)")
    if searched:
        _search_plan(env, plan, model, inputs, out, data, recipe, loss, hessians, details)
    details["scales"] = scale_method(recipe)
    details["projection"] = apply_plan(model, plan, recipe.seed, hessians, details["scales"])
    over = {name: p["distinct_int8_per_channel_quant"] for name, p in details["projection"].items()
            if p["distinct_int8_per_channel_quant"] > int(plan[name]["clusters"])}
    if over:
        name = next(iter(over))
        raise PreservationError(f"stage {node}: layer {name} quantizes to {over[name]} distinct int8 values, more "
                                f"than its palette of {plan[name]['clusters']}",
                                "report this model; list the layer in skip_layers to leave it as it is")
    return model, plan, folded


def _compensation(model, fit_data, recipe, details: dict[str, Any]) -> dict[str, np.ndarray] | None:
    """The layer Hessians of the error-compensating projection when the recipe asks for it (None: nearest)."""
    if projection_method(recipe) != "gptq":
        details["compensation"] = {"method": "nearest"}
        return None
    n = int(_palette_opt(recipe, "hessian_samples", HESSIAN_SAMPLES))
    x_h, h_from = fit_data.calibration(n, recipe.seed)
    hessians = layer_hessians(model, x_h, [name for name, _ in kernel_layers(model, recipe.skip_layers)],
                              seed=recipe.seed)
    details["compensation"] = {"method": "gptq", "hessian_samples": int(len(x_h)), "from": h_from,
                               "damp": DAMP, "layers": sorted(hessians)}
    return hessians


def _search_plan(env, plan: dict[str, Any], model, inputs: Mapping[str, Path], out: Path, data, recipe, loss,
                 hessians, details: dict[str, Any]) -> None:
    """Update ``plan`` with the sensitivity sweep's, the recipe's explicit [layers] settings winning."""
    import shutil

    reference = inputs.get("baseline_model")
    if reference is not None:
        reference = env.keras.models.load_model(reference, compile=False)
    sweep = sensitivity_sweep(model, data, recipe, out / "_sweep", hessians, loss.from_logits, reference)
    plan.update({k: v for k, v in sweep["plan"].items()})
    for name, over in (getattr(recipe, "layers", {}) or {}).items():  # explicit settings win
        if name in plan:
            plan[name] = {"clusters": int(over.get("clusters", recipe.clusters)),
                          "sparsity": float(over.get("sparsity", 0.0))}
    details["sweep"] = {k: v for k, v in sweep.items() if k != "plan"}
    shutil.rmtree(out / "_sweep", ignore_errors=True)


def convert_leaf(env, leaf: str, inputs: Mapping[str, Path], out: Path, data, recipe):
    """The convert stage of a palette leaf (the registry's "palette_int8" conversion)."""
    from edgedeploy.core.manifest import Metric

    start_keras_stage(recipe.seed)
    t0 = time.perf_counter()
    node = LEAVES[leaf]
    doc = read_plan(Path(inputs["model"]).parent)
    plan = doc["plan"]
    if node in QAT_NODES:
        model = load_palette_qat(inputs["parent_model"], inputs["model"], plan, recipe.seed, doc["batch_norm_factors"])
    else:
        model = env.keras.models.load_model(inputs["model"], compile=False)
    converted = convert_and_score(model, leaf, out, data, recipe)
    rows = int8_palette_rows(converted.int8, model, plan, out)
    rows, failures = check_palette(node, rows, recipe.sparsity_tolerance)
    if failures:
        more = f" (and {len(failures) - 1} more)" if len(failures) > 1 else ""
        raise PreservationError(f"stage {leaf} lost its palette: {failures[0]}{more}",
                                "report this model; list the layer in skip_layers to leave it as it is")
    warnings = [f"{r['layer']}: {r['note']}" for r in rows if r["status"] == "warning"]
    distinct = Metric(max((r["distinct"] for r in rows), default=0), "count", "measured")
    return leaf_result(converted, data, recipe, t0, rows, warnings,
                       extra_metrics={"max_distinct_int8_per_tensor": distinct}, extra_details={"plan": plan})
