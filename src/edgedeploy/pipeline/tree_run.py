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
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Sequence

from edgedeploy.config.data import load_dataset, read_targets
from edgedeploy.keras.model import check_recurrent_layers, load_model
from edgedeploy.core.manifest import StageRecord
from edgedeploy.config.recipe import Recipe, check_layers
from edgedeploy.errors import UsageError
from edgedeploy.core.stage import RunContext, StageSpec, begin_stage, end_stage
from edgedeploy.core.graph import Task, build_graph, leaf_id, node_id, run_graph
from edgedeploy.config.tree import LEAF_TABLE, LEAVES, NODE_TABLE, QAT_NODES, nodes_for
from edgedeploy.config.task import decide
from edgedeploy.optimize.finetune.fit import teacher_targets, training_set
from edgedeploy.optimize.finetune.length import stretch
from edgedeploy.optimize.registry import CONVERSIONS, TECHNIQUES

if TYPE_CHECKING:
    from edgedeploy.pipeline.compile import CompileOptions
    from edgedeploy.data_sources import Samples
    from edgedeploy.config.targets import Target

log = logging.getLogger("edgedeploy")


@dataclass
class OptimizeOutcome:
    run_dir: Path
    leaves: dict[str, StageRecord] = field(default_factory=dict)
    nodes: dict[str, StageRecord] = field(default_factory=dict)
    compiled: Any = None  # the CompileOutcome of the compiles asked for with ``targets``
    order: list[str] = field(default_factory=list)  # the stage ids in the order their tasks started


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
    runner=None,
) -> OptimizeOutcome:
    """Run the nodes the requested leaves need, convert and score every leaf, and compile each leaf for
    ``targets`` (none: no compiles) with ``compile_options``.

    The stages form one task graph (:mod:`edgedeploy.core.graph`); every task whose parents are done starts at
    once: in this process (``recipe.jobs`` 1), in ``recipe.jobs`` worker processes, or as Ray tasks
    (``executor="ray"``, :mod:`edgedeploy.pipeline.runners.ray`); compiles go to the Vela pool (or Ray) as soon as their leaf
    exists. ``runner`` (from :func:`make_runner`) lets several calls share one; the caller then closes it. The
    results and the run folder are the same whichever runs the work."""
    from edgedeploy.keras import tfenv

    from edgedeploy.data_sources import DataOptions, prepare_data

    model_path = Path(model_path)
    if executor not in ("local", "ray"):
        raise UsageError(f"--executor is '{executor}'", "use local or ray")
    env = tfenv.load()
    # Check every input before anything is written.
    model, info = load_model(model_path, trust_lambda)
    check_recurrent_layers(model, model_path, recipe.leaves, [leaf for leaf in LEAVES if LEAVES[leaf] in QAT_NODES])
    check_layers(recipe, [layer.name for layer in model.layers] + [f"{layer.name}_depthwise" for layer in model.layers
                                                                   if type(layer).__name__ == "SeparableConv2D"],
                 str(model_path))
    # a class folder, in-memory samples or a preprocessing function: one .npz in the run folder that every stage reads
    data_path, data_source = prepare_data(data_path, tuple(model.input_shape[1:]), Path(out),
                                          DataOptions.from_recipe(recipe))
    # the task (loss and metric) from the recipe, the model's compile config or the data; contradicting targets
    # stop here, before anything trains
    labels, has_anomaly = read_targets(data_path)
    loss = decide(model, info.training_config, data_path, labels, loss=recipe.loss or None,
                  metric=recipe.metric or None, has_anomaly=has_anomaly)
    num_classes = int(model.output_shape[-1])
    data = load_dataset(data_path, tuple(model.input_shape[1:]), num_classes, kind=loss.kind)
    data.task = loss
    if data.reshaped_from:
        log.warning("%s: samples reshaped from %s to the model input %s", data_path, list(data.reshaped_from),
                    list(model.input_shape[1:]))
    if recipe.distill and any(NODE_TABLE[n].technique for n in nodes_for(list(recipe.leaves))):
        data.soft_targets = teacher_targets(model, data.x_fit, loss.from_logits, loss.classifier)
    # at least min_steps optimizer steps per trained stage, whatever the size of the data
    recipe, fit_length = stretch(recipe, len(training_set(data, recipe).x))
    ctx = RunContext.open(out)
    ctx.manifest.tools.update(env.versions)
    ctx.manifest.info["optimize"] = {
        "model": str(model_path.resolve()),
        "data": data.describe(),
        **({"data_source": data_source} if data_source else {}),
        "recipe": recipe.to_dict(),
        "fit_length": fit_length,
        "loss": {"name": loss.name, "from_logits": loss.from_logits, "source": loss.source},
        **({} if loss.classifier else {"task": loss.describe()}),
    }
    ctx.manifest.save()
    own_runner = runner is None
    if runner is None:
        runner = make_runner(executor, ray_address, recipe.jobs)
    try:
        return _run_tree(ctx, runner, recipe, model_path, data_path, data, loss, dict(env.versions), trust_lambda,
                         reuse, list(targets), compile_options)
    finally:
        if own_runner:
            runner.close()


