"""What the user asks the optimization stages to do: leaves, sparsity, clusters, training settings.

A recipe comes from a TOML file (``--recipe``) and/or command-line flags (flags win). Values are checked on
load; a bad value names the file, the key and the allowed values.
"""

from __future__ import annotations

import difflib
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Mapping

from edgedeploy.errors import TargetError, UsageError
from edgedeploy.config.keys import Key, check_value, read_toml, validate
from edgedeploy.config.tree import (
    DEFAULT_LEAVES,
    LEAVES,
    NODE_TABLE,
    NODES,
    NOT_NPU_FORMATS,
    PATTERNS,
    QAT_NODES,
    THINNED_NODES,
    nodes_for,
    stage_kind,
)

# quantizations that are not NPU formats: asking for them as a leaf gets the reason
NOT_NPU_LEAVES = {"float16": "float16", "ptq_float16": "float16", "fp16": "float16",
                  "dynamic_range": "dynamic_range", "ptq_dynamic_range": "dynamic_range", "dynamic": "dynamic_range"}
STAGE_KINDS = ("prune", "cluster", "qat", "thin")
SCHEDULES = ("constant", "polynomial")
CENTROID_INITS = ("kmeans++", "linear", "density", "random")
LR_SCHEDULES = ("cosine", "constant")
GRADIENT_AGGREGATIONS = ("sum", "avg")
QAT_RANGES = ("calibrated", "tfmot")  # where QAT's activation ranges start (keras_model.init_activation_ranges)
SELECTION_METRICS = ("loss", "accuracy")  # the same as edgedeploy.optimize.finetune.loop.SELECTION_METRICS
# `plain = true`: TFMOT's plain fine-tuning recipe (no distillation, one-shot constant sparsity, constant
# learning rate, batch norm trained, no hold-out, QAT ranges from TFMOT's [-6, 6]). Keys given explicitly still win.
PLAIN: dict[str, Any] = {
    "distill": False,
    "pruning_schedule": "constant",
    "lr_schedule": "constant",
    "warmup_fraction": 0.0,
    "freeze_batch_norm": False,
    "validation_fraction": 0.0,
    "patience": 0,
    "restore_best": False,
    "learning_rate": 1e-4,
    "batch_size": 64,
    "epochs": 4,
    "qat_ranges": "tfmot",
    "min_steps": 0,
}


# --------------------------------------------------------------------------- palette-aware leaves

PALETTE_EXECUTORS = ("process", "ray")
PALETTE_MEASURE_ON = ("holdout", "fine-tune")
# [palette] keys with a fixed set of values, and the defaults of the keys the palette node's cache key names
PALETTE_CHOICES: dict[str, tuple[str, ...]] = {
    "executor": PALETTE_EXECUTORS, "measure_on": PALETTE_MEASURE_ON, "budget_from": ("parent", "palette"),
    "projection": ("gptq", "nearest"), "drop_estimate": ("loss", "accuracy"), "scales": ("peak", "fitted"),
}
PALETTE_DEFAULTS = {"projection": "gptq", "drop_estimate": "loss", "scales": "peak"}
# The palette plan file's format (edgedeploy.optimize.palette.stages.PLAN_FILE). 2: it records the batch-norm factors folded into each
# kernel, which palette QAT trains in. Part of the palette nodes' cache key, so older run folders are redone.
PALETTE_PLAN_VERSION = 2


