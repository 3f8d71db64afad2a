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
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from . import preserve
from .convert import convert_int8, convert_qat_int8, gzip_size, keras_accuracy, tflite_accuracy
from .data import Dataset, load_dataset
from .errors import InvalidInputError, UsageError
from .keras_model import (
    base_name,
    check_recurrent_layers,
    clone,
    conv1d_as_conv2d,
    fuse_separate_relu,
    init_activation_ranges,
    split_separable,
    inner,
    keras_weight_stats,
    load_model,
    quantize_for_qat,
    separate_kernel_outputs,
    separate_relu_layers,
    shape_only,
    unsupported_for_qat,
)
from .manifest import Metric, StageRecord
from .preserve import WeightStats, stats
from .recipe import LEAVES, NODES, QAT_NODES, Recipe, check_layers, nodes_for, stage_kind
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


@dataclass
class TrainingSet:
    """What one stage trains and selects on: the fine-tune split less a stratified hold-out."""

    x: np.ndarray
    y: np.ndarray  # integer labels (-1: unlabelled)
    teacher: np.ndarray | None  # the float baseline's log-probabilities, or None without distillation
    x_val: np.ndarray
    y_val: np.ndarray
    teacher_val: np.ndarray | None
    notes: list[str] = field(default_factory=list)

    @property
    def distill(self) -> bool:
        return self.teacher is not None

    def steps_per_epoch(self, batch_size: int) -> int:
        return max(1, math.ceil(len(self.x) / batch_size))


def training_set(data: Dataset, recipe: Recipe) -> TrainingSet:
    """Split the fine-tune samples into training and hold-out (seeded, stratified, labelled samples only)."""
    from .finetune import holdout_split

    teacher = getattr(data, "soft_targets", None) if recipe.distill else None
    notes = []
    if recipe.distill and teacher is None:
        notes.append("distillation requested but no soft targets were computed; trained on labels only")
    train_idx, val_idx = holdout_split(data.y_fit, recipe.validation_fraction, recipe.seed)
    if teacher is None:
        unlabelled = train_idx[data.y_fit[train_idx] < 0]
        if len(unlabelled):
            notes.append(f"{len(unlabelled)} unlabelled samples not used (they need distillation)")
            train_idx = train_idx[data.y_fit[train_idx] >= 0]
    if len(train_idx) == 0:
        raise InvalidInputError(f"{data.path}: no fine-tune sample is left to train on",
                                "give labelled samples, or turn distillation on for unlabelled ones")
    return TrainingSet(
        x=data.x_fit[train_idx], y=data.y_fit[train_idx],
        teacher=None if teacher is None else teacher[train_idx],
        x_val=data.x_fit[val_idx], y_val=data.y_fit[val_idx],
        teacher_val=None if teacher is None else teacher[val_idx], notes=notes,
    )


