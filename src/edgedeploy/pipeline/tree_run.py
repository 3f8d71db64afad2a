"""The walk over the deployment tree: every node the requested leaves need, every leaf, and their compiles.

Each node of the tree (:data:`edgedeploy.config.tree.NODE_TABLE`) is one stage, ``optimize/<node>``, trained once from
its parent's saved model and reused by all its children; every branch starts from its own fresh copy of the
parent (TFMOT wrappers change the layers they wrap). Each leaf is converted (``convert/<leaf>``) and, when
targets are given, compiled for each (``compile/<leaf>/<target>``). The stages are the tasks of one graph
(:mod:`edgedeploy.core.graph`): each starts as soon as the stages it reads are done, its work here, in worker
processes (:mod:`edgedeploy.pipeline.runners.local`) or on Ray (:mod:`edgedeploy.pipeline.runners.ray`), its record written here.
The functions that run a node's technique or a leaf's conversion are looked up in
:mod:`edgedeploy.optimize.registry`."""

from __future__ import annotations

import logging
import shutil
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Sequence

from edgedeploy.config.data import Dataset, load_dataset, read_data_file, read_targets
from edgedeploy.keras import tfenv
from edgedeploy.keras.model import check_recurrent_layers, load_model
from edgedeploy.core.files import sha256_file
from edgedeploy.core.manifest import StageRecord
from edgedeploy.config.recipe import Recipe, check_layers
from edgedeploy.core.stage import RunContext, StageSpec, begin_stage, end_stage
from edgedeploy.core.graph import GraphTask, build_graph, leaf_id, node_id, run_graph
from edgedeploy.config.tree import LEAF_TABLE, LEAVES, NODE_TABLE, QAT_NODES, THINNED_NODES, nodes_for
from edgedeploy.config.task import Task, decide
from edgedeploy.optimize.finetune.fit import mirror, teacher_targets, training_set
from edgedeploy.optimize.finetune.length import stretch
from edgedeploy.optimize import handoff
from edgedeploy.optimize.registry import CONVERSIONS, TECHNIQUES

# samples of the user's data a flattened model is checked on against the nested model it was loaded from
FLATTEN_CHECK_SAMPLES = 64

if TYPE_CHECKING:
    from edgedeploy.pipeline.runners import StageRunner
    from edgedeploy.pipeline.compile import CompileOptions
    from edgedeploy.data_sources import Samples
    from edgedeploy.config.targets import Target

log = logging.getLogger("edgedeploy")


@dataclass
class OptimizeOutcome:
    """One tree run: the record of every leaf and trained node, the compiles asked for, the order tasks started."""

    run_dir: Path
    leaves: dict[str, StageRecord] = field(default_factory=dict)
    nodes: dict[str, StageRecord] = field(default_factory=dict)
    compiled: Any = None  # the CompileOutcome of the compiles asked for with ``targets``
    order: list[str] = field(default_factory=list)  # the stage ids in the order their tasks started


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
            self.data.soft_targets = teacher_targets(self.model, self.data.x_fit, self.loss.from_logits,
                                                     self.loss.classifier)
        if (recipe.distill and recipe.thin_augment == "hflip" and self.data.mirrored_targets is None
                and self.data.x_fit.ndim == 4 and THINNED_NODES & set(nodes_for(list(recipe.leaves)))):
            self.data.mirrored_targets = teacher_targets(self.model, mirror(self.data.x_fit),
                                                         self.loss.from_logits, self.loss.classifier)
        return self.data


def load_inputs(model_path: Path, data_path: Path | Samples, out: Path, recipe: Recipe, *,
                trust_lambda: bool = False, leaves: Sequence[str] | None = None) -> TreeInputs:
    """Load and check the model, the data and the task for ``leaves`` (default: the recipe's) before anything is
    written (a data folder or in-memory samples become one .npz in the run folder ``out``). A walk checks the
    leaves of its first level here and those of each deeper level when it gets there (:func:`run_tree`)."""
    from edgedeploy.keras import tfenv

    from edgedeploy.data_sources import DataOptions, Samples, gather_data

    model_path = Path(model_path)
    model, info = load_model(model_path, trust_lambda)  # a missing or unsafe file stops before TensorFlow loads
    env = tfenv.load()
    _check_recurrent(model, model_path, recipe.leaves if leaves is None else leaves)
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
    labels, has_anomaly = read_targets(where, arrays)
    loss = decide(model, info.training_config, where, labels, loss=recipe.loss or None,
                  metric=recipe.metric or None, has_anomaly=has_anomaly)
    data = load_dataset(where, tuple(model.input_shape[1:]), int(model.output_shape[-1]), kind=loss.kind,
                        arrays=arrays, sha256=None if prepared is None else "")
    data_path, data_source = where, None
    if prepared is not None:
        data_path, data_source = prepared.write(Path(out))
        data.path, data.sha256 = data_path, sha256_file(data_path)
    data.task = loss
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
                **({} if loss.classifier else {"task": loss.describe()})}
    return TreeInputs(model_path, data_path, data, loss, dict(env.versions), {"head": info_doc, "tail": task_doc},
                      trust_lambda, model)


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


