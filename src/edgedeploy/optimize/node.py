"""The stage of one node of the tree: its technique builds the model from its parent's, then the weights are
checked against what the node promises (:mod:`edgedeploy.optimize.preserve`), scored, and saved for its children."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from edgedeploy.optimize import handoff, preserve
from edgedeploy.config.data import Dataset
from edgedeploy.keras.model import keras_weight_stats
from edgedeploy.keras.rewrites import separate_relu_layers
from edgedeploy.keras.saving import save_model_h5, save_weights_h5
from edgedeploy.core.manifest import Metric
from edgedeploy.core.steptime import step_clock, timed
from edgedeploy.config.recipe import Recipe
from edgedeploy.core.stage import StageResult
from edgedeploy.config.tree import NODE_TABLE, Node, stage_kind
from edgedeploy.config.task import Task
from .leaf import FLOAT_MODEL, QAT_WEIGHTS, keras_kernels, start_keras_stage, verdict
from .scoring import float_scores, metric_details, metrics, task_of


@dataclass
class NodeRun:
    """What a technique's function gets: the node, its inputs and data, and the record it fills."""

    env: Any
    node: Node
    inputs: dict[str, Path]
    out: Path
    data: Dataset
    recipe: Recipe
    loss: Task
    trust_lambda: bool = False
    details: dict[str, Any] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)
    training: dict[str, Any] = field(default_factory=dict)

    def parent(self):
        """A fresh copy of the parent's saved (float) model."""
        return self.env.keras.models.load_model(self.inputs["model"], compile=False)


def channels_kept(env, node: str, parent_path: Path, model) -> list[dict[str, Any]]:
    """Rows of the check that ``model`` keeps its (float) parent's kernel channels; raises when one changed."""
    from edgedeploy.keras.channel_surgery import kernel_channels
    from edgedeploy.optimize.preserve_channels import check_channels

    expected = kernel_channels(env.keras.models.load_model(parent_path, compile=False))
    found = check_channels(node, "keras", expected, kernel_channels(model))
    preserve.raise_failures(found, node)
    return found.rows


def keras_node_stage(build: Callable[[NodeRun], Any], env, node: str, inputs: dict[str, Path], out: Path,
                     data: Dataset, recipe: Recipe, loss: Task, trust_lambda: bool) -> StageResult:
    """Run ``build`` for ``node`` and record the result as the node's stage."""
    start_keras_stage(recipe.seed)
    t0 = time.perf_counter()
    spec = NODE_TABLE[node]
    run = NodeRun(env, spec, dict(inputs), out, data, recipe, loss, trust_lambda)
    with step_clock() as clock:  # the steps the technique marks (timed), then the checks, scores and saving
        result_model = build(run)
        details, warnings, training = run.details, run.warnings, run.training
        with timed("checks"):
            keras_stats = keras_weight_stats(result_model)
            relu_followed = separate_relu_layers(result_model) if not spec.qat else []
            found = verdict(node, "keras", keras_stats, recipe, relu_followed,
                            kernels=keras_kernels(result_model, recipe),
                            fallback=training.get("clustering", {}).get("fallback_layers"))
            details["preservation"] = found.rows
            warnings += found.warnings
            preserve.raise_failures(found, node)
            if spec.keeps_channels and spec.technique != "thin":  # the thinned widths, kept below the thinned node
                details["preservation"] += channels_kept(env, node, inputs["model"], result_model)
        with timed("float_scores"):
            scores = float_scores(result_model, data)
        with timed("save"):
            if spec.qat:
                target = out / QAT_WEIGHTS
                save_weights_h5(result_model, target)
            else:
                target = out / FLOAT_MODEL
                save_model_h5(result_model, target)
            handoff.keep(node, target, result_model)
    details["time_by_step"] = clock.record()
    node_metrics = {
        **metrics(data, "float", scores),
        "train_seconds": Metric(round(time.perf_counter() - t0, 2), "s", "measured"),
    }
    if not task_of(data).classifier:
        details["metric"] = metric_details(data)
    if spec.technique:
        details["technique"] = spec.technique
        if spec.settings:
            details["technique_settings"] = dict(spec.settings)
        details["epochs"] = recipe.stage(stage_kind(node)).epochs
    if training:
        details["training"] = training
        warnings += [n for n in training.get("notes", [])]
    return StageResult(outputs={"keras_model" if not spec.qat else "qat_weights": target}, metrics=node_metrics,
                       details=details, warnings=warnings)