def make_runner(executor: str = "local", ray_address: str | None = None, jobs: int = 1):
    """Where the stages' work runs: this process or ``jobs`` local workers, or Ray tasks. One runner can serve
    several :func:`optimize` calls (a walk, level by level); the caller closes it."""
    if executor == "ray":
        from edgedeploy.pipeline.runners.ray import RayStages

        return RayStages(ray_address)
    from edgedeploy.pipeline.runners.local import LocalStages

    return LocalStages(jobs)


def _run_tree(ctx, runner, recipe, model_path, data_path, data, loss, versions, trust_lambda, reuse, targets,
              compile_options) -> OptimizeOutcome:
    """Every node, leaf and compile as one task graph (:mod:`edgedeploy.core.graph`): each ready task starts at once
    on ``runner``; its result is recorded here, in this thread."""
    from edgedeploy.pipeline.compile import (
        CompileOptions,
        CompileOutcome,
        end_compiles,
        finish_compile,
        start_compile,
    )

    options = compile_options or CompileOptions()
    by_name = {t.name: t for t in targets}
    budget = recipe.palette.get("size_budget") is not None
    graph = build_graph(list(recipe.leaves), list(by_name), palette_budget=budget)
    n_compiles = sum(1 for t in graph.values() if t.kind == "compile")
    records: dict[str, StageRecord] = {}
    pending: dict[str, Any] = {}
    compiled = CompileOutcome(ctx.run_dir)

    def path_of(node: str) -> Path:
        return ctx.manifest.resolve(records[node_id(node)].outputs[0])

    def begin(task: Task) -> Future | None:
        if task.kind == "compile":
            leaf = records[leaf_id(task.name)]
            got = start_compile(ctx, task.name, ctx.manifest.resolve(leaf.output("int8_model")), leaf.id,
                                by_name[task.target], options, lambda: runner.vela(options, n_compiles))
            if isinstance(got, StageRecord):
                records[task.id] = got
                compiled.cached_ids.add(got.id)
                return None
            pending[task.id] = got
            return got.job
        if task.kind == "node":
            parent = NODE_TABLE[task.name].parent
            inputs = {"data": data_path, "model": model_path if parent is None else path_of(parent)}
            if NODE_TABLE[task.name].technique == "palette" and budget:
                inputs["baseline_model"] = path_of("baseline")  # the size budget is a fraction of its ptq leaf's
            spec = StageSpec("optimize", task.name, parent=node_id(parent) if parent else None,
                             params=recipe.node_params(task.name), tool_versions=versions)
            fn, args = TECHNIQUES[NODE_TABLE[task.name].technique], (data, recipe, loss, trust_lambda)
        else:
            node = LEAVES[task.name]
            inputs = {"data": data_path, "model": path_of(node)}
            if node in QAT_NODES:
                inputs["parent_model"] = path_of(NODE_TABLE[node].parent)
            params = {"float_io": recipe.float_io, "calibration_samples": recipe.calibration_samples,
                      "calibration_choice": "random",
                      "sparsity": recipe.sparsity, "clusters": recipe.clusters, "tolerance": recipe.sparsity_tolerance,
                      "skip_layers": list(recipe.skip_layers), "per_channel_clusters": recipe.per_channel_clusters}
            spec = StageSpec("convert", task.name, parent=node_id(node), params=params, tool_versions=versions)
            fn, args = CONVERSIONS[LEAF_TABLE[task.name].conversion], (data, recipe)
        got = begin_stage(ctx, spec, inputs, reuse=reuse)
        if isinstance(got, StageRecord):
            records[task.id] = got
            return None
        pending[task.id] = got
        return runner.submit(fn, task.name, dict(inputs), got.staged, *args)

    def finish(task: Task, future: Future | None) -> None:
        if future is None:
            return
        item = pending.pop(task.id)
        if task.kind == "compile":
            records[task.id] = finish_compile(ctx, item)
        else:
            records[task.id] = end_stage(ctx, item, lambda: runner.collect(future, item.staged))

    run = run_graph(graph, begin, finish, raise_first=False)
    outcome = OptimizeOutcome(ctx.run_dir, order=run.order)
    for task in graph.values():  # in the graph's order, whatever order they finished in
        rec = records.get(task.id)
        if rec is None:
            continue
        {"node": outcome.nodes, "leaf": outcome.leaves}.get(task.kind, {})[task.name] = rec
        if task.kind == "compile":
            compiled.records.append(rec)
    if run.failed:
        raise run.failed[min(run.failed, key=list(graph).index)]
    if targets:
        end_compiles(ctx, compiled.records, options)
        outcome.compiled = compiled
    return outcome