def _fit(env, model, data: Dataset, recipe: Recipe, kind: str, loss: Loss, title: str, callbacks=(), *,
         train_set: TrainingSet | None = None, eligible_from: int = 1, record: dict | None = None) -> dict:
    """Fine-tune ``model`` in place for one stage; returns (and fills ``record`` with) what was done.

    Distillation, the learning-rate schedule, frozen batch norm and best-epoch selection on the hold-out
    follow the recipe (see :mod:`edgedeploy.finetune`). ``eligible_from`` is the first epoch (1-based) the
    hold-out may select, e.g. the one where pruning reaches its target.
    """
    from .finetune import (batch_norm_wrapped, distillation_loss, learning_rate_at, pack_targets, schedule_object,
                           Selector, set_batch_norm_frozen, validation_callback)

    keras, tf = env.keras, env.tf
    settings = recipe.stage(kind)
    report: dict[str, Any] = record if record is not None else {}
    if settings.epochs == 0:
        report.update(epochs=0)
        return report
    ts = train_set or training_set(data, recipe)
    num_classes = int(model.output_shape[-1])
    steps = ts.steps_per_epoch(recipe.batch_size)
    total = steps * settings.epochs
    warmup = int(round(total * recipe.warmup_fraction))
    if recipe.lr_schedule == "constant" and warmup == 0:
        lr: Any = settings.learning_rate
    else:
        lr = schedule_object(keras, tf, base=settings.learning_rate, total_steps=total, schedule=recipe.lr_schedule,
                             warmup_steps=warmup)
    if ts.distill:
        train_loss = distillation_loss(tf, temperature=recipe.distill_temperature,
                                       label_weight=recipe.distill_label_weight, from_logits=loss.from_logits)
        y_train = pack_targets(ts.y, ts.teacher, num_classes)

        def accuracy(y_true, y_pred):
            label = tf.cast(y_true[:, 0], tf.int64)
            mask = tf.cast(label >= 0, tf.float32)
            hit = tf.cast(tf.equal(tf.argmax(y_pred, axis=-1), label), tf.float32)
            return tf.reduce_sum(hit * mask) / tf.maximum(tf.reduce_sum(mask), 1.0)

        metrics: list[Any] = [accuracy]
        val_loss = lambda out: float(train_loss(pack_targets(ts.y_val, ts.teacher_val, num_classes), out))  # noqa: E731
    else:
        train_loss = loss.build(keras)
        y_train = ts.y
        metrics = ["accuracy"]
        val_loss = lambda out: float(train_loss(ts.y_val, out))  # noqa: E731

    freeze_at = recipe.freeze_batch_norm_after if recipe.freeze_batch_norm else None
    if freeze_at is not None and freeze_at >= settings.epochs:
        freeze_at = None
    eligible_from = max(eligible_from, 1)
    curve: list[dict[str, Any]] = []
    selector = Selector(patience=recipe.patience if recipe.validation_fraction > 0 else 0, metric=recipe.selection_metric)
    validate = None
    if recipe.validation_fraction > 0 and len(ts.x_val):
        def on_epoch(epoch: int, logs: dict, row: dict) -> None:
            row.update(loss=round(float(logs.get("loss", math.nan)), 5),
                       accuracy=round(100 * float(logs.get("accuracy", math.nan)), 3),
                       learning_rate=float(f"{learning_rate_at(epoch * steps - 1, total, settings.learning_rate, recipe.lr_schedule, warmup):.3g}"))
            curve.append(row)
            log.info("%s epoch %d: val accuracy %.2f%% val loss %.4f%s", title, epoch, row["val_accuracy"],
                     row["val_loss"], "" if row["eligible"] else " (not selectable yet)")

        validate = validation_callback(
            keras, x_val=ts.x_val, y_val=ts.y_val, t_val=ts.teacher_val, loss_fn=lambda _p, out: val_loss(out),
            selector=selector, restore_best=recipe.restore_best, on_epoch=on_epoch,
            # an epoch counts once the technique is fully in place and batch norm is as it will stay
            eligible=lambda e: e >= eligible_from and (freeze_at is None or e > freeze_at))
    optimizer = keras.optimizers.Adam(lr)
    progress = _Progress(keras, title, settings.epochs, steps).callback()
    all_callbacks = [*callbacks, *([validate] if validate else []), progress]
    frozen = 0
    try:
        segments = [(0, settings.epochs)] if freeze_at in (None, 0) else [(0, freeze_at), (freeze_at, settings.epochs)]
        if freeze_at == 0:
            frozen = set_batch_norm_frozen(model, True)
        for i, (first, last) in enumerate(segments):
            if i == 1:
                frozen = set_batch_norm_frozen(model, True)
            model.compile(optimizer=optimizer, loss=train_loss, metrics=metrics)
            history = model.fit(ts.x, y_train, batch_size=recipe.batch_size, initial_epoch=first, epochs=last,
                                shuffle=True, verbose=0, callbacks=all_callbacks)
            if validate is None:
                for j, (l_, a_) in enumerate(zip(history.history.get("loss", []), history.history.get("accuracy", []))):
                    curve.append({"epoch": first + j + 1, "loss": round(float(l_), 5),
                                  "accuracy": round(100 * float(a_), 3)})
            if model.stop_training:
                break
        if validate is not None:
            validate.restore()
    finally:
        if frozen:
            set_batch_norm_frozen(model, False)
    ran = len(selector.history) if validate is not None else settings.epochs
    report.update({
        "epochs": settings.epochs,
        "epochs_run": ran,
        "train_samples": int(len(ts.x)),
        "unlabelled_samples": int(np.sum(ts.y < 0)),
        "validation_samples": int(len(ts.x_val)),
        "steps_per_epoch": steps,
        "batch_size": recipe.batch_size,
        "optimizer": "Adam",
        "learning_rate": {"peak": settings.learning_rate, "schedule": recipe.lr_schedule,
                          "warmup_steps": warmup, "total_steps": total},
        "distillation": ({"teacher": "baseline (float)", "temperature": recipe.distill_temperature,
                          "label_weight": recipe.distill_label_weight, "on": "log-probabilities"}
                         if ts.distill else None),
        "batch_norm": ("statistics frozen from the start" if freeze_at == 0 else
                       f"trained for {freeze_at} epochs, then statistics frozen" if freeze_at else
                       "trained (batch statistics, moving averages updated)")
        + (f" ({frozen} layers; " + ("scale and offset still trained inside TFMOT's quantize wrappers)"
                                     if batch_norm_wrapped(model) else "scale and offset frozen too)") if frozen else ""),
        "selection": None if validate is None else {
            "metric": ("hold-out loss" + (" (distillation)" if ts.distill else " (cross-entropy)")
                       if recipe.selection_metric == "loss" else "hold-out accuracy (ties: lower hold-out loss)"),
            "hold_out": f"{recipe.validation_fraction:.0%} of the fine-tune split, stratified, seed {recipe.seed}",
            "selectable_from_epoch": max(eligible_from, (freeze_at or 0) + 1),
            "best_epoch": selector.best_epoch,
            "best_val_accuracy": None if selector.best is None else round(selector.best[0], 3),
            "best_val_loss": None if selector.best is None else round(selector.best[1], 5),
            "restored_best": bool(recipe.restore_best and selector.best_epoch is not None),
            "stopped_early": bool(validate.stopped_early),
            "patience": recipe.patience,
        },
        "curve": curve,
        "notes": ts.notes,
    })
    return report


