"""The deployment tree: prune, cluster and quantization-aware training on the user's model and data.

Each node of the tree (``recipe.NODES``) is one stage, ``optimize/<node>``, trained once from its parent's
saved model and reused by all its children; every branch starts from its own fresh copy of the parent
(TFMOT wrappers change the layers they wrap). Each leaf is then converted to full int8
(``convert/<leaf>``), calibrated on real fine-tune samples, and scored on the evaluation split with the
TFLite interpreter. Sparsity and clusters are checked after every stage, on the Keras weights and again on
the int8 TFLite.
"""

from __future__ import annotations

import logging
import math
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from . import preserve
from .convert import convert_int8, gzip_size, keras_accuracy, tflite_accuracy
from .data import Dataset, load_dataset
from .errors import InvalidInputError, UsageError
from .keras_model import (
    base_name,
    clone,
    fuse_separate_relu,
    inner,
    keras_weight_stats,
    load_model,
    separate_relu_layers,
)
from .manifest import Metric, StageRecord
from .preserve import WeightStats, stats
from .recipe import LEAVES, NODES, QAT_NODES, Recipe, nodes_for, stage_kind
from .stages import RunContext, StageResult, StageSpec, run_stage

log = logging.getLogger("edgedeploy")

FLOAT_MODEL = "model.h5"
QAT_WEIGHTS = "weights.h5"
INT8_MODEL = "model_int8.tflite"


@dataclass
class Loss:
    name: str  # Keras loss identifier
    from_logits: bool
    source: str

    def build(self, keras):
        if self.name == "sparse_categorical_crossentropy":
            return keras.losses.SparseCategoricalCrossentropy(from_logits=self.from_logits)
        raise UsageError(f"loss '{self.name}' is not supported for fine-tuning", "use a classifier with cross-entropy")


@dataclass
class OptimizeOutcome:
    run_dir: Path
    leaves: dict[str, StageRecord] = field(default_factory=dict)
    nodes: dict[str, StageRecord] = field(default_factory=dict)


# --------------------------------------------------------------------------- set-up


def training_loss(model, training_config: dict | None) -> Loss:
    """The loss from the model's compile config if it has one, else inferred from integer labels."""
    out_act = getattr(inner(model.layers[-1]), "activation", None)
    softmax = getattr(out_act, "__name__", "") == "softmax"
    if training_config and training_config.get("loss"):
        loss = training_config["loss"]
        name = loss if isinstance(loss, str) else (loss.get("class_name") or loss.get("config", {}).get("name", ""))
        name = str(name)
        from_logits = bool(loss.get("config", {}).get("from_logits", False)) if isinstance(loss, dict) else not softmax
        if "crossentropy" in name.lower().replace("_", ""):
            return Loss("sparse_categorical_crossentropy", from_logits,
                        f"model compile config ({name}; integer labels, so its sparse form)")
    return Loss("sparse_categorical_crossentropy", not softmax,
                "inferred: integer class labels and " + ("a softmax output" if softmax else "a logits output"))


class _Progress:
    """A rich progress bar on stderr for Keras training (shown when stderr is a terminal)."""

    def __init__(self, keras, title: str, epochs: int, steps: int) -> None:
        self.keras, self.title, self.epochs, self.steps = keras, title, epochs, steps

    def callback(self):
        keras, title, total = self.keras, self.title, self.epochs * self.steps
        enabled = sys.stderr.isatty() and log.getEffectiveLevel() <= logging.WARNING

        class CB(keras.callbacks.Callback):
            def on_train_begin(self, logs=None):
                self.bar = None
                if enabled:
                    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

                    self.bar = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                                        TimeRemainingColumn(), transient=True)
                    self.bar.start()
                    self.task = self.bar.add_task(title, total=total)

            def on_train_batch_end(self, batch, logs=None):
                if self.bar is not None:
                    self.bar.advance(self.task)

            def on_epoch_end(self, epoch, logs=None):
                logs = logs or {}
                log.info("%s epoch %d: loss %.4f accuracy %.4f", title, epoch + 1, logs.get("loss", math.nan),
                         logs.get("accuracy", math.nan))

            def on_train_end(self, logs=None):
                if self.bar is not None:
                    self.bar.stop()

        return CB()