def _check_recurrent(model, model_path: Path, leaves: Sequence[str]) -> None:
    check_recurrent_layers(model, model_path, leaves, [leaf for leaf in LEAVES if LEAVES[leaf] in QAT_NODES])


def optimize(
    model_path: Path,
    data_path: Path | Samples,
    out: Path,
    recipe: Recipe,
    *,
    trust_lambda: bool = False,
    reuse: bool = True,
    executor: str = "local",
    ray_address: str | None = None,
    targets: Sequence[Target] = (),
    compile_options: CompileOptions | None = None,
    runner: StageRunner | None = None,
) -> OptimizeOutcome:
    """Run the nodes the requested leaves need, convert and score every leaf, and compile each leaf for
    ``targets`` (none: no compiles) with ``compile_options``: :func:`load_inputs`, then :func:`run_tree`.

    The stages form one task graph (:mod:`edgedeploy.core.graph`); every task whose parents are done starts at
    once: in this process (``recipe.jobs`` 1), in ``recipe.jobs`` worker processes, or as Ray tasks
    (``executor="ray"``, :mod:`edgedeploy.pipeline.runners.ray`); compiles go to the Vela pool (or Ray) as soon as their leaf
    exists. ``runner`` (from :func:`make_runner`) lets several calls share one; the caller then closes it. The
    results and the run folder are the same whichever runs the work."""
    from edgedeploy.pipeline.compile import check_executor

    check_executor(executor)
    inputs = load_inputs(model_path, data_path, out, recipe, trust_lambda=trust_lambda)
    own_runner = runner is None
    if runner is None:
        runner = make_runner(executor, ray_address, recipe.jobs)
    try:
        return run_tree(inputs, out, recipe, runner, targets=targets, compile_options=compile_options, reuse=reuse)
    finally:
        if own_runner:
            runner.close()


def run_tree(inputs: TreeInputs, out: Path, recipe: Recipe, runner: StageRunner, *, targets: Sequence[Target] = (),
             compile_options: CompileOptions | None = None, reuse: bool = True) -> OptimizeOutcome:
    """The nodes ``recipe``'s leaves need, the leaves and their compiles for ``targets``, on ``runner``, into the run
    folder ``out`` (its manifest records the model, data, recipe and task first)."""
    _check_recurrent(inputs.model, inputs.model_path, recipe.leaves)
    data = inputs.for_recipe(recipe)
    # at least min_steps optimizer steps per trained stage, whatever the size of the data
    recipe, fit_length = stretch(recipe, len(training_set(data, recipe).x))
    ctx = RunContext.open(out)
    ctx.manifest.tools.update(inputs.versions)
    ctx.manifest.info["optimize"] = {**inputs.manifest_info["head"], "recipe": recipe.to_dict(),
                                     "fit_length": fit_length, **inputs.manifest_info["tail"]}
    ctx.manifest.save()
    try:
        with tfenv.caller_layer_names():  # (stages here count layer names from the start)
            return _TreeGraph(ctx, runner, recipe, inputs, reuse, list(targets), compile_options).run()
    finally:
        handoff.drop()  # the last node's model, kept here for its leaf (stage workers keep theirs until they end)


def make_runner(executor: str = "local", ray_address: str | None = None, jobs: int = 1) -> StageRunner:
    """Where the stages' work runs: this process or ``jobs`` local workers, or Ray tasks. One runner can serve
    several :func:`optimize` calls (a walk, level by level); the caller closes it."""
    if executor == "ray":
        from edgedeploy.pipeline.runners.ray import RayStages

        return RayStages(ray_address)
    from edgedeploy.pipeline.runners.local import LocalStages

    return LocalStages(jobs)


