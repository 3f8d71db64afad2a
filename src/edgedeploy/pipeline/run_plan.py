"""The plan of one model's run: what it was given (a project file's model table, or the arguments of ``optimize``
and the notebook API), and its inputs loaded and checked once.

A :class:`Plan` names the model, the data, the run folder, the recipe, the targets, the compile options (and where
the work runs), the requirements and the strategy (the whole tree, or a walk). :meth:`Plan.load` loads the model,
the data and the task once, before anything is written (:func:`load_inputs`); the teacher's outputs for
distillation are computed the first time a tree that distils into a trained node asks for them
(:meth:`TreeInputs.for_recipe`). The driver (:func:`edgedeploy.pipeline.driver.run`) runs a plan.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Sequence

from edgedeploy.config.data import Dataset, load_dataset, output_arrays, read_data_file, read_targets
from edgedeploy.config.recipe import Recipe, check_layers
from edgedeploy.config.task import Task, decide
from edgedeploy.errors import UsageError
from edgedeploy.config.tree import LEAVES, NODE_TABLE, QAT_NODES, THINNED_NODES, nodes_for
from edgedeploy.core.files import sha256_file
from edgedeploy.keras.model import check_recurrent_layers, load_model
from edgedeploy.optimize.finetune.fit import mirror, teacher_targets
from edgedeploy.pipeline.compile import CompileOptions
from edgedeploy.report import Requirements, leaf_level

if TYPE_CHECKING:
    from edgedeploy.config.targets import Target
    from edgedeploy.data_sources import Samples
    from edgedeploy.pipeline.project import ModelEntry

log = logging.getLogger("edgedeploy")

# samples of the user's data a flattened model is checked on against the nested model it was loaded from
FLATTEN_CHECK_SAMPLES = 64


@dataclass
class Plan:
    """One model's run: its model file, data (a file, a folder or in-memory samples), run folder and recipe; the
    targets its leaves are compiled for (none: no compiles), the compile options and where the work runs, the
    requirements a walk judges by, and whether it walks. ``inputs``: what :meth:`load` loaded."""

    model: Path
    data: Path | Samples
    out: Path
    recipe: Recipe
    targets: Sequence[Target] = ()
    options: CompileOptions = field(default_factory=CompileOptions)
    requirements: Requirements = field(default_factory=Requirements)
    walk: bool = False
    trust_lambda: bool = False
    reuse: bool = True  # stages whose inputs and parameters are unchanged are reused from the run folder
    inputs: TreeInputs | None = field(default=None, repr=False)

    @classmethod
    def of_entry(cls, entry: ModelEntry, out: Path, targets: Sequence[Target], options: CompileOptions,
                 requirements: Requirements, *, walk: bool = False) -> Plan:
        """The plan of one model table of a project file, into ``out``."""
        return cls(Path(entry.model), entry.data, Path(out), entry.recipe, tuple(targets), options, requirements,
                   walk, entry.trust_lambda)

    def load(self) -> TreeInputs:
        """The model, the data and the task, loaded and checked once (a walk checks the leaves of its first level
        now, each deeper level's when it gets there)."""
        if self.inputs is None:
            first = next(iter(levels_of(self.recipe.leaves).values())) if self.walk else None
            self.inputs = load_inputs(self.model, self.data, self.out, self.recipe, trust_lambda=self.trust_lambda,
                                      leaves=first)
        return self.inputs


def levels_of(leaves: Sequence[str]) -> dict[int, list[str]]:
    """The leaves grouped by tree level, least optimized first (the recipe's order within a level)."""
    out: dict[int, list[str]] = {}
    for leaf in leaves:
        level = leaf_level(leaf)
        if level is None:
            raise UsageError(f"leaf '{leaf}' has no level in the deployment tree", "walk only the tree's leaves")
        out.setdefault(level, []).append(leaf)
    return dict(sorted(out.items()))


@dataclass
class TreeInputs:
    """What every stage of one model's tree reads, loaded and checked once (:func:`load_inputs`): a walk runs the
    tree level by level on the same inputs."""

    model_path: Path
    data_path: Path  # the .npz the stages read (a folder or in-memory samples written into the run folder)
    data: Dataset
    loss: Task  # the learning task: its loss and metric
    versions: dict[str, str]
    manifest_info: dict[str, Any]  # what the manifest records about the model, data and task
    trust_lambda: bool = False
    model: Any = None  # the user's Keras model (for the teacher's outputs, computed when first needed)

    def for_recipe(self, recipe: Recipe) -> Dataset:
        """The data, with the teacher's outputs when ``recipe`` distils into a trained node (computed once)."""
        if (recipe.distill and self.data.soft_targets is None
                and any(NODE_TABLE[n].technique for n in nodes_for(list(recipe.leaves)))):
            self._set_teacher(self.data.x_fit, "soft_targets")
        if (recipe.distill and recipe.thin_augment == "hflip" and self.data.mirrored_targets is None
                and self.data.x_fit.ndim == 4 and THINNED_NODES & set(nodes_for(list(recipe.leaves)))):
            self._set_teacher(mirror(self.data.x_fit), "mirrored_targets")
        return self.data

    def _set_teacher(self, x, attr: str) -> None:
        """The float model's outputs on ``x`` as ``attr`` of each output's data set (the first output's is
        ``self.data``; a model with several outputs gives each of the others its own)."""
        heads = [(self.data, self.loss), *[(d, d.task) for _, d in self.data.others]]
        if not self.data.others:
            setattr(self.data, attr, teacher_targets(self.model, x, self.loss.from_logits, self.loss.classifier))
            return
        outputs = teacher_targets(self.model, x, self.loss.from_logits, self.loss.classifier,
                                  heads=[(task.from_logits, task.classifier) for _, task in heads])
        for (data, _), out in zip(heads, outputs):
            setattr(data, attr, out)


def load_inputs(model_path: Path, data_path: Path | Samples, out: Path, recipe: Recipe, *,
                trust_lambda: bool = False, leaves: Sequence[str] | None = None) -> TreeInputs:
    """Load and check the model, the data and the task for ``leaves`` (default: the recipe's) before anything is
    written (a data folder or in-memory samples become one .npz in the run folder ``out``). A walk checks the
    leaves of its first level here and those of each deeper level when it gets there
    (:func:`edgedeploy.pipeline.tree_run.open_tree`)."""
    from edgedeploy.keras import tfenv

    from edgedeploy.data_sources import DataOptions, Samples, gather_data

    model_path = Path(model_path)
    model, info = load_model(model_path, trust_lambda)  # a missing or unsafe file stops before TensorFlow loads
    env = tfenv.load()
    check_recurrent(model, model_path, recipe.leaves if leaves is None else leaves)
    check_layers(recipe, [layer.name for layer in model.layers] + [f"{layer.name}_depthwise" for layer in model.layers
                                                                   if type(layer).__name__ == "SeparableConv2D"],
                 str(model_path))
    # a folder or in-memory samples are checked as the .npz they become, before it is written: a refused source
    # leaves nothing behind, and errors name the user's folder or file
    prepared = gather_data(data_path, tuple(model.input_shape[1:]), DataOptions.from_recipe(recipe))
    if prepared is not None:
        where = Path(prepared.where)
    else:  # an .npz used as it is (samples in memory are always prepared)
        assert not isinstance(data_path, Samples)
        where = Path(data_path)
    # the task (loss and metric) from the recipe, the model's compile config or the data; contradicting targets
    # stop here, before anything trains
    arrays = read_data_file(where) if prepared is None else prepared.arrays()  # read once: targets, then samples
    loss, data = _task_and_data(model, info, where, arrays, recipe, sha256=None if prepared is None else "")
    data_path, data_source = where, None
    if prepared is not None:
        data_path, data_source = prepared.write(Path(out))
        data.path, data.sha256 = data_path, sha256_file(data_path)
        for _, other in data.others:
            other.path, other.sha256 = data.path, data.sha256
    if data.reshaped_from:
        log.warning("%s: samples reshaped from %s to the model input %s", where, list(data.reshaped_from),
                    list(model.input_shape[1:]))
    info_doc = {
        "model": str(model_path.resolve()),
        **({"flattened": _check_flattened(model, info, data)} if info.flattened else {}),
        "data": data.describe(),
        **({"data_source": data_source} if data_source else {}),
    }
    task_doc = {"loss": {"name": loss.name, "from_logits": loss.from_logits, "source": loss.source},
                **({} if loss.classifier and not loss.outputs else {"task": loss.describe()})}
    return TreeInputs(model_path, data_path, data, loss, dict(env.versions), {"head": info_doc, "tail": task_doc},
                      trust_lambda, model)


def _task_and_data(model, info, where: Path, arrays: dict[str, Any], recipe: Recipe, sha256: str | None
                   ) -> tuple[Task, Dataset]:
    """The task (loss and metric) from the recipe, the model's compile config or the data, and the data set it
    scores; contradicting targets stop here, before anything trains. A model with several outputs reads one target
    array per output (:func:`edgedeploy.config.data.output_arrays`): the first output's data set is returned,
    carrying the others' in ``others``, each with its task."""
    in_shape = tuple(model.input_shape[1:])
    names = list(model.output_names) if isinstance(model.output_shape, list) else [None]
    views = output_arrays(where, arrays, names) if len(names) > 1 else [arrays]
    read = [read_targets(where, view) for view in views]
    targets = [y for y, _ in read] if len(names) > 1 else read[0][0]
    loss = decide(model, info.training_config, where, targets, loss=recipe.loss or None,
                  metric=recipe.metric or None, has_anomaly=any(anomaly for _, anomaly in read))
    shapes = model.output_shape if len(names) > 1 else [model.output_shape]
    datasets: list[Dataset] = []
    for view, shape, (_, task) in zip(views, shapes, loss.heads()):
        data = load_dataset(where, in_shape, int(shape[-1]), kind=task.kind, arrays=view,
                            sha256=datasets[0].sha256 if datasets else sha256)
        data.task = task
        datasets.append(data)
    first = datasets[0]
    first.others = [(str(name), data) for name, data in zip(names[1:], datasets[1:])]
    return loss, first


def _check_flattened(model, info, data: Dataset) -> dict[str, Any]:
    """The flattened model checked against the nested one on the user's evaluation samples (up to
    :data:`FLATTEN_CHECK_SAMPLES`), before anything trains; what the manifest records about it."""
    from edgedeploy.keras.flatten import same_outputs

    x, split = (data.x_eval, "evaluation") if len(data.x_eval) else (data.x_fit, "fine-tune")
    x = x[:FLATTEN_CHECK_SAMPLES]
    where = f"{len(x)} {split} samples of {data.path.name}"
    diff = same_outputs(info.nested, model, x, info.path, where)
    return {"models": list(info.flattened), "layers": len(model.layers), "checked_on": where,
            "max_abs_difference": diff}


def check_recurrent(model: Any, model_path: Path, leaves: Sequence[str]) -> None:
    """Recurrent layers refused for the leaves that train with quantization-aware training."""
    check_recurrent_layers(model, model_path, leaves, [leaf for leaf in LEAVES if LEAVES[leaf] in QAT_NODES])
