"""A leaf of the tree: its node's model converted to full int8, calibrated on real fine-tune samples, scored on
the evaluation split with the TFLite interpreter, and its sparsity and clusters checked again in the int8 file.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from edgedeploy.optimize import handoff, preserve
from edgedeploy.tflite.convert import convert_int8, convert_qat_int8, gzip_size
from edgedeploy.config.data import Dataset
from edgedeploy.keras.model import base_name, keras_weight_stats
from edgedeploy.core.manifest import Metric
from edgedeploy.core.weight_stats import WeightStats, stats
from edgedeploy.config.recipe import Recipe
from edgedeploy.core.stage import StageResult
from edgedeploy.config.tree import LEAVES, PRUNED_NODES, QAT_NODES, THINNED_NODES
from .scoring import float_scores, int8_scores, metric_details, metrics, task_of
from .techniques.qat import load_qat

FLOAT_MODEL = "model.h5"
QAT_WEIGHTS = "weights.h5"
INT8_MODEL = "model_int8.tflite"


def tfenv_seed(seed: int) -> None:
    from edgedeploy.keras import tfenv

    tfenv.set_seed(seed)


def start_keras_stage(seed: int) -> None:
    """What a stage that builds Keras models does first: seed (:func:`tfenv_seed`), and count Keras's automatic
    layer names from the start. The layers it builds, and so the tensor names in its files, are then named the
    same whatever ran before it in the process: the whole tree in one process, a pool worker, a Ray task, or a
    re-run that reuses the earlier stages."""
    from edgedeploy.keras import tfenv

    tfenv_seed(seed)
    tfenv.restart_layer_names()


def int8_stats(model_bytes: bytes, keras_stats: list[WeightStats], tmp: Path,
                layer_names: Iterable[str] = (), kernels: list | None = None) -> list[WeightStats]:
    """Weight statistics of the int8 TFLite, each tensor matched to its Keras layer by name and shape.

    A tensor whose name matches no layer with statistics is matched by kind and size, unless it names another
    layer of the model (``layer_names``; e.g. the two kernels of a SeparableConv2D, which has no statistics).
    """
    from edgedeploy.tflite.reader import read_weight_tensors

    path = tmp / "_probe.tflite"
    path.write_bytes(model_bytes)
    tensors = read_weight_tensors(path)
    path.unlink()
    kinds = {"CONV_2D": "Conv2D", "DEPTHWISE_CONV_2D": "DepthwiseConv2D", "FULLY_CONNECTED": "Dense"}
    layers = {s.layer: s for s in keras_stats}
    others = {base_name(n) for n in layer_names} - set(layers)
    used: set[str] = set()
    out = []
    for t in tensors:
        kind = kinds.get(t.op)
        if kind is None or t.dtype != "int8":
            continue
        values = t.values()
        segments = [seg for part in t.name.split(";") for seg in part.split("/")]
        candidates = [base_name(seg) for seg in segments if base_name(seg) in layers]
        name = next((c for c in candidates if c not in used and layers[c].kind == kind), None)
        if name is None and not candidates and any(base_name(seg) in others for seg in segments):
            continue  # another layer's kernel
        if name is None:  # fall back to the next unmatched layer of the same kind and size
            name = next((s.layer for s in keras_stats if s.layer not in used and s.kind == kind
                         and int(np.prod(s.shape)) == values.size), None)
        if name is None:
            continue
        used.add(name)
        axis = 3 if kind == "DepthwiseConv2D" else t.quantized_dimension
        out.append(stats(name, kind, values, axis, scales=len(t.scale)))
        if kernels is not None:
            kernels.append((name, kind, values))
    return out


def keras_kernels(model, recipe: Recipe):
    from edgedeploy.optimize.techniques.two_of_four import keras_kernels  # (2:4 only: the pattern's check reads the kernels)

    return keras_kernels(model) if recipe.sparsity_pattern == "2:4" else None


def verdict(node: str, where: str, found, recipe: Recipe, relu_followed, kernels=None,
            fallback: dict[str, str] | None = None):
    def check(skipped):
        return preserve.check(node, where, found, sparsity=recipe.sparsity, clusters=recipe.clusters,
                              tolerance=recipe.sparsity_tolerance, skipped=skipped,
                              per_channel_clusters=recipe.per_channel_clusters, relu_followed=relu_followed,
                              fallback=fallback)

    if recipe.sparsity_pattern == "2:4" and node in PRUNED_NODES and kernels is not None:
        from edgedeploy.optimize.techniques.two_of_four import pattern_verdict

        return pattern_verdict(node, where, found, kernels, recipe.skip_layers, check)
    return check(recipe.skip_layers)



def leaf_int8(model, qat: bool, leaf: str, data: Dataset, recipe: Recipe
              ) -> tuple[dict[str, float], bytes, str | None]:
    """A leaf's float scores on the evaluation split (:func:`~.scoring.float_scores`), its full-int8 TFLite, and
    what calibrated it (PTQ: the calibration samples; QAT: see :func:`~edgedeploy.tflite.convert.convert_qat_int8`)."""
    float_acc = float_scores(model, data)
    if qat:
        int8, calibrated_on = convert_qat_int8(
            model, lambda: data.calibration(recipe.calibration_samples, recipe.seed), recipe.float_io, f"leaf {leaf}")
    else:
        calibration, calibrated_on = data.calibration(recipe.calibration_samples, recipe.seed)
        int8 = convert_int8(model, calibration, float_io=recipe.float_io, source=f"leaf {leaf}")
    return float_acc, int8, calibrated_on


@dataclass
class ConvertedLeaf:
    """A leaf's int8 model, written into its stage folder, with its float and int8 scores on the evaluation split."""

    node: str
    int8: bytes
    path: Path
    float_values: dict[str, float]
    int8_values: dict[str, float]
    calibrated_on: str | None