def _optimizable(layer, recipe: Recipe) -> bool:
    kind = inner(layer).__class__.__name__
    return kind in ("Conv2D", "Dense") and base_name(layer.name) not in recipe.skip_layers


# --------------------------------------------------------------------------- techniques


def prune(env, parent, data: Dataset, recipe: Recipe, loss: Loss, *, record: dict | None = None):
    from .finetune import pruning_plan

    keras, sparsity = env.keras, env.tfmot.sparsity.keras
    settings = recipe.stage("prune")
    if settings.epochs < 1:
        raise UsageError("pruning needs at least one epoch of fine-tuning", "set [stages.prune] epochs >= 1")
    ts = training_set(data, recipe)
    plan = pruning_plan(recipe.pruning_schedule, ts.steps_per_epoch(recipe.batch_size), settings.epochs,
                        recipe.pruning_end_fraction)
    if plan.kind == "polynomial":
        schedule = sparsity.PolynomialDecay(initial_sparsity=0.0, final_sparsity=recipe.sparsity,
                                            begin_step=plan.begin_step, end_step=plan.end_step,
                                            frequency=plan.frequency)
    else:
        schedule = sparsity.ConstantSparsity(recipe.sparsity, begin_step=plan.begin_step, frequency=plan.frequency)

    def wrap(layer):
        if _optimizable(layer, recipe):
            return sparsity.prune_low_magnitude(layer, pruning_schedule=schedule)
        return layer

    model = keras.models.clone_model(clone(parent), clone_function=wrap)
    report = _fit(env, model, data, recipe, "prune", loss, "prune", callbacks=[sparsity.UpdatePruningStep()],
                  train_set=ts, eligible_from=plan.full_epoch, record=record)
    report["pruning"] = {"target_sparsity": recipe.sparsity, **plan.to_dict()}
    return sparsity.strip_pruning(model)