# The recipe's keys: a recipe file holds these, a project file the same under [recipe].
# A bound that keeps a typo (an extra digit or ten) from starting a run that never ends.
MAX_EPOCHS = 10_000
RECIPE_KEYS: tuple[Key, ...] = (
    Key("leaves", list, list(DEFAULT_LEAVES), "the leaves of the deployment tree to convert", items=str,
        choices=tuple(LEAVES)),
    Key("sparsity", float, 0.5, "fraction of each prunable kernel set to zero", minimum=0, maximum=1,
        exclusive_minimum=True, exclusive_maximum=True),
    Key("sparsity_pattern", str, "unstructured", "unstructured, or 2:4: two zeros in every four input channels "
        "(Ethos-U85 skips them)", choices=PATTERNS),
    Key("clusters", int, 16, "distinct values per clustered kernel", minimum=2, maximum=256),
    Key("per_channel_clusters", bool, False, "cluster each output channel of a Conv2D on its own (a kernel whose "
        "channels hold too few weights is clustered per tensor)"),
    Key("epochs", int, 4, "fine-tuning epochs of every trained stage", minimum=0, maximum=MAX_EPOCHS),
    Key("batch_size", int, 32, "fine-tuning batch size", minimum=1, maximum=2**16),
    Key("learning_rate", float, 5e-4, "peak learning rate of the fine-tuning schedule", minimum=0,
        exclusive_minimum=True),
    Key("seed", int, 0, "seed of every random choice (data order, initialisation, calibration samples)",
        minimum=0, maximum=2**32 - 1),
    Key("skip_layers", list, [], "layers left unpruned and unclustered", items=str),
    Key("float_io", bool, False, "keep float32 model inputs and outputs (int8 inside)"),
    Key("calibration_samples", int, 500, "fine-tune samples (seeded random choice) that calibrate int8 ranges",
        minimum=1, maximum=10**7),
    Key("sparsity_tolerance", float, 0.02, "sparsity a stage may lose below its target before it fails",
        minimum=0, maximum=1, exclusive_maximum=True),
    Key("fuse_relu", bool, True, "fold a separate ReLU after a Conv/Dense layer into that layer"),
    Key("plain", bool, False, "TFMOT's plain fine-tuning recipe for every key not given"),
    Key("loss", str, "", "a Keras built-in loss to fine-tune with (empty: the model's compile config, else from "
        "the data)"),
    Key("metric", str, "", "the metric leaves are judged by: accuracy, top5_accuracy, mse, mae, psnr, auc or "
        "module:function (empty: from the task)"),
    Key("pruning.schedule", str, "polynomial", "how sparsity rises during pruning", choices=SCHEDULES,
        field="pruning_schedule"),
    Key("pruning.end_fraction", float, 0.6, "fraction of the pruning steps after which the target is reached",
        minimum=0, maximum=1, exclusive_minimum=True, field="pruning_end_fraction"),
    Key("clustering.centroid_init", str, "kmeans++", "how cluster centroids start", choices=CENTROID_INITS,
        field="centroid_init"),
    Key("clustering.gradient_aggregation", str, "sum", "how centroid gradients are combined",
        choices=GRADIENT_AGGREGATIONS, field="cluster_gradient_aggregation"),
    Key("distillation.enabled", bool, True, "train against the parent's outputs as well as the labels",
        field="distill"),
    Key("distillation.temperature", float, 4.0, "softmax temperature of distillation", minimum=0,
        exclusive_minimum=True, field="distill_temperature"),
    Key("distillation.label_weight", float, 0.5, "weight of the labels against the parent's outputs", minimum=0,
        maximum=1, field="distill_label_weight"),
    Key("training.lr_schedule", str, "cosine", "learning-rate schedule", choices=LR_SCHEDULES,
        field="lr_schedule"),
    Key("training.warmup_fraction", float, 0.1, "fraction of the steps spent warming up the learning rate",
        minimum=0, maximum=1, exclusive_maximum=True, field="warmup_fraction"),
    Key("training.freeze_batch_norm", bool, True, "keep batch-norm statistics fixed while fine-tuning",
        field="freeze_batch_norm"),
    Key("training.freeze_batch_norm_after", int, 0, "epochs of batch-norm training before it is frozen",
        minimum=0, maximum=MAX_EPOCHS, field="freeze_batch_norm_after"),
    Key("training.qat_ranges", str, "calibrated", "where QAT's activation ranges start", choices=QAT_RANGES,
        field="qat_ranges"),
    Key("training.min_steps", int, 300, "optimizer steps each trained stage takes at least; epochs are added on "
        "little data (0: epochs as given)", minimum=0, maximum=10**7, field="min_steps"),
    Key("data.preprocess", str, "", "module:function (or file.py:function) run on every sample before fine-tuning, "
        "calibration, evaluation and golden vectors (runs that code; empty: none)", field="preprocess"),
    Key("data.eval_fraction", float, 0.2, "share of each class held out (seeded) for evaluation when the data has no "
        "split of its own (a class folder without train/ and test/, arrays in Python)", minimum=0, maximum=1, exclusive_minimum=True,
        exclusive_maximum=True, field="eval_fraction"),
    Key("data.sample_rate", int, 16000, "WAV files are resampled to this rate (Hz)", minimum=1000, maximum=384000,
        field="sample_rate"),
    Key("data.clip_seconds", float, 1.0, "WAV clips are cut or zero-padded to this length (s)", minimum=0,
        maximum=3600, exclusive_minimum=True, field="clip_seconds"),
    Key("data.interpolation", str, "bilinear", "how images are resized to the model input (Keras' methods)",
        choices=("bilinear", "nearest", "bicubic", "area", "lanczos3", "lanczos5", "gaussian", "mitchellcubic"),
        field="interpolation"),
    Key("data.crop_to_aspect_ratio", bool, False, "centre-crop images to the model input's aspect ratio before "
        "resizing", field="crop_to_aspect_ratio"),
    Key("data.max_samples", int, 1_000_000, "most samples read from a tf.data dataset given in Python: one of "
        "unknown length is read up to here (the manifest says so), a longer one of known length is refused",
        minimum=1, maximum=10**8, field="max_samples"),
    Key("jobs", int, 1, "stages of the tree (train a node, convert a leaf) run at once, each in its own worker "
        "process with its share of the cores (1: one at a time, in this process)", minimum=1, maximum=64),
    Key("selection.validation_fraction", float, 0.1, "fine-tune data held out to pick the best epoch (0: off)",
        minimum=0, maximum=0.5, exclusive_maximum=True, field="validation_fraction"),
    Key("selection.patience", int, 3, "epochs without improvement before stopping (0: never)", minimum=0,
        maximum=MAX_EPOCHS, field="patience"),
    Key("selection.restore_best", bool, True, "keep the best epoch's weights", field="restore_best"),
    Key("selection.metric", str, "loss", "what picks the best epoch", choices=SELECTION_METRICS,
        field="selection_metric"),
    *(Key(f"stages.{kind}.epochs", int, None, f"epochs of the {kind} stages (default: epochs)", minimum=0,
          maximum=MAX_EPOCHS)
      for kind in STAGE_KINDS),
    *(Key(f"stages.{kind}.learning_rate", float, None, f"learning rate of the {kind} stages (default: "
          "learning_rate)", minimum=0, exclusive_minimum=True) for kind in STAGE_KINDS),
    Key("layers.*.clusters", int, None, "palette values of this layer (Vela's palette holds at most 32)",
        minimum=2, maximum=32),
    Key("layers.*.sparsity", float, None, "sparsity of this layer in the palette leaves", minimum=0, maximum=1,
        exclusive_maximum=True),
    Key("thin_speedup", float, 0.75, "NPU cycles of the thinned leaves as a fraction of the full model's (ptq), "
        "on every thin target (with sparsity_pattern 2:4: of the thinned model pruned 2:4)", minimum=0, maximum=1,
        exclusive_minimum=True),
    Key("thin_targets", list, ["ethos-u55-128"], "targets whose Vela cycles choose the thinned widths (built-in "
        "names or target .toml files; at least one)", items=str),
    Key("thin_max_npu_cycles", int, 0, "NPU cycles the thinned leaves may take on each thin target (0: none)",
        minimum=0),
    Key("thin_max_latency_ms", float, 0.0, "latency the thinned leaves may take on each thin target (0: none)",
        minimum=0),
    Key("thin_candidates", int, 5, "candidate widths of each group the thinned width search compiles: 5 (1, 7/8, "
        "3/4, 5/8, 1/2 of its width: 25 grid models), 3 (1, 3/4, 1/2: 9) or 2 (1, 1/2: 4)", choices=(5, 3, 2)),
    Key("thin_trials", int, 0, "width choices fine-tuned for thin_trial_epochs before the thinned node's own "
        "fine-tuning: the search's choice and, for each group, the best choice within the budget that gives it "
        "another width; the one of least hold-out loss is kept where it beats the search's by more than two "
        "standard errors (0: the search's choice, untried)", minimum=0, maximum=32),
    Key("thin_trial_epochs", int, 2, "epochs of each thin_trials fine-tuning", minimum=1, maximum=MAX_EPOCHS),
    Key("thin_augment", str, "none", "extra fine-tuning samples of the thinned node and the nodes below it, "
        "distilled from the float model: none, or hflip (each image also mirrored left to right)",
        choices=("none", "hflip")),
    Key("palette.search", bool, False, "run the per-layer sensitivity sweep"),
    Key("palette.accuracy_budget", float, None, "accuracy points the sweep may lose", minimum=0, maximum=100,
        exclusive_maximum=True),
    Key("palette.holdout", float, None, "fraction of the fine-tune data the sweep measures on", minimum=0,
        maximum=0.5, exclusive_maximum=True),
    Key("palette.clusters", list, None, "palette sizes the sweep tries", items=int, minimum=2, maximum=32),
    Key("palette.sparsities", list, None, "sparsities the sweep tries", items=float, minimum=0, maximum=1,
        exclusive_maximum=True),
    Key("palette.executor", str, "process", "where sweep jobs run", choices=PALETTE_EXECUTORS),
    Key("palette.workers", int, None, "sweep worker processes", minimum=1, maximum=256),
    Key("palette.target", str, None, "target whose Vela encoding sizes the sweep's layers"),
    Key("palette.measure_on", str, None, "data the sweep measures on", choices=PALETTE_MEASURE_ON),
    Key("palette.measure_samples", int, None, "samples per sweep measurement", minimum=100),
    Key("palette.budget_from", str, None, "what the accuracy budget is measured from",
        choices=PALETTE_CHOICES["budget_from"]),
    Key("palette.projection", str, "gptq", "how kernels snap to their palette", choices=PALETTE_CHOICES["projection"]),
    Key("palette.hessian_samples", int, None, "samples for the projection's Hessians", minimum=16),
    Key("palette.drop_estimate", str, "loss", "what estimates a layer's accuracy drop",
        choices=PALETTE_CHOICES["drop_estimate"]),
    Key("palette.size_budget", float, None, "fraction of the ptq leaf's encoded weights to fit (needs search)",
        minimum=0, maximum=1, exclusive_minimum=True),
    Key("palette.scales", str, "peak", "how each channel's scale is chosen", choices=PALETTE_CHOICES["scales"]),
)
_KEYS_BY_PATH = {k.path: k for k in RECIPE_KEYS}
# The keys that set a field of Recipe (the [stages], [layers.NAME] and [palette] tables are read into mappings).
_FIELD_KEYS = {k.name: k for k in RECIPE_KEYS if not k.path.startswith(("stages.", "layers.", "palette."))}


