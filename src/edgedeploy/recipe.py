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
    batch_size: int = 64
    learning_rate: float = 1e-4
    seed: int = 0
    pruning_schedule: str = "constant"
    centroid_init: str = "kmeans++"
    skip_layers: tuple[str, ...] = ()
    stage_epochs: Mapping[str, int] = field(default_factory=dict)
    stage_learning_rates: Mapping[str, float] = field(default_factory=dict)
    float_io: bool = False
    calibration_samples: int = 500
    sparsity_tolerance: float = 0.02
    fuse_relu: bool = True

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
                  "fuse_relu": self.fuse_relu}
        if kind is None:
            return common
        s = self.stage(kind)
        out = {**common, "epochs": s.epochs, "learning_rate": s.learning_rate}
        technique = NODES[node][1]
        if technique in ("prune",):
            out.update(sparsity=self.sparsity, pruning_schedule=self.pruning_schedule)
        if technique in ("cluster", "sparsity_preserving_cluster"):
            out.update(clusters=self.clusters, per_channel_clusters=self.per_channel_clusters,
                       centroid_init=self.centroid_init)
        return out


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
    for kind in list(r.stage_epochs) + list(r.stage_learning_rates):
        if kind not in STAGE_KINDS:
            raise c.fail(f"stages.{kind}", f"is not a stage; allowed values: {', '.join(STAGE_KINDS)}")
    if not 0 <= r.sparsity_tolerance < 1:
        raise c.fail("sparsity_tolerance", "must be between 0 and 1")
    return r


_SIMPLE = {
    "leaves": list, "sparsity": float, "clusters": int, "per_channel_clusters": bool, "epochs": int,
    "batch_size": int, "learning_rate": float, "seed": int, "skip_layers": list, "float_io": bool,
    "calibration_samples": int, "sparsity_tolerance": float, "fuse_relu": bool,
}


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
    known = set(_SIMPLE) | {"pruning", "clustering", "stages"}
    for key in data:
        if key not in known:
            raise UsageError(f"{source}: unknown key `{key}`", f"allowed keys: {', '.join(sorted(known))}")
    kwargs: dict[str, Any] = {}
    for key, kind in _SIMPLE.items():
        if key in data:
            value = data[key]
            if kind is float and isinstance(value, int) and not isinstance(value, bool):
                value = float(value)
            if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
                what = {int: "an integer", float: "a number", bool: "true or false", list: "a list"}[kind]
                raise UsageError(f"{source}: `{key}` is {value!r}; it must be {what}", "fix the recipe")
            kwargs[key] = tuple(value) if kind is list else value
    pruning = data.get("pruning", {})
    if "schedule" in pruning:
        kwargs["pruning_schedule"] = pruning["schedule"]
    clustering = data.get("clustering", {})
    if "centroid_init" in clustering:
        kwargs["centroid_init"] = clustering["centroid_init"]
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
    recipe = Recipe(**kwargs)
    if overrides:
        given = {k: v for k, v in overrides.items() if v is not None}
        if "leaves" in given:
            given["leaves"] = tuple(given["leaves"])
        recipe = replace(recipe, **given)
        source = f"{source} with command-line options"
    return _check(recipe, source)