def cluster(env, parent, data: Dataset, recipe: Recipe, loss: Loss, preserve_sparsity: bool, *,
            record: dict | None = None):
    from tensorflow_model_optimization.python.core.clustering.keras.cluster_config import GradientAggregation

    keras, clustering = env.keras, env.tfmot.clustering.keras
    aggregation = {"sum": GradientAggregation.SUM, "avg": GradientAggregation.AVG}[recipe.cluster_gradient_aggregation]
    init = {
        "kmeans++": clustering.CentroidInitialization.KMEANS_PLUS_PLUS,
        "linear": clustering.CentroidInitialization.LINEAR,
        "density": clustering.CentroidInitialization.DENSITY_BASED,
        "random": clustering.CentroidInitialization.RANDOM,
    }[recipe.centroid_init]

    def wrap(layer):
        if _optimizable(layer, recipe):
            kwargs = {"preserve_sparsity": preserve_sparsity, "cluster_gradient_aggregation": aggregation}
            if recipe.per_channel_clusters and inner(layer).__class__.__name__ == "Conv2D":
                kwargs["cluster_per_channel"] = True
            return clustering.cluster_weights(layer, number_of_clusters=recipe.clusters,
                                              cluster_centroids_init=init, **kwargs)
        return layer

    model = keras.models.clone_model(clone(parent), clone_function=wrap)
    report = _fit(env, model, data, recipe, "cluster", loss, "cluster", record=record)
    report["clustering"] = {"clusters": recipe.clusters, "centroid_init": recipe.centroid_init,
                            "preserve_sparsity": preserve_sparsity, "per_channel": recipe.per_channel_clusters,
                            "centroid_gradient": recipe.cluster_gradient_aggregation,
                            "centroid_learning_rate": "the stage's (TFMOT 0.8.1 has no separate centroid rate)"}
    return clustering.strip_clustering(model)


def qat_model(env, parent, node: str):
    """The QAT model of ``node`` built from its (float) parent, before training."""
    if node == "qat":
        return quantize_for_qat(clone(parent), what=f"stage {node}")
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
    model, _ = separate_kernel_outputs(clone(parent))  # (else TFMOT's Concatenate and ReLU transforms drop the scheme)
    return quantize_for_qat(model, scheme, what=f"stage {node}")


def settle_cluster_weights(model) -> int:
    """Set each cluster-preserving QAT kernel to exactly its centroids; returns how many kernels were set.

    In training, TFMOT's (P)CQAT quantizer assigns the clustered weights (centroids gathered by the indices
    of the nearest centroid to the original weights) to the layer's kernel on every forward pass, but inside
    ``model.fit`` the kernel variable also takes an optimizer step after that assignment, so after training
    it holds the clustered values plus one step (about one learning rate) of drift: more distinct values than
    clusters, which int8 rounding can keep. The int8 model is converted from that kernel, so it is set back to
    the centroids here, from the final centroids and original weights, as the training forward pass does.
    """
    from tensorflow_model_optimization.python.core.quantization.keras.collab_opts.cluster_preserve import (
        cluster_preserve_quantize_registry as registry,
    )

    from . import tfenv

    tf = tfenv.load().tf
    settled = 0
    for layer in model.layers:
        for weight, _quantizer, qvars in getattr(layer, "_weight_vars", []):
            if not isinstance(qvars, dict) or registry.CLUSTER_CENTROIDS not in qvars:
                continue
            impl = qvars[registry.CLUSTERING_IMPL]
            original = qvars[registry.ORIGINAL_WEIGHTS]
            if registry.SPARSITY_MASK in qvars:
                original.assign(original * qvars[registry.SPARSITY_MASK])
                if qvars.get(registry.CENTROIDS_MASK) is not None:
                    impl.cluster_centroids.assign(impl.cluster_centroids * qvars[registry.CENTROIDS_MASK])
            indices = impl.get_pulling_indices(original)
            qvars[registry.PULLING_INDICES].assign(tf.cast(indices, qvars[registry.PULLING_INDICES].dtype))
            weight.assign(impl.get_clustered_weight(qvars[registry.PULLING_INDICES], original))
            settled += 1
    return settled