def _default(name: str) -> Any:
    """The default of the Recipe field ``name``: the one its key in :data:`RECIPE_KEYS` gives (a list as a tuple)."""
    value = _FIELD_KEYS[name].default
    return tuple(value) if isinstance(value, list) else value


@dataclass(frozen=True)
class StageSettings:
    epochs: int
    learning_rate: float


@dataclass(frozen=True)
class Recipe:
    """What the user asks the optimization stages to do. Every default is its key's in :data:`RECIPE_KEYS` (the
    one place defaults are written; the command-line help and the recipe reference read them there too)."""

    leaves: tuple[str, ...] = _default("leaves")
    sparsity: float = _default("sparsity")
    sparsity_pattern: str = _default("sparsity_pattern")  # or "2:4" (Ethos-U85 structured sparsity; edgedeploy.config.pattern)
    clusters: int = _default("clusters")
    per_channel_clusters: bool = _default("per_channel_clusters")
    epochs: int = _default("epochs")
    batch_size: int = _default("batch_size")
    learning_rate: float = _default("learning_rate")  # the peak of the warm-up/cosine schedule (PLAIN: constant 1e-4)
    seed: int = _default("seed")
    pruning_schedule: str = _default("pruning_schedule")
    pruning_end_fraction: float = _default("pruning_end_fraction")
    centroid_init: str = _default("centroid_init")
    cluster_gradient_aggregation: str = _default("cluster_gradient_aggregation")
    skip_layers: tuple[str, ...] = _default("skip_layers")
    stage_epochs: Mapping[str, int] = field(default_factory=dict)
    stage_learning_rates: Mapping[str, float] = field(default_factory=dict)
    float_io: bool = _default("float_io")
    calibration_samples: int = _default("calibration_samples")
    sparsity_tolerance: float = _default("sparsity_tolerance")
    fuse_relu: bool = _default("fuse_relu")
    # fine-tuning with little data (see edgedeploy.optimize.finetune.loop)
    plain: bool = _default("plain")
    distill: bool = _default("distill")
    distill_temperature: float = _default("distill_temperature")
    distill_label_weight: float = _default("distill_label_weight")
    lr_schedule: str = _default("lr_schedule")
    warmup_fraction: float = _default("warmup_fraction")
    freeze_batch_norm: bool = _default("freeze_batch_norm")
    freeze_batch_norm_after: int = _default("freeze_batch_norm_after")
    validation_fraction: float = _default("validation_fraction")
    patience: int = _default("patience")
    restore_best: bool = _default("restore_best")
    selection_metric: str = _default("selection_metric")
    qat_ranges: str = _default("qat_ranges")
    # each trained stage takes at least this many optimizer steps: on little data, epochs are added
    # (edgedeploy.optimize.finetune.length; the default is chosen from measurements in docs/walk.md)
    min_steps: int = _default("min_steps")
    # stages of the tree (train a node, convert a leaf) run at once in worker processes; 1: one at a time, in this
    # process (edgedeploy.pipeline.runners.local; docs/optimize.md has the measurements behind the default)
    jobs: int = _default("jobs")
    # the task (edgedeploy.config.task): a Keras built-in loss and a metric; empty: from the model and the data
    loss: str = _default("loss")
    metric: str = _default("metric")
    # palette-aware leaves (edgedeploy.optimize.palette): per-layer settings ([layers.NAME]) and the sweep ([palette])
    layers: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    palette: Mapping[str, Any] = field(default_factory=dict)
    # how a data folder or a preprocessing function becomes samples (edgedeploy.data_sources)
    preprocess: str = _default("preprocess")
    eval_fraction: float = _default("eval_fraction")
    sample_rate: int = _default("sample_rate")
    clip_seconds: float = _default("clip_seconds")
    interpolation: str = _default("interpolation")
    crop_to_aspect_ratio: bool = _default("crop_to_aspect_ratio")
    max_samples: int = _default("max_samples")
    # thinned leaves (edgedeploy.optimize.techniques.thin): the NPU cycle budget their widths are chosen for, and where
    thin_speedup: float = _default("thin_speedup")
    thin_targets: tuple[str, ...] = _default("thin_targets")
    thin_max_npu_cycles: int = _default("thin_max_npu_cycles")
    thin_max_latency_ms: float = _default("thin_max_latency_ms")
    thin_candidates: int = _default("thin_candidates")
    thin_trials: int = _default("thin_trials")
    thin_trial_epochs: int = _default("thin_trial_epochs")
    thin_augment: str = _default("thin_augment")

    def stage(self, kind: str) -> StageSettings:
        return StageSettings(
            epochs=int(self.stage_epochs.get(kind, self.epochs)),
            learning_rate=float(self.stage_learning_rates.get(kind, self.learning_rate)),
        )

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["leaves"] = list(self.leaves)
        d["skip_layers"] = list(self.skip_layers)
        d["thin_targets"] = list(self.thin_targets)
        d["stage_epochs"] = dict(self.stage_epochs)
        d["stage_learning_rates"] = dict(self.stage_learning_rates)
        return d

    def node_params(self, node: str) -> dict[str, Any]:
        """The settings that can change what a node's training produces (its cache key)."""
        kind = stage_kind(node) if NODES[node][1] else None
        common = {"seed": self.seed, "batch_size": self.batch_size, "skip_layers": list(self.skip_layers),
                  "fuse_relu": self.fuse_relu, "split_separable": True, "conv1d_as_conv2d": True}
        if kind is None:
            return common
        s = self.stage(kind)
        out = {**common, "epochs": s.epochs, "learning_rate": s.learning_rate, **self.training_params()}
        technique = NODES[node][1]
        if node in QAT_NODES:
            out.update(qat_ranges=self.qat_ranges)
        if technique in ("prune",):
            out.update(sparsity=self.sparsity, pruning_schedule=self.pruning_schedule)
            if self.sparsity_pattern != "unstructured":  # (unstructured cache keys stay as they were)
                out.update(sparsity_pattern=self.sparsity_pattern)
            if self.pruning_schedule == "polynomial":
                out.update(pruning_end_fraction=self.pruning_end_fraction)
        if technique in ("palette", "palette_qat"):
            out.update(clusters=self.clusters, sparsity=self.sparsity, layers=dict(self.layers), palette=dict(self.palette),
                       **{key: self.palette.get(key, value) for key, value in PALETTE_DEFAULTS.items()},
                       calibration_choice="random", plan_version=PALETTE_PLAN_VERSION)
            if self.sparsity_pattern != "unstructured":
                out.update(sparsity_pattern=self.sparsity_pattern)
            if technique == "palette_qat":  # one run, at the QAT stage's rate, over the cluster and QAT epochs
                out.update(cluster_epochs=self.stage("cluster").epochs, qat_schedule="one_run")
        if technique == "thin":
            out.update(thin_speedup=self.thin_speedup, thin_targets=list(self.thin_targets),
                       thin_max_npu_cycles=self.thin_max_npu_cycles, thin_max_latency_ms=self.thin_max_latency_ms,
                       calibration_samples=self.calibration_samples)
            if self.sparsity_pattern != "unstructured":  # (the candidate widths keep the pattern's blocks, and
                # the budget is held on the cycles of the thinned model pruned to the pattern)
                out.update(sparsity_pattern=self.sparsity_pattern, thin_cycles_of="pruned")
            if self.thin_trials > 1:  # (without trials, cache keys stay as they were)
                out.update(thin_trials=self.thin_trials, thin_trial_epochs=self.thin_trial_epochs)
            out.update({"thin_candidates": self.thin_candidates} if self.thin_candidates != 5 else {})  # (likewise)
        if node in THINNED_NODES and self.thin_augment != "none":  # (the thinned branch's fine-tuning)
            out.update(thin_augment=self.thin_augment)
        if technique in ("cluster", "sparsity_preserving_cluster"):
            out.update(clusters=self.clusters, per_channel_clusters=self.per_channel_clusters,
                       centroid_init=self.centroid_init, cluster_gradient_aggregation=self.cluster_gradient_aggregation)
        return out

    def training_params(self) -> dict[str, Any]:
        """The fine-tuning settings every trained node depends on."""
        return {
            **({"loss": self.loss} if self.loss else {}),
            "distill": self.distill,
            **({"distill_temperature": self.distill_temperature, "distill_label_weight": self.distill_label_weight}
               if self.distill else {}),
            "lr_schedule": self.lr_schedule, "warmup_fraction": self.warmup_fraction,
            "freeze_batch_norm": self.freeze_batch_norm,
            **({"freeze_batch_norm_after": self.freeze_batch_norm_after} if self.freeze_batch_norm else {}),
            "validation_fraction": self.validation_fraction,
            **({"patience": self.patience, "restore_best": self.restore_best, "selection_metric": self.selection_metric}
               if self.validation_fraction > 0 else {}),
        }


