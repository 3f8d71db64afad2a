"""The walk over the deployment tree: every node the requested leaves need, parents first, then every leaf.

Each node of the tree (:data:`edgedeploy.tree.NODE_TABLE`) is one stage, ``optimize/<node>``, trained once from
its parent's saved model and reused by all its children; every branch starts from its own fresh copy of the
parent (TFMOT wrappers change the layers they wrap). Each leaf is then converted (``convert/<leaf>``). The
functions that run a node's technique or a leaf's conversion are looked up in
:mod:`edgedeploy.optimize.registry`.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path

from ..data import load_dataset, read_targets
from ..keras_model import check_recurrent_layers, load_model
from ..manifest import StageRecord
from ..recipe import Recipe, check_layers
from ..stages import RunContext, StageSpec, run_stage
from ..tree import LEAF_TABLE, LEAVES, NODE_TABLE, QAT_NODES, nodes_for
from ..task import decide
from .fit import teacher_targets, training_set
from .fitlength import stretch
from .registry import CONVERSIONS, TECHNIQUES

log = logging.getLogger("edgedeploy")


@dataclass
class OptimizeOutcome:
    run_dir: Path
    leaves: dict[str, StageRecord] = field(default_factory=dict)
    nodes: dict[str, StageRecord] = field(default_factory=dict)


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
    from .. import tfenv

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
    # the task (loss and metric) from the recipe, the model's compile config or the data; contradicting targets
    # stop here, before anything trains
    targets, has_anomaly = read_targets(data_path)
    loss = decide(model, info.training_config, data_path, targets, loss=recipe.loss or None,
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
        "recipe": recipe.to_dict(),
        "fit_length": fit_length,
        "loss": {"name": loss.name, "from_logits": loss.from_logits, "source": loss.source},
        **({} if loss.classifier else {"task": loss.describe()}),
    }
    ctx.manifest.save()
    outcome = OptimizeOutcome(ctx.run_dir)
    versions = dict(env.versions)
    paths: dict[str, Path] = {}
    remote = None
    if executor == "ray":
        from ..ray_stages import RayStages

        remote = RayStages(ray_address)

    def work(fn, *args):  # a stage's work: here, or as a Ray task
        return fn(env, *args) if remote is None else remote.call(fn, *args)

    try:
        for node in nodes_for(list(recipe.leaves)):
            parent = NODE_TABLE[node].parent
            inputs = {"data": data_path, "model": model_path if parent is None else paths[parent]}
            if NODE_TABLE[node].technique == "palette" and recipe.palette.get("size_budget") is not None:
                inputs["baseline_model"] = paths["baseline"]  # the size budget is a fraction of its ptq leaf's
            spec = StageSpec("optimize", node, parent=f"optimize/{parent}" if parent else None,
                             params=recipe.node_params(node), tool_versions=versions)
            rec = run_stage(ctx, spec, inputs, lambda d, n=node, i=inputs: work(
                TECHNIQUES[NODE_TABLE[n].technique], n, i, d, data, recipe, loss, trust_lambda), reuse=reuse)
            outcome.nodes[node] = rec
            paths[node] = ctx.manifest.resolve(rec.outputs[0])
        for leaf in recipe.leaves:
            node = LEAVES[leaf]
            inputs = {"data": data_path, "model": paths[node]}
            if node in QAT_NODES:
                inputs["parent_model"] = paths[NODE_TABLE[node].parent]
            params = {"float_io": recipe.float_io, "calibration_samples": recipe.calibration_samples,
                      "calibration_choice": "random",
                      "sparsity": recipe.sparsity, "clusters": recipe.clusters, "tolerance": recipe.sparsity_tolerance,
                      "skip_layers": list(recipe.skip_layers), "per_channel_clusters": recipe.per_channel_clusters}
            spec = StageSpec("convert", leaf, parent=f"optimize/{node}", params=params, tool_versions=versions)
            rec = run_stage(ctx, spec, inputs, lambda d, l=leaf, i=inputs: work(
                CONVERSIONS[LEAF_TABLE[l].conversion], l, i, d, data, recipe),
                            reuse=reuse)
            outcome.leaves[leaf] = rec
    finally:
        if remote is not None:
            remote.close()
    return outcome

