"""The deployment tree as one task graph: every node the requested leaves need, every leaf, and their compiles.

Each node of the tree (:data:`edgedeploy.config.tree.NODE_TABLE`) is one stage, ``optimize/<node>``, trained once from
its parent's saved model and reused by all its children; every branch starts from its own fresh copy of the
parent (TFMOT wrappers change the layers they wrap). Each leaf is converted (``convert/<leaf>``) and, when
targets are given, compiled for each (``compile/<leaf>/<target>``). The stages are the tasks of one graph
(:mod:`edgedeploy.core.graph`): each starts as soon as the stages it reads are done, its work here, in worker
processes (:mod:`edgedeploy.pipeline.runners.local`) or on Ray (:mod:`edgedeploy.pipeline.runners.ray`), its record written here.
The functions that run a node's technique or a leaf's conversion are looked up in
:mod:`edgedeploy.optimize.registry`. The driver (:func:`edgedeploy.pipeline.driver.run`) opens the graph
(:func:`open_tree`), runs it (:meth:`TreeGraph.run`) and gates its compiles (:meth:`TreeGraph.gate`)."""

from __future__ import annotations

import shutil
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Sequence

from edgedeploy.keras import tfenv
from edgedeploy.core.manifest import StageRecord
from edgedeploy.config.recipe import Recipe
from edgedeploy.core.stage import RunContext, StageSpec, begin_stage, end_stage
from edgedeploy.core.graph import GraphTask, build_graph, leaf_id, node_id, run_graph
from edgedeploy.config.tree import LEAF_TABLE, LEAVES, NODE_TABLE, QAT_NODES
from edgedeploy.optimize.finetune.fit import training_set
from edgedeploy.optimize.finetune.length import stretch
from edgedeploy.optimize import handoff
from edgedeploy.optimize.registry import CONVERSIONS, TECHNIQUES
from edgedeploy.pipeline.run_plan import TreeInputs, check_recurrent

if TYPE_CHECKING:
    from edgedeploy.pipeline.runners import StageRunner
    from edgedeploy.pipeline.compile import CompileOptions
    from edgedeploy.config.targets import Target

@dataclass
class OptimizeOutcome:
    """One tree run: the record of every leaf and trained node, the compiles asked for, the order tasks started."""

    run_dir: Path
    leaves: dict[str, StageRecord] = field(default_factory=dict)
    nodes: dict[str, StageRecord] = field(default_factory=dict)
    compiled: Any = None  # the CompileOutcome of the compiles asked for with ``targets``
    order: list[str] = field(default_factory=list)  # the stage ids in the order their tasks started


def open_tree(inputs: TreeInputs, out: Path, recipe: Recipe, runner: StageRunner, *, targets: Sequence[Target] = (),
              compile_options: CompileOptions | None = None, reuse: bool = True) -> TreeGraph:
    """The task graph of the nodes ``recipe``'s leaves need, the leaves and their compiles for ``targets``, to run
    on ``runner`` into the run folder ``out``, whose manifest records the model, data, recipe and task first."""
    check_recurrent(inputs.model, inputs.model_path, recipe.leaves)
    data = inputs.for_recipe(recipe)
    # at least min_steps optimizer steps per trained stage, whatever the size of the data
    recipe, fit_length = stretch(recipe, len(training_set(data, recipe).x))
    ctx = RunContext.open(out)
    ctx.manifest.tools.update(inputs.versions)
    ctx.manifest.info["optimize"] = {**inputs.manifest_info["head"], "recipe": recipe.to_dict(),
                                     "fit_length": fit_length, **inputs.manifest_info["tail"]}
    ctx.manifest.save()
    return TreeGraph(ctx, runner, recipe, inputs, reuse, list(targets), compile_options)


class TreeGraph:
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
        """Every task, each started as soon as its parents are done; the first failure (in the graph's order)
        raised once every other task has ended."""
        try:
            with tfenv.caller_layer_names():  # (stages here count layer names from the start)
                run = run_graph(self.graph, self.begin, self.finish, raise_first=False,
                                before_wait=self.runner.start_queued)
        finally:
            handoff.drop()  # the last node's model, kept here for its leaf (stage workers keep theirs until they end)
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
        return outcome

    def gate(self, outcome: OptimizeOutcome) -> None:
        """After the compiles: Vela's version in the manifest, and
        :class:`~edgedeploy.errors.CpuFallbackError` when an operator runs on the CPU and that was not allowed."""
        from edgedeploy.pipeline.compile import end_compiles

        if self.by_name:
            end_compiles(self.ctx, self.compiled.records, self.options)
            outcome.compiled = self.compiled