def _check(r: Recipe, source: str) -> Recipe:
    """The recipe's values (after command-line overrides) checked against ``RECIPE_KEYS``."""
    hint = "fix the recipe"
    if not r.leaves:
        raise UsageError(f"{source}: `leaves` is empty; allowed values: {', '.join(LEAVES)}", hint)
    for leaf in r.leaves:
        if leaf in NOT_NPU_LEAVES:
            raise UsageError(f"{source}: `leaves` has '{leaf}': {NOT_NPU_FORMATS[NOT_NPU_LEAVES[leaf]]}, so it is "
                             "not an NPU format", "ask for ptq (int8) or ptq_16x8 (int16 activations)")
    for key in RECIPE_KEYS:
        if "*" in key.path or key.path.startswith(("stages.", "palette.")) or not hasattr(r, key.name):
            continue
        value = getattr(r, key.name)
        if key.name == "leaves":
            key = replace(key, choices=tuple(LEAVES))
        check_value(key, list(value) if isinstance(value, tuple) else value, source, UsageError, hint,
                    shown=key.path)
    if r.sparsity_pattern == "2:4" and abs(r.sparsity - 0.5) > 1e-9:
        raise UsageError(f"{source}: `sparsity` is {r.sparsity} with sparsity_pattern = \"2:4\", which prunes "
                         "exactly 0.5", "leave sparsity at 0.5")
    if r.loss:
        from edgedeploy.config.task import check_loss_name

        check_loss_name(r.loss, f"{source}: `loss`")
    for kind in list(r.stage_epochs) + list(r.stage_learning_rates):
        if kind not in STAGE_KINDS:
            raise UsageError(f"{source}: `stages.{kind}` is not a stage; allowed values: {', '.join(STAGE_KINDS)}",
                             hint)
    _check_thin_targets(r.thin_targets, source, hint)
    return r