def start_qat_ranges(model, parent, data: Dataset, recipe: Recipe, details: dict[str, Any]) -> None:
    """Start the QAT model's activation ranges from its float parent on the fine-tune samples (recipe
    ``qat_ranges = "calibrated"``), or leave TFMOT's [-6, 6] (``"tfmot"``); see
    :func:`edgedeploy.keras_model.init_activation_ranges`."""
    if recipe.qat_ranges == "calibrated":
        count = init_activation_ranges(model, parent, data.x_fit, recipe.batch_size)
        details["qat_ranges"] = (f"{count} activation ranges started from the float parent on the "
                                 f"{len(data.x_fit)} fine-tune samples")
    else:
        details["qat_ranges"] = "TFMOT's start of [-6, 6]"


def load_qat(env, parent_path: Path, weights_path: Path, node: str):
    parent = env.keras.models.load_model(parent_path, compile=False)
    model = qat_model(env, parent, node)
    model.load_weights(weights_path)
    return model


# --------------------------------------------------------------------------- preservation


def _int8_stats(model_bytes: bytes, keras_stats: list[WeightStats], tmp: Path,
                layer_names: Iterable[str] = ()) -> list[WeightStats]:
    """Weight statistics of the int8 TFLite, each tensor matched to its Keras layer by name and shape.

    A tensor whose name matches no layer with statistics is matched by kind and size, unless it names another
    layer of the model (``layer_names``; e.g. the two kernels of a SeparableConv2D, which has no statistics).
    """
    from .tflite_model import read_weight_tensors

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
    executor: str = "local",
    ray_address: str | None = None,
) -> OptimizeOutcome:
    """Run the nodes the requested leaves need, then convert and score every leaf.

    ``executor="ray"`` runs each stage's work as a Ray task (:mod:`edgedeploy.ray_stages`); the results and the
    run folder are the same as a local run's."""
    from . import tfenv

    model_path, data_path = Path(model_path), Path(data_path)
    if executor not in ("local", "ray"):
        raise UsageError(f"--executor is '{executor}'", "use local or ray")
    env = tfenv.load()
    # Check every input before anything is written.
    model, info = load_model(model_path, trust_lambda)
    check_recurrent_layers(model, model_path, recipe.leaves, [leaf for leaf in LEAVES if LEAVES[leaf] in QAT_NODES])
    check_layers(recipe, [layer.name for layer in model.layers] + [f"{layer.name}_depthwise" for layer in model.layers
                                                                   if type(layer).__name__ == "SeparableConv2D"],
                 str(model_path))
    num_classes = int(model.output_shape[-1])
    data = load_dataset(data_path, tuple(model.input_shape[1:]), num_classes)
    if data.reshaped_from:
        log.warning("%s: samples reshaped from %s to the model input %s", data_path, list(data.reshaped_from),
                    list(model.input_shape[1:]))
    loss = training_loss(model, info.training_config)
    from .fitlength import stretch, train_samples

    recipe, fit_length = stretch(recipe, train_samples(data.y_fit, recipe))  # at least min_steps per stage
    if recipe.distill and any(NODES[n][1] for n in nodes_for(list(recipe.leaves))):
        data.soft_targets = teacher_targets(model, data.x_fit, loss.from_logits)
    ctx = RunContext.open(out)
    ctx.manifest.tools.update(env.versions)
    ctx.manifest.info["optimize"] = {
        "model": str(model_path.resolve()),
        "data": data.describe(),
        "recipe": recipe.to_dict(),
        "fit_length": fit_length,
        "loss": {"name": loss.name, "from_logits": loss.from_logits, "source": loss.source},
    }
    ctx.manifest.save()
    outcome = OptimizeOutcome(ctx.run_dir)
    versions = dict(env.versions)
    paths: dict[str, Path] = {}
    remote = None
    if executor == "ray":
        from .ray_stages import RayStages

        remote = RayStages(ray_address)

    def work(fn, *args):  # a stage's work: here, or as a Ray task
        return fn(env, *args) if remote is None else remote.call(fn, *args)

    try:
        for node in nodes_for(list(recipe.leaves)):
            parent = NODES[node][0]
            inputs = {"data": data_path, "model": model_path if parent is None else paths[parent]}
            if NODES[node][1] == "palette" and recipe.palette.get("size_budget") is not None:
                inputs["baseline_model"] = paths["baseline"]  # the size budget is a fraction of its ptq leaf's
            spec = StageSpec("optimize", node, parent=f"optimize/{parent}" if parent else None,
                             params=recipe.node_params(node), tool_versions=versions)
            rec = run_stage(ctx, spec, inputs, lambda d, n=node, i=inputs: work(
                _train_node, n, i, d, data, recipe, loss, trust_lambda), reuse=reuse)
            outcome.nodes[node] = rec
            paths[node] = ctx.manifest.resolve(rec.outputs[0])
        for leaf in recipe.leaves:
            node = LEAVES[leaf]
            inputs = {"data": data_path, "model": paths[node]}
            if node in QAT_NODES:
                inputs["parent_model"] = paths[NODES[node][0]]
            params = {"float_io": recipe.float_io, "calibration_samples": recipe.calibration_samples,
                      "calibration_choice": "random",
                      "sparsity": recipe.sparsity, "clusters": recipe.clusters, "tolerance": recipe.sparsity_tolerance,
                      "skip_layers": list(recipe.skip_layers), "per_channel_clusters": recipe.per_channel_clusters}
            spec = StageSpec("convert", leaf, parent=f"optimize/{node}", params=params, tool_versions=versions)
            rec = run_stage(ctx, spec, inputs, lambda d, l=leaf, i=inputs: work(_convert_leaf, l, i, d, data, recipe),
                            reuse=reuse)
            outcome.leaves[leaf] = rec
    finally:
        if remote is not None:
            remote.close()
    return outcome


