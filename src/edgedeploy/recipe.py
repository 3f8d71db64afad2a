"""What the user asks the optimization stages to do: leaves, sparsity, clusters, training settings.

A recipe comes from a TOML file (``--recipe``) and/or command-line flags (flags win). Values are checked on
load; a bad value names the file, the key and the allowed values.
"""

from __future__ import annotations

import tomllib
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Mapping

from .errors import UsageError

# The deployment tree: node -> (parent node, technique). Leaves are converted to int8.
NODES: dict[str, tuple[str | None, str | None]] = {
    "baseline": (None, None),
    "pruned": ("baseline", "prune"),
    "clustered": ("baseline", "cluster"),
    "pruned_clustered": ("pruned", "sparsity_preserving_cluster"),
    "qat": ("baseline", "qat"),
    "pqat": ("pruned", "pqat"),
    "cqat": ("clustered", "cqat"),
    "pcqat": ("pruned_clustered", "pcqat"),
}
# Leaf -> the node it converts (PTQ leaves convert a float node; QAT leaves their QAT node).
LEAVES: dict[str, str] = {
    "ptq": "baseline",
    "qat": "qat",
    "pruned": "pruned",
    "pqat": "pqat",
    "clustered": "clustered",
    "cqat": "cqat",
    "pruned_clustered": "pruned_clustered",
    "pcqat": "pcqat",
}
QAT_NODES = {"qat", "pqat", "cqat", "pcqat"}
STAGE_KINDS = ("prune", "cluster", "qat")
SCHEDULES = ("constant", "polynomial")
CENTROID_INITS = ("kmeans++", "linear", "density", "random")
LR_SCHEDULES = ("cosine", "constant")
GRADIENT_AGGREGATIONS = ("sum", "avg")
QAT_RANGES = ("calibrated", "tfmot")  # where QAT's activation ranges start (keras_model.init_activation_ranges)
SELECTION_METRICS = ("loss", "accuracy")  # the same as edgedeploy.finetune.SELECTION_METRICS
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


def stage_kind(node: str) -> str:
    technique = NODES[node][1]
    if technique == "prune":
        return "prune"
    if technique in ("cluster", "sparsity_preserving_cluster"):
        return "cluster"
    return "qat"


def nodes_for(leaves: list[str]) -> list[str]:
    """Every node the leaves need, parents first, each once."""
    order: list[str] = []

    def add(node: str) -> None:
        parent = NODES[node][0]
        if parent is not None:
            add(parent)
        if node not in order:
            order.append(node)

    for leaf in leaves:
        add(LEAVES[leaf])
    return order


@dataclass(frozen=True)
class StageSettings:
    epochs: int
    learning_rate: float