def _check_thin_targets(names: tuple[str, ...], source: str, hint: str) -> None:
    """``thin_targets`` names at least one target, each a built-in target or a target file (loaded and checked
    here, as :func:`edgedeploy.config.targets.get_target` reads it later), before anything trains."""
    from edgedeploy.config.targets import builtin_target_names, get_target
    from edgedeploy.core.files import short

    known = builtin_target_names()
    allowed = f"{', '.join(known)}, or the path of a target .toml file"
    if not names:
        raise UsageError(f"{source}: `thin_targets` is empty; allowed values: {allowed}",
                         'name the targets whose NPU cycles choose the widths, e.g. thin_targets = ["ethos-u55-128"]')
    for name in names:
        if name in known:
            continue
        if name.endswith(".toml") or (name and Path(name).exists()):
            try:
                get_target(name)
            except TargetError as exc:  # (what is wrong with the file, after where it was named)
                raise type(exc)(f"{source}: `thin_targets` has {short(repr(name))}: {exc.message}", exc.hint) from None
            continue
        close = difflib.get_close_matches(name, known, n=1)
        guess = f"did you mean {close[0]}? " if close else ""
        raise UsageError(f"{source}: `thin_targets` has {short(repr(name))}; allowed values: {allowed}",
                         f"{guess}{hint}")