def teacher_targets(model, x: np.ndarray, from_logits: bool) -> np.ndarray:
    """The float model's log-probabilities on ``x`` (inference mode): the soft targets of distillation."""
    from .finetune import log_probs

    return log_probs(model.predict(x, batch_size=256, verbose=0), from_logits)


def _train_node(env, node: str, inputs: dict[str, Path], out: Path, data: Dataset, recipe: Recipe, loss: Loss,
                trust_lambda: bool) -> StageResult:
    if NODES[node][1] in ("palette", "palette_qat"):  # palette-aware nodes (edgedeploy.palette)
        from . import palette

        return palette.train_node(env, node, inputs, out, data, recipe, loss)
    tfenv_seed(recipe.seed)
    t0 = time.perf_counter()
    details: dict[str, Any] = {}
    warnings: list[str] = []
    training: dict[str, Any] = {}
    if node == "baseline":
        model, _ = load_model(inputs["model"], trust_lambda)
        # TFMOT prunes a SeparableConv2D's pointwise kernel but has no QAT config for it (PQAT/PCQAT would then
        # train it freely and lose its zeros and clusters): the tree works on the two layers it computes
        model, split = split_separable(model)
        if split:
            details["split_separable"] = split
            log.info("split %s into a DepthwiseConv2D (NAME_depthwise) and a 1x1 Conv2D each", ", ".join(split))
        # nor has TFMOT a QAT config for Conv1D, and the palette leaves know 2-D kernels: the tree works on the
        # Conv2D each one computes (the converter writes it as one anyway)
        model, as_2d = conv1d_as_conv2d(model)
        if as_2d:
            details["conv1d_as_conv2d"] = as_2d
            log.info("rewrote %s as Conv2D layers between reshapes (NAME_2d, NAME_1d)", ", ".join(as_2d))
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
            result_model = prune(env, parent, data, recipe, loss, record=training)
        elif node == "clustered":
            result_model = cluster(env, parent, data, recipe, loss, preserve_sparsity=False, record=training)
        elif node == "pruned_clustered":
            result_model = cluster(env, parent, data, recipe, loss, preserve_sparsity=True, record=training)
        else:
            result_model = qat_model(env, parent, node)
            start_qat_ranges(result_model, parent, data, recipe, details)
            unquantized = unsupported_for_qat(parent)
            if unquantized:
                details["qat_unquantized_layers"] = unquantized
                # reshapes and max poolings only move values and keep their input's scale: nothing to say
                computing = [n for n in unquantized if not shape_only(parent.get_layer(n))]
                if computing:
                    warnings.append(f"{', '.join(computing)}: TFMOT has no QAT config for these layers; only their "
                                    "outputs are fake-quantized in training, and the int8 converter quantizes the rest")
            _fit(env, result_model, data, recipe, "qat", loss, node, record=training)
            if node in preserve.QAT_CLUSTER_NODES:
                training["cluster_kernels_settled"] = settle_cluster_weights(result_model)
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
    if training:
        details["training"] = training
        warnings += [n for n in training.get("notes", [])]
    return StageResult(outputs={"keras_model" if node not in QAT_NODES else "qat_weights": target}, metrics=metrics,
                       details=details, warnings=warnings)