def _fit(env, model, data: Dataset, recipe: Recipe, kind: str, loss: Loss, title: str, callbacks=()) -> None:
    keras = env.keras
    settings = recipe.stage(kind)
    if settings.epochs == 0:
        return
    model.compile(optimizer=keras.optimizers.Adam(settings.learning_rate), loss=loss.build(keras), metrics=["accuracy"])
    steps = math.ceil(len(data.x_fit) / recipe.batch_size)
    progress = _Progress(keras, title, settings.epochs, steps).callback()
    model.fit(data.x_fit, data.y_fit, batch_size=recipe.batch_size, epochs=settings.epochs, shuffle=True, verbose=0,
              callbacks=[*callbacks, progress])


def _optimizable(layer, recipe: Recipe) -> bool:
    kind = inner(layer).__class__.__name__
    return kind in ("Conv2D", "Dense") and base_name(layer.name) not in recipe.skip_layers


# --------------------------------------------------------------------------- techniques


def prune(env, parent, data: Dataset, recipe: Recipe, loss: Loss):
    keras, sparsity = env.keras, env.tfmot.sparsity.keras
    settings = recipe.stage("prune")
    if settings.epochs < 1:
        raise UsageError("pruning needs at least one epoch of fine-tuning", "set [stages.prune] epochs >= 1")
    steps = math.ceil(len(data.x_fit) / recipe.batch_size) * settings.epochs
    if recipe.pruning_schedule == "polynomial":
        schedule = sparsity.PolynomialDecay(initial_sparsity=0.0, final_sparsity=recipe.sparsity, begin_step=0,
                                            end_step=max(1, int(steps * 0.8)), frequency=max(1, steps // 20))
    else:
        schedule = sparsity.ConstantSparsity(recipe.sparsity, begin_step=0, frequency=max(1, min(100, steps)))

    def wrap(layer):
        if _optimizable(layer, recipe):
            return sparsity.prune_low_magnitude(layer, pruning_schedule=schedule)
        return layer

    model = keras.models.clone_model(clone(parent), clone_function=wrap)
    _fit(env, model, data, recipe, "prune", loss, "prune", callbacks=[sparsity.UpdatePruningStep()])
    return sparsity.strip_pruning(model)


def cluster(env, parent, data: Dataset, recipe: Recipe, loss: Loss, preserve_sparsity: bool):
    keras, clustering = env.keras, env.tfmot.clustering.keras
    init = {
        "kmeans++": clustering.CentroidInitialization.KMEANS_PLUS_PLUS,
        "linear": clustering.CentroidInitialization.LINEAR,
        "density": clustering.CentroidInitialization.DENSITY_BASED,
        "random": clustering.CentroidInitialization.RANDOM,
    }[recipe.centroid_init]

    def wrap(layer):
        if _optimizable(layer, recipe):
            kwargs = {"preserve_sparsity": preserve_sparsity}
            if recipe.per_channel_clusters and inner(layer).__class__.__name__ == "Conv2D":
                kwargs["cluster_per_channel"] = True
            return clustering.cluster_weights(layer, number_of_clusters=recipe.clusters,
                                              cluster_centroids_init=init, **kwargs)
        return layer

    model = keras.models.clone_model(clone(parent), clone_function=wrap)
    _fit(env, model, data, recipe, "cluster", loss, "cluster")
    return clustering.strip_clustering(model)


def qat_model(env, parent, node: str):
    """The QAT model of ``node`` built from its (float) parent, before training."""
    quant = env.tfmot.quantization.keras
    if node == "qat":
        return quant.quantize_model(clone(parent))
    from tensorflow_model_optimization.python.core.quantization.keras.collab_opts.cluster_preserve import (
        default_8bit_cluster_preserve_quantize_scheme as cluster_preserve,
    )
    from tensorflow_model_optimization.python.core.quantization.keras.collab_opts.prune_preserve import (
        default_8bit_prune_preserve_quantize_scheme as prune_preserve,
    )

    scheme = {
        "pqat": lambda: prune_preserve.Default8BitPrunePreserveQuantizeScheme(),
        "cqat": lambda: cluster_preserve.Default8BitClusterPreserveQuantizeScheme(preserve_sparsity=False),
        "pcqat": lambda: cluster_preserve.Default8BitClusterPreserveQuantizeScheme(preserve_sparsity=True),
    }[node]()
    annotated = quant.quantize_annotate_model(clone(parent))
    return quant.quantize_apply(annotated, scheme)


def load_qat(env, parent_path: Path, weights_path: Path, node: str):
    parent = env.keras.models.load_model(parent_path, compile=False)
    model = qat_model(env, parent, node)
    model.load_weights(weights_path)
    return model


# --------------------------------------------------------------------------- preservation


def _int8_stats(model_bytes: bytes, keras_stats: list[WeightStats], tmp: Path) -> list[WeightStats]:
    """Weight statistics of the int8 TFLite, each tensor matched to its Keras layer by name and shape."""
    from .tflite_model import read_weight_tensors

    path = tmp / "_probe.tflite"
    path.write_bytes(model_bytes)
    tensors = read_weight_tensors(path)
    path.unlink()
    kinds = {"CONV_2D": "Conv2D", "DEPTHWISE_CONV_2D": "DepthwiseConv2D", "FULLY_CONNECTED": "Dense"}
    layers = {s.layer: s for s in keras_stats}
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
        if name is None:  # fall back to the next unmatched layer of the same kind and size
            name = next((s.layer for s in keras_stats if s.layer not in used and s.kind == kind
                         and int(np.prod(s.shape)) == values.size), None)
        if name is None:
            continue
        used.add(name)
        axis = 3 if kind == "DepthwiseConv2D" else t.quantized_dimension
        out.append(stats(name, kind, values, axis, scales=len(t.scale)))
    return out


def _verdict(node: str, where: str, found, recipe: Recipe, relu_followed):
    return preserve.check(node, where, found, sparsity=recipe.sparsity, clusters=recipe.clusters,
                          tolerance=recipe.sparsity_tolerance, skipped=recipe.skip_layers,
                          per_channel_clusters=recipe.per_channel_clusters, relu_followed=relu_followed)


# --------------------------------------------------------------------------- the tree


def optimize(
    model_path: Path,
    data_path: Path,
    out: Path,
    recipe: Recipe,
    *,
    trust_lambda: bool = False,
    reuse: bool = True,
) -> OptimizeOutcome:
    """Run the nodes the requested leaves need, then convert and score every leaf."""
    from . import tfenv

    model_path, data_path = Path(model_path), Path(data_path)
    env = tfenv.load()
    # Check every input before anything is written.
    model, info = load_model(model_path, trust_lambda)
    num_classes = int(model.output_shape[-1])
    data = load_dataset(data_path, tuple(model.input_shape[1:]), num_classes)
    if data.reshaped_from:
        log.warning("%s: samples reshaped from %s to the model input %s", data_path, list(data.reshaped_from),
                    list(model.input_shape[1:]))
    loss = training_loss(model, info.training_config)
    ctx = RunContext.open(out)
    ctx.manifest.tools.update(env.versions)
    ctx.manifest.info["optimize"] = {
        "model": str(model_path.resolve()),
        "data": data.describe(),
        "recipe": recipe.to_dict(),
        "loss": {"name": loss.name, "from_logits": loss.from_logits, "source": loss.source},
    }
    ctx.manifest.save()
    outcome = OptimizeOutcome(ctx.run_dir)
    versions = dict(env.versions)
    paths: dict[str, Path] = {}
    for node in nodes_for(list(recipe.leaves)):
        parent = NODES[node][0]
        inputs = {"data": data_path, "model": model_path if parent is None else paths[parent]}
        spec = StageSpec("optimize", node, parent=f"optimize/{parent}" if parent else None,
                         params=recipe.node_params(node), tool_versions=versions)
        rec = run_stage(ctx, spec, inputs, lambda d, n=node, i=inputs: _train_node(env, n, i, d, data, recipe, loss,
                                                                                    trust_lambda), reuse=reuse)
        outcome.nodes[node] = rec
        paths[node] = ctx.manifest.resolve(rec.outputs[0])
    for leaf in recipe.leaves:
        node = LEAVES[leaf]
        inputs = {"data": data_path, "model": paths[node]}
        if node in QAT_NODES:
            inputs["parent_model"] = paths[NODES[node][0]]
        params = {"float_io": recipe.float_io, "calibration_samples": recipe.calibration_samples,
                  "sparsity": recipe.sparsity, "clusters": recipe.clusters, "tolerance": recipe.sparsity_tolerance,
                  "skip_layers": list(recipe.skip_layers), "per_channel_clusters": recipe.per_channel_clusters}
        spec = StageSpec("convert", leaf, parent=f"optimize/{node}", params=params, tool_versions=versions)
        rec = run_stage(ctx, spec, inputs, lambda d, l=leaf, i=inputs: _convert_leaf(env, l, i, d, data, recipe),
                        reuse=reuse)
        outcome.leaves[leaf] = rec
    return outcome


def _train_node(env, node: str, inputs: dict[str, Path], out: Path, data: Dataset, recipe: Recipe, loss: Loss,
                trust_lambda: bool) -> StageResult:
    tfenv_seed(recipe.seed)
    t0 = time.perf_counter()
    details: dict[str, Any] = {}
    warnings: list[str] = []
    if node == "baseline":
        model, _ = load_model(inputs["model"], trust_lambda)
        relu = separate_relu_layers(model)
        if relu and recipe.fuse_relu:
            model, fused = fuse_separate_relu(model)
            details["fused_relu"] = fused
            warnings.append(f"folded the separate ReLU after {', '.join(fused)} into the layer's activation, "
                            "so QAT keeps their quantizers (and PQAT/PCQAT their sparsity and clusters)")
        elif relu:
            details["separate_relu"] = relu
        result_model = model
    else:
        parent = env.keras.models.load_model(inputs["model"], compile=False)
        if node == "pruned":
            result_model = prune(env, parent, data, recipe, loss)
        elif node == "clustered":
            result_model = cluster(env, parent, data, recipe, loss, preserve_sparsity=False)
        elif node == "pruned_clustered":
            result_model = cluster(env, parent, data, recipe, loss, preserve_sparsity=True)
        else:
            result_model = qat_model(env, parent, node)
            _fit(env, result_model, data, recipe, "qat", loss, node)
    keras_stats = keras_weight_stats(result_model)
    relu_followed = separate_relu_layers(result_model) if node not in QAT_NODES else []
    verdict = _verdict(node, "keras", keras_stats, recipe, relu_followed)
    details["preservation"] = verdict.rows
    warnings += verdict.warnings
    preserve.raise_failures(verdict, node)
    accuracy = keras_accuracy(result_model, data.x_eval, data.y_eval)
    if node in QAT_NODES:
        target = out / QAT_WEIGHTS
        result_model.save_weights(target)
    else:
        target = out / FLOAT_MODEL
        result_model.save(target, include_optimizer=False)
    metrics = {
        "float_accuracy": Metric(round(accuracy, 3), "%", "measured"),
        "train_seconds": Metric(round(time.perf_counter() - t0, 2), "s", "measured"),
    }
    if NODES[node][1]:
        details["technique"] = NODES[node][1]
        details["epochs"] = recipe.stage(stage_kind(node)).epochs
    return StageResult(outputs={"keras_model" if node not in QAT_NODES else "qat_weights": target}, metrics=metrics,
                       details=details, warnings=warnings)


def _convert_leaf(env, leaf: str, inputs: dict[str, Path], out: Path, data: Dataset, recipe: Recipe) -> StageResult:
    tfenv_seed(recipe.seed)
    t0 = time.perf_counter()
    node = LEAVES[leaf]
    if node in QAT_NODES:
        model = load_qat(env, inputs["parent_model"], inputs["model"], node)
        calibration = None
    else:
        model = env.keras.models.load_model(inputs["model"], compile=False)
        calibration = data.x_fit[: recipe.calibration_samples]
    float_acc = keras_accuracy(model, data.x_eval, data.y_eval)
    int8 = convert_int8(model, calibration, float_io=recipe.float_io)
    target = out / INT8_MODEL
    target.write_bytes(int8)
    int8_acc = tflite_accuracy(int8, data.x_eval, data.y_eval)
    keras_stats = keras_weight_stats(model)
    int8_stats = _int8_stats(int8, keras_stats, out)
    verdict = _verdict(node, "int8", int8_stats, recipe, [])
    preserve.raise_failures(verdict, f"{leaf} (int8)")
    metrics = {
        "float_accuracy": Metric(round(float_acc, 3), "%", "measured"),
        "int8_accuracy": Metric(round(int8_acc, 3), "%", "measured"),
        "tflite_bytes": Metric(len(int8), "B", "measured"),
        "gzip_bytes": Metric(gzip_size(int8), "B", "measured"),
        "convert_seconds": Metric(round(time.perf_counter() - t0, 2), "s", "measured"),
    }
    return StageResult(
        outputs={"int8_model": target},
        metrics=metrics,
        details={
            "node": node,
            "preservation": verdict.rows,
            "data": data.describe(),
            "calibration": None if calibration is None else
            f"first {len(calibration)} samples of the fine-tune split ({data.describe()['fit_split']})",
            "accuracy_split": data.describe()["eval_split"],
            "float_io": recipe.float_io,
        },
        warnings=verdict.warnings,
    )


def tfenv_seed(seed: int) -> None:
    from . import tfenv

    tfenv.set_seed(seed)