@dataclass(frozen=True)
class Recipe:
    leaves: tuple[str, ...] = tuple(LEAVES)
    sparsity: float = 0.5
    clusters: int = 16
    per_channel_clusters: bool = False
    epochs: int = 4
    batch_size: int = 32
    learning_rate: float = 5e-4  # the peak of the warm-up/cosine schedule (PLAIN: constant 1e-4)
    seed: int = 0
    pruning_schedule: str = "polynomial"
    pruning_end_fraction: float = 0.6
    centroid_init: str = "kmeans++"
    cluster_gradient_aggregation: str = "sum"
    skip_layers: tuple[str, ...] = ()
    stage_epochs: Mapping[str, int] = field(default_factory=dict)
    stage_learning_rates: Mapping[str, float] = field(default_factory=dict)
    float_io: bool = False
    calibration_samples: int = 500
    sparsity_tolerance: float = 0.02
    fuse_relu: bool = True
    # fine-tuning with little data (see edgedeploy.finetune)
    plain: bool = False
    distill: bool = True
    distill_temperature: float = 4.0
    distill_label_weight: float = 0.5
    lr_schedule: str = "cosine"
    warmup_fraction: float = 0.1
    freeze_batch_norm: bool = True
    freeze_batch_norm_after: int = 0
    validation_fraction: float = 0.1
    patience: int = 3
    restore_best: bool = True
    selection_metric: str = "loss"
    qat_ranges: str = "calibrated"
    # each trained stage takes at least this many optimizer steps: on little data, epochs are added
    # (edgedeploy.fitlength; the default is chosen from measurements in docs/walk.md)
    min_steps: int = 300
    # palette-aware leaves (edgedeploy.palette): per-layer settings ([layers.NAME]) and the sweep ([palette])
    layers: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    palette: Mapping[str, Any] = field(default_factory=dict)

    def stage(self, kind: str) -> StageSettings:
        return StageSettings(
            epochs=int(self.stage_epochs.get(kind, self.epochs)),
            learning_rate=float(self.stage_learning_rates.get(kind, self.learning_rate)),
        )

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["leaves"] = list(self.leaves)
        d["skip_layers"] = list(self.skip_layers)
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
            if self.pruning_schedule == "polynomial":
                out.update(pruning_end_fraction=self.pruning_end_fraction)
        if technique in ("palette", "palette_qat"):
            out.update(clusters=self.clusters, sparsity=self.sparsity, layers=dict(self.layers), palette=dict(self.palette),
                       **{key: self.palette.get(key, value) for key, value in PALETTE_DEFAULTS.items()},
                       calibration_choice="random", plan_version=PALETTE_PLAN_VERSION)
            if technique == "palette_qat":  # one run, at the QAT stage's rate, over the cluster and QAT epochs
                out.update(cluster_epochs=self.stage("cluster").epochs, qat_schedule="one_run")
        if technique in ("cluster", "sparsity_preserving_cluster"):
            out.update(clusters=self.clusters, per_channel_clusters=self.per_channel_clusters,
                       centroid_init=self.centroid_init, cluster_gradient_aggregation=self.cluster_gradient_aggregation)
        return out

    def training_params(self) -> dict[str, Any]:
        """The fine-tuning settings every trained node depends on."""
        return {
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


class _Checker:
    def __init__(self, source: str) -> None:
        self.source = source

    def fail(self, key: str, what: str) -> UsageError:
        return UsageError(f"{self.source}: `{key}` {what}", "fix the recipe")


def _check(r: Recipe, source: str) -> Recipe:
    c = _Checker(source)
    if not r.leaves:
        raise c.fail("leaves", f"is empty; allowed values: {', '.join(LEAVES)}")
    for leaf in r.leaves:
        if leaf not in LEAVES:
            raise c.fail("leaves", f"has '{leaf}'; allowed values: {', '.join(LEAVES)}")
    if not 0.0 < r.sparsity < 1.0:
        raise c.fail("sparsity", f"is {r.sparsity}; it must be between 0 and 1 (e.g. 0.5)")
    if not 2 <= r.clusters <= 256:
        raise c.fail("clusters", f"is {r.clusters}; it must be an integer from 2 to 256")
    for key in ("epochs", "batch_size", "calibration_samples"):
        if getattr(r, key) < (0 if key == "epochs" else 1):
            raise c.fail(key, f"is {getattr(r, key)}; it must be a positive integer")
    if not r.learning_rate > 0:
        raise c.fail("learning_rate", f"is {r.learning_rate}; it must be > 0")
    if r.pruning_schedule not in SCHEDULES:
        raise c.fail("pruning.schedule", f"is '{r.pruning_schedule}'; allowed values: {', '.join(SCHEDULES)}")
    if r.centroid_init not in CENTROID_INITS:
        raise c.fail("clustering.centroid_init", f"is '{r.centroid_init}'; allowed values: {', '.join(CENTROID_INITS)}")
    if r.cluster_gradient_aggregation not in GRADIENT_AGGREGATIONS:
        raise c.fail("clustering.gradient_aggregation", f"is '{r.cluster_gradient_aggregation}'; allowed values: "
                     f"{', '.join(GRADIENT_AGGREGATIONS)}")
    if not 0.0 < r.pruning_end_fraction <= 1.0:
        raise c.fail("pruning.end_fraction", f"is {r.pruning_end_fraction}; it must be in (0, 1] (e.g. 0.6)")
    if r.lr_schedule not in LR_SCHEDULES:
        raise c.fail("training.lr_schedule", f"is '{r.lr_schedule}'; allowed values: {', '.join(LR_SCHEDULES)}")
    if r.qat_ranges not in QAT_RANGES:
        raise c.fail("training.qat_ranges", f"is '{r.qat_ranges}'; allowed values: {', '.join(QAT_RANGES)}")
    if not 0.0 <= r.warmup_fraction < 1.0:
        raise c.fail("training.warmup_fraction", f"is {r.warmup_fraction}; it must be in [0, 1) (e.g. 0.1)")
    if r.min_steps < 0:
        raise c.fail("training.min_steps", f"is {r.min_steps}; it must be >= 0 optimizer steps (0: epochs as given)")
    if r.freeze_batch_norm_after < 0:
        raise c.fail("training.freeze_batch_norm_after", f"is {r.freeze_batch_norm_after}; it must be >= 0 epochs")
    if not r.distill_temperature > 0:
        raise c.fail("distillation.temperature", f"is {r.distill_temperature}; it must be > 0 (e.g. 4)")
    if not 0.0 <= r.distill_label_weight <= 1.0:
        raise c.fail("distillation.label_weight", f"is {r.distill_label_weight}; it must be in [0, 1]")
    if not 0.0 <= r.validation_fraction < 0.5:
        raise c.fail("selection.validation_fraction", f"is {r.validation_fraction}; it must be in [0, 0.5) "
                     "(0 turns hold-out selection off)")
    if r.selection_metric not in SELECTION_METRICS:
        raise c.fail("selection.metric", f"is '{r.selection_metric}'; allowed values: {', '.join(SELECTION_METRICS)}")
    if r.patience < 0:
        raise c.fail("selection.patience", f"is {r.patience}; it must be >= 0 (0: never stop early)")
    for kind in list(r.stage_epochs) + list(r.stage_learning_rates):
        if kind not in STAGE_KINDS:
            raise c.fail(f"stages.{kind}", f"is not a stage; allowed values: {', '.join(STAGE_KINDS)}")
    if not 0 <= r.sparsity_tolerance < 1:
        raise c.fail("sparsity_tolerance", "must be between 0 and 1")
    return r


_SIMPLE = {
    "leaves": list, "sparsity": float, "clusters": int, "per_channel_clusters": bool, "epochs": int,
    "batch_size": int, "learning_rate": float, "seed": int, "skip_layers": list, "float_io": bool,
    "calibration_samples": int, "sparsity_tolerance": float, "fuse_relu": bool, "plain": bool,
}
# Keys of the training tables: table -> key -> (Recipe field, type).
_TABLES: dict[str, dict[str, tuple[str, type]]] = {
    "pruning": {"schedule": ("pruning_schedule", str), "end_fraction": ("pruning_end_fraction", float)},
    "clustering": {"centroid_init": ("centroid_init", str),
                   "gradient_aggregation": ("cluster_gradient_aggregation", str)},
    "distillation": {"enabled": ("distill", bool), "temperature": ("distill_temperature", float),
                     "label_weight": ("distill_label_weight", float)},
    "training": {"lr_schedule": ("lr_schedule", str), "warmup_fraction": ("warmup_fraction", float),
                 "freeze_batch_norm": ("freeze_batch_norm", bool),
                 "freeze_batch_norm_after": ("freeze_batch_norm_after", int), "qat_ranges": ("qat_ranges", str),
                 "min_steps": ("min_steps", int)},
    "selection": {"validation_fraction": ("validation_fraction", float), "patience": ("patience", int),
                  "restore_best": ("restore_best", bool), "metric": ("selection_metric", str)},
}


def _typed(source: str, key: str, value: Any, kind: type) -> Any:
    if kind is float and isinstance(value, int) and not isinstance(value, bool):
        value = float(value)
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        what = {int: "an integer", float: "a number", bool: "true or false", list: "a list", str: "a string"}[kind]
        raise UsageError(f"{source}: `{key}` is {value!r}; it must be {what}", "fix the recipe")
    return value


def load_recipe(path: Path | None = None, overrides: Mapping[str, Any] | None = None,
                table: Mapping[str, Any] | None = None) -> Recipe:
    """A recipe from a TOML file (or an already-parsed table), with command-line overrides applied."""
    data: dict[str, Any] = dict(table or {})
    source = "recipe"
    if path is not None:
        path = Path(path)
        source = str(path)
        try:
            data = tomllib.loads(path.read_text(encoding="utf-8"))
        except FileNotFoundError as exc:
            raise UsageError(f"recipe file {path} does not exist", "check the path") from exc
        except tomllib.TOMLDecodeError as exc:
            raise UsageError(f"{path}: not valid TOML ({exc})", "fix the syntax") from exc
    known = set(_SIMPLE) | set(_TABLES) | {"stages"} | {"layers", "palette"}
    for key in data:
        if key not in known:
            raise UsageError(f"{source}: unknown key `{key}`", f"allowed keys: {', '.join(sorted(known))}")
    kwargs: dict[str, Any] = {}
    for key, kind in _SIMPLE.items():
        if key in data:
            value = _typed(source, key, data[key], kind)
            kwargs[key] = tuple(value) if kind is list else value
    for table, keys in _TABLES.items():
        values = data.get(table, {})
        if not isinstance(values, dict):
            raise UsageError(f"{source}: `{table}` must be a table", f"e.g. [{table}] {next(iter(keys))} = ...")
        for key, value in values.items():
            if key not in keys:
                raise UsageError(f"{source}: unknown key `{table}.{key}`", f"allowed keys: {', '.join(keys)}")
            name, kind = keys[key]
            kwargs[name] = _typed(source, f"{table}.{key}", value, kind)
    stages = data.get("stages", {})
    if not isinstance(stages, dict):
        raise UsageError(f"{source}: `stages` must be a table", "e.g. [stages.prune] epochs = 2")
    kwargs["stage_epochs"] = {k: v["epochs"] for k, v in stages.items() if isinstance(v, dict) and "epochs" in v}
    kwargs["stage_learning_rates"] = {
        k: float(v["learning_rate"]) for k, v in stages.items() if isinstance(v, dict) and "learning_rate" in v
    }
    for k in stages:
        if k not in STAGE_KINDS:
            raise UsageError(f"{source}: `stages.{k}` is not a stage", f"allowed values: {', '.join(STAGE_KINDS)}")
    given = {k: v for k, v in (overrides or {}).items() if v is not None}
    if "leaves" in given:
        given["leaves"] = tuple(given["leaves"])
    if given.get("plain", kwargs.get("plain", False)):
        # the plain preset sets what the file and the flags leave unset
        explicit = set(kwargs) | set(given)
        kwargs = {**{k: v for k, v in PLAIN.items() if k not in explicit}, **kwargs}
    kwargs.update(_palette_keys(data, source))
    recipe = Recipe(**kwargs)
    if given:
        recipe = replace(recipe, **given)
        source = f"{source} with command-line options"
    return _check(recipe, source)


# --------------------------------------------------------------------------- palette-aware leaves

# Nodes of edgedeploy.palette: int8 kernels keep one shared palette per tensor (each is a leaf of its own name).
# They are not in the default leaves; ask for them, e.g. `--leaves ptq,pcqat,pcqat_palette`.
NODES.update({
    "clustered_palette": ("baseline", "palette"),
    "pruned_clustered_palette": ("pruned", "palette"),
    "cqat_palette": ("clustered_palette", "palette_qat"),
    "pcqat_palette": ("pruned_clustered_palette", "palette_qat"),
})
LEAVES.update({n: n for n in ("clustered_palette", "pruned_clustered_palette", "cqat_palette", "pcqat_palette")})
QAT_NODES.update({"cqat_palette", "pcqat_palette"})
PALETTE_KEYS: dict[str, type] = {"search": bool, "accuracy_budget": float, "holdout": float, "clusters": list,
                                 "sparsities": list, "executor": str, "workers": int, "target": str,
                                 "measure_on": str, "measure_samples": int,
                                 "budget_from": str, "projection": str, "hessian_samples": int,
                                 "drop_estimate": str, "size_budget": float, "scales": str}
PALETTE_EXECUTORS = ("process", "ray")
PALETTE_MEASURE_ON = ("holdout", "fine-tune")
# [palette] keys with a fixed set of values, and the defaults of the keys the palette node's cache key names
PALETTE_CHOICES: dict[str, tuple[str, ...]] = {
    "executor": PALETTE_EXECUTORS, "measure_on": PALETTE_MEASURE_ON, "budget_from": ("parent", "palette"),
    "projection": ("gptq", "nearest"), "drop_estimate": ("loss", "accuracy"), "scales": ("peak", "fitted"),
}
PALETTE_DEFAULTS = {"projection": "gptq", "drop_estimate": "loss", "scales": "peak"}
# The palette plan file's format (palette.py's PLAN_FILE). 2: it records the batch-norm factors folded into each
# kernel, which palette QAT trains in. Part of the palette nodes' cache key, so older run folders are redone.
PALETTE_PLAN_VERSION = 2


def _palette_keys(data: Mapping[str, Any], source: str) -> dict[str, Any]:
    """``[layers.NAME] sparsity/clusters`` and ``[palette]`` (the sweep), checked."""
    out: dict[str, Any] = {}
    layers = data.get("layers", {})
    if not isinstance(layers, dict) or not all(isinstance(v, dict) for v in layers.values()):
        raise UsageError(f"{source}: `layers` must hold one table per layer", "e.g. [layers.conv2d_1] sparsity = 0.7")
    checked: dict[str, dict[str, Any]] = {}
    for name, values in layers.items():
        for key, value in values.items():
            if key == "clusters":
                value = _typed(source, f"layers.{name}.clusters", value, int)
                if not 2 <= value <= 32:
                    raise UsageError(f"{source}: `layers.{name}.clusters` is {value}; it must be from 2 to 32 "
                                     "(Vela's palette holds at most 32 values)", "fix the recipe")
            elif key == "sparsity":
                value = _typed(source, f"layers.{name}.sparsity", value, float)
                if not 0.0 <= value < 1.0:
                    raise UsageError(f"{source}: `layers.{name}.sparsity` is {value}; it must be in [0, 1)",
                                     "fix the recipe")
            else:
                raise UsageError(f"{source}: unknown key `layers.{name}.{key}`", "allowed keys: clusters, sparsity")
            checked.setdefault(name, {})[key] = value
    if checked:
        out["layers"] = checked
    palette = data.get("palette", {})
    if not isinstance(palette, dict):
        raise UsageError(f"{source}: `palette` must be a table", "e.g. [palette] search = true")
    opts: dict[str, Any] = {}
    for key, value in palette.items():
        if key not in PALETTE_KEYS:
            raise UsageError(f"{source}: unknown key `palette.{key}`", f"allowed keys: {', '.join(PALETTE_KEYS)}")
        value = _typed(source, f"palette.{key}", value, PALETTE_KEYS[key])
        if key in PALETTE_CHOICES and value not in PALETTE_CHOICES[key]:
            raise UsageError(f"{source}: `palette.{key}` is '{value}'; allowed values: "
                             f"{', '.join(PALETTE_CHOICES[key])}", "fix the recipe")
        if key == "clusters" and not all(isinstance(v, int) and 2 <= v <= 32 for v in value):
            raise UsageError(f"{source}: `palette.clusters` is {value}; each must be an integer from 2 to 32",
                             "fix the recipe")
        if key == "sparsities" and not all(isinstance(v, (int, float)) and 0 <= v < 1 for v in value):
            raise UsageError(f"{source}: `palette.sparsities` is {value}; each must be in [0, 1)", "fix the recipe")
        if key in ("accuracy_budget", "holdout") and not 0 <= value < (100 if key == "accuracy_budget" else 0.5):
            raise UsageError(f"{source}: `palette.{key}` is {value}; out of range", "fix the recipe")
        if key == "size_budget" and not 0 < value <= 1:
            raise UsageError(f"{source}: `palette.size_budget` is {value}; it must be in (0, 1], a fraction of the "
                             "ptq leaf's encoded weights", "e.g. [palette] size_budget = 0.4")
        if key == "hessian_samples" and value < 16:
            raise UsageError(f"{source}: `palette.hessian_samples` is {value}; it must be >= 16", "fix the recipe")
        if key == "measure_samples" and value < 100:
            raise UsageError(f"{source}: `palette.measure_samples` is {value}; it must be >= 100", "fix the recipe")
        if key == "workers" and value < 1:
            raise UsageError(f"{source}: `palette.workers` is {value}; it must be >= 1", "fix the recipe")
        opts[key] = list(value) if isinstance(value, list) else value
    if "size_budget" in opts and not opts.get("search", False):
        raise UsageError(f"{source}: `palette.size_budget` picks the per-layer settings of the palette sweep, "
                         "which is off", "add [palette] search = true")
    if opts:
        out["palette"] = opts
    return out