def convert_and_score(model, leaf: str, out: Path, data: Dataset, recipe: Recipe) -> ConvertedLeaf:
    """:func:`leaf_int8` of ``model`` (the leaf's Keras model), its int8 model written to ``out``, and scored."""
    node = LEAVES[leaf]
    float_acc, int8, calibrated_on = leaf_int8(model, node in QAT_NODES, leaf, data, recipe)
    target = out / INT8_MODEL
    target.write_bytes(int8)
    return ConvertedLeaf(node, int8, target, float_acc, int8_scores(int8, data), calibrated_on)


def leaf_result(leaf: ConvertedLeaf, data: Dataset, recipe: Recipe, t0: float, preservation: list,
                warnings: list[str], *, extra_metrics: dict[str, Metric] | None = None,
                extra_details: dict[str, Any] | None = None) -> StageResult:
    """The convert stage's result: scores, sizes and time as metrics (``extra_metrics`` before the time), the
    preservation rows (then ``extra_details``), the data and the calibration as details."""
    leaf_metrics = {
        **metrics(data, "float", leaf.float_values),
        **metrics(data, "int8", leaf.int8_values),
        "tflite_bytes": Metric(len(leaf.int8), "B", "measured"),
        "gzip_bytes": Metric(gzip_size(leaf.int8), "B", "measured"),
        **(extra_metrics or {}),
        "convert_seconds": Metric(round(time.perf_counter() - t0, 2), "s", "measured"),
    }
    return StageResult(
        outputs={"int8_model": leaf.path},
        metrics=leaf_metrics,
        details={
            "node": leaf.node,
            **({} if task_of(data).classifier else {"metric": metric_details(data)}),
            "preservation": preservation,
            **(extra_details or {}),
            "data": data.describe(),
            "calibration": leaf.calibrated_on,
            "accuracy_split": data.describe()["eval_split"],
            "float_io": recipe.float_io,
        },
        warnings=warnings,
    )


def convert_leaf(env, leaf: str, inputs: dict[str, Path], out: Path, data: Dataset, recipe: Recipe) -> StageResult:
    """The convert stage of a leaf of a TFMOT node (float or QAT)."""
    start_keras_stage(recipe.seed)
    t0 = time.perf_counter()
    node = LEAVES[leaf]
    model = handoff.take(node, inputs["model"])  # the model its node stage just saved, in this process
    if model is None and node in QAT_NODES:
        model = load_qat(env, inputs["parent_model"], inputs["model"], node)
    elif model is None:
        model = env.keras.models.load_model(inputs["model"], compile=False)
    converted = convert_and_score(model, leaf, out, data, recipe)
    keras_stats = keras_weight_stats(model)
    int8_kernels: list = []
    int8_found = int8_stats(converted.int8, keras_stats, out, [layer.name for layer in model.layers], int8_kernels)
    found = verdict(node, "int8", int8_found, recipe, [], kernels=int8_kernels)
    preserve.raise_failures(found, f"{leaf} (int8)")
    rows = found.rows
    if node in THINNED_NODES:  # the int8 kernels keep the thinned widths
        from edgedeploy.keras.channel_surgery import kernel_channels
        from edgedeploy.optimize.preserve_channels import check_channels, int8_channels

        kept = check_channels(node, "int8", kernel_channels(model), int8_channels(int8_found))
        preserve.raise_failures(kept, f"{leaf} (int8)")
        rows = rows + kept.rows
    return leaf_result(converted, data, recipe, t0, rows, found.warnings)