def leaf_int8(model, qat: bool, leaf: str, data: Dataset, recipe: Recipe) -> tuple[float, bytes, str | None]:
    """A leaf's float accuracy on the evaluation split, its full-int8 TFLite, and what calibrated it (PTQ: the
    calibration samples; QAT: see :func:`~edgedeploy.convert.convert_qat_int8`)."""
    float_acc = keras_accuracy(model, data.x_eval, data.y_eval)
    if qat:
        int8, calibrated_on = convert_qat_int8(
            model, lambda: data.calibration(recipe.calibration_samples, recipe.seed), recipe.float_io, f"leaf {leaf}")
    else:
        calibration, calibrated_on = data.calibration(recipe.calibration_samples, recipe.seed)
        int8 = convert_int8(model, calibration, float_io=recipe.float_io, source=f"leaf {leaf}")
    return float_acc, int8, calibrated_on


def _convert_leaf(env, leaf: str, inputs: dict[str, Path], out: Path, data: Dataset, recipe: Recipe) -> StageResult:
    if NODES[LEAVES[leaf]][1] in ("palette", "palette_qat"):  # palette-aware leaves (edgedeploy.palette)
        from . import palette

        return palette.convert_leaf(env, leaf, inputs, out, data, recipe)
    tfenv_seed(recipe.seed)
    t0 = time.perf_counter()
    node = LEAVES[leaf]
    if node in QAT_NODES:
        model = load_qat(env, inputs["parent_model"], inputs["model"], node)
    else:
        model = env.keras.models.load_model(inputs["model"], compile=False)
    float_acc, int8, calibrated_on = leaf_int8(model, node in QAT_NODES, leaf, data, recipe)
    target = out / INT8_MODEL
    target.write_bytes(int8)
    int8_acc = tflite_accuracy(int8, data.x_eval, data.y_eval)
    keras_stats = keras_weight_stats(model)
    int8_stats = _int8_stats(int8, keras_stats, out, [layer.name for layer in model.layers])
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
            "calibration": calibrated_on,
            "accuracy_split": data.describe()["eval_split"],
            "float_io": recipe.float_io,
        },
        warnings=verdict.warnings,
    )


def tfenv_seed(seed: int) -> None:
    from . import tfenv

    tfenv.set_seed(seed)