def _check_names(given: Mapping[str, Any], source: str) -> None:
    """Every setting given by name (command-line options, keyword arguments of the Python API) is a field of
    :class:`Recipe`; an unknown one is named with the nearest, as an unknown key of a recipe file is."""
    from dataclasses import fields

    from edgedeploy.core.files import short

    names = sorted(f.name for f in fields(Recipe))
    for name in given:
        if name not in names:
            close = difflib.get_close_matches(str(name), names, n=1, cutoff=0.6)
            guess = f"did you mean `{close[0]}`? " if close else ""
            raise UsageError(f"{source}: unknown key `{short(str(name))}`",
                             f"{guess}give the recipe's keys by their field names (docs/reference/recipe.md)")


def load_recipe(path: Path | None = None, overrides: Mapping[str, Any] | None = None,
                table: Mapping[str, Any] | None = None) -> Recipe:
    """A recipe from a TOML file (or an already-parsed table), with command-line overrides applied."""
    data: dict[str, Any] = dict(table or {})
    source = "recipe"
    if path is not None:
        path = Path(path)
        source = str(path)
        data = read_toml(path, "recipe file", UsageError)
    values = validate(data, RECIPE_KEYS, source, UsageError, "fix the recipe")
    kwargs: dict[str, Any] = {}
    stage_epochs: dict[str, int] = {}
    stage_rates: dict[str, float] = {}
    layers: dict[str, dict[str, Any]] = {}
    palette: dict[str, Any] = {}
    for dotted, value in values.items():
        parts = dotted.split(".")
        if parts[0] == "stages":
            (stage_epochs if parts[2] == "epochs" else stage_rates)[parts[1]] = value
        elif parts[0] == "layers":
            name, setting = dotted.removeprefix("layers.").rsplit(".", 1)
            layers.setdefault(name, {})[setting] = value
        elif parts[0] == "palette":
            palette[parts[1]] = list(value) if isinstance(value, list) else value
        else:
            name = _KEYS_BY_PATH[dotted].name
            kwargs[name] = tuple(value) if isinstance(value, list) else value
    kwargs["stage_epochs"] = stage_epochs
    kwargs["stage_learning_rates"] = stage_rates
    if layers:
        kwargs["layers"] = layers
    if "size_budget" in palette and not palette.get("search", False):
        raise UsageError(f"{source}: `palette.size_budget` picks the per-layer settings of the palette sweep, "
                         "which is off", "add [palette] search = true")
    if palette:
        kwargs["palette"] = palette
    given = {k: v for k, v in (overrides or {}).items() if v is not None}
    _check_names(given, f"{source} with the options given by name")
    if "leaves" in given:
        given["leaves"] = tuple(given["leaves"])
    if given.get("plain", kwargs.get("plain", False)):
        # the plain preset sets what the file and the flags leave unset
        explicit = set(kwargs) | set(given)
        kwargs = {**{k: v for k, v in PLAIN.items() if k not in explicit}, **kwargs}
    recipe = Recipe(**kwargs)
    if given:
        recipe = replace(recipe, **given)
        source = f"{source} with the options given by name"
    return _check(recipe, source)


def check_layers(recipe: Recipe, names: list[str], model: str) -> None:
    """``[layers.NAME]`` and ``skip_layers`` name layers of the model (checked before any training)."""
    for key, given in (("layers", list(recipe.layers)), ("skip_layers", list(recipe.skip_layers))):
        for name in given:
            if name not in names:
                close = difflib.get_close_matches(name, names, n=3, cutoff=0.5)
                near = f"nearest: {', '.join(close)}" if close else f"its layers: {', '.join(names[:12])}"
                shown = f"layers.{name}" if key == "layers" else "skip_layers"
                raise UsageError(f"recipe `{shown}`: {model} has no layer {name!r}", near)