class _TreeGraph:
    """Every node, leaf and compile of one tree as one task graph (:mod:`edgedeploy.core.graph`): each ready task
    starts at once on the runner; its result is recorded here, in this thread."""

    def __init__(self, ctx: RunContext, runner: StageRunner, recipe: Recipe, inputs: TreeInputs, reuse: bool, targets: list,
                 compile_options) -> None:
        from edgedeploy.pipeline.compile import CompileOptions, CompileOutcome

        self.ctx, self.runner, self.recipe, self.inputs, self.reuse = ctx, runner, recipe, inputs, reuse
        self.options = compile_options or CompileOptions()
        self.by_name = {t.name: t for t in targets}
        self.budget = recipe.palette.get("size_budget") is not None
        self.graph = build_graph(list(recipe.leaves), list(self.by_name), palette_budget=self.budget)
        self.n_compiles = sum(1 for t in self.graph.values() if t.kind == "compile")
        self.records: dict[str, StageRecord] = {}
        self.pending: dict[str, Any] = {}
        self.futures: dict[str, Future] = {}  # the stages submitted to the runner in this run
        self.compiled = CompileOutcome(ctx.run_dir)

    def path_of(self, node: str) -> Path:
        return self.ctx.manifest.resolve(self.records[node_id(node)].outputs[0])

    def stage_of(self, task: GraphTask) -> tuple[StageSpec, dict[str, Path], Any, tuple]:
        """A node's or a leaf's stage: its identity, input files, and the registry's function with its arguments."""
        recipe, data, versions = self.recipe, self.inputs.data_path, self.inputs.versions
        if task.kind == "node":
            parent = NODE_TABLE[task.name].parent
            inputs = {"data": data, "model": self.inputs.model_path if parent is None else self.path_of(parent)}
            if NODE_TABLE[task.name].technique == "palette" and self.budget:
                inputs["baseline_model"] = self.path_of("baseline")  # the size budget is a fraction of its ptq leaf's
            spec = StageSpec("optimize", task.name, parent=node_id(parent) if parent else None,
                             params=recipe.node_params(task.name), tool_versions=versions)
            return spec, inputs, TECHNIQUES[NODE_TABLE[task.name].technique], (
                self.inputs.data, recipe, self.inputs.loss, self.inputs.trust_lambda)
        node = LEAVES[task.name]
        inputs = {"data": data, "model": self.path_of(node)}
        parent = NODE_TABLE[node].parent
        if node in QAT_NODES and parent is not None:  # (a QAT node trains from its parent's model)
            inputs["parent_model"] = self.path_of(parent)
        params = {"float_io": recipe.float_io, "calibration_samples": recipe.calibration_samples,
                  "calibration_choice": "random",
                  "sparsity": recipe.sparsity, "clusters": recipe.clusters, "tolerance": recipe.sparsity_tolerance,
                  "skip_layers": list(recipe.skip_layers), "per_channel_clusters": recipe.per_channel_clusters}
        spec = StageSpec("convert", task.name, parent=node_id(node), params=params, tool_versions=versions)
        return spec, inputs, CONVERSIONS[LEAF_TABLE[task.name].conversion], (self.inputs.data, recipe)

    def begin(self, task: GraphTask) -> Future | None:
        from edgedeploy.pipeline.compile import start_compile

        if task.kind == "compile":
            leaf = self.records[leaf_id(task.name)]
            int8 = leaf.output("int8_model")
            assert int8 is not None  # (a leaf's convert stage records its int8 model)
            got = start_compile(self.ctx, task.name, self.ctx.manifest.resolve(int8), leaf.id,
                                self.by_name[task.target], self.options,
                                lambda: self.runner.vela(self.options, self.n_compiles))
            if isinstance(got, StageRecord):
                self.records[task.id] = got
                self.compiled.cached_ids.add(got.id)
                return None
            self.pending[task.id] = got
            return got.run.job
        spec, inputs, fn, args = self.stage_of(task)
        begun = begin_stage(self.ctx, spec, inputs, reuse=self.reuse)
        if isinstance(begun, StageRecord):
            self.records[task.id] = begun
            return None
        self.pending[task.id] = begun
        # a leaf asks for the worker that trained its node in this run, where that model still is
        after = self.futures.get(node_id(LEAVES[task.name])) if task.kind == "leaf" else None
        try:  # (Ray is joined on the first submit: an address where nothing answers leaves no staging folder)
            future = self.futures[task.id] = self.runner.submit(fn, task.name, dict(inputs), begun.staged, *args,
                                                                after=after)
        except BaseException:
            del self.pending[task.id]
            shutil.rmtree(begun.staged, ignore_errors=True)
            raise
        return future

    def finish(self, task: GraphTask, future: Future | None) -> None:
        from edgedeploy.pipeline.compile import finish_compile

        if future is None:
            return
        item = self.pending.pop(task.id)
        if task.kind == "compile":
            self.records[task.id] = finish_compile(self.ctx, item)
        else:
            self.records[task.id] = end_stage(self.ctx, item, lambda: self.runner.collect(future, item.staged))

    def run(self) -> OptimizeOutcome:
        from edgedeploy.pipeline.compile import end_compiles

        run = run_graph(self.graph, self.begin, self.finish, raise_first=False, before_wait=self.runner.start_queued)
        outcome = OptimizeOutcome(self.ctx.run_dir, order=run.order)
        for task in self.graph.values():  # in the graph's order, whatever order they finished in
            rec = self.records.get(task.id)
            if rec is None:
                continue
            {"node": outcome.nodes, "leaf": outcome.leaves}.get(task.kind, {})[task.name] = rec
            if task.kind == "compile":
                self.compiled.records.append(rec)
        if run.failed:
            raise run.failed[min(run.failed, key=list(self.graph).index)]
        if self.by_name:
            end_compiles(self.ctx, self.compiled.records, self.options)
            outcome.compiled = self.compiled
        return outcome
