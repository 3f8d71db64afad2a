"""The techniques and conversions the node table (:mod:`edgedeploy.config.tree`) names, each to the function that runs
its stage. Adding a technique is one entry in the node table and one function here."""

from __future__ import annotations

from functools import partial
from typing import Callable

from edgedeploy.core.stage import StageResult
from edgedeploy.config.tree import nodes_for
from .leaf import convert_leaf
from .leaf16 import convert_leaf_16x8
from .node import keras_node_stage
from .palette import stages as palette_stages
from .techniques.baseline import baseline_node
from .techniques.cluster import cluster_node
from .techniques.prune import prune_node
from .techniques.qat import qat_node
from .techniques.thin import thin_node


def _palette_leaf(env, leaf, inputs, out, data, recipe) -> StageResult:
    result = palette_stages.convert_leaf(env, leaf, inputs, out, data, recipe)
    if recipe.sparsity_pattern == "2:4" and "pruned" in nodes_for([leaf]):  # its int8 kernels keep 2:4
        from edgedeploy.optimize.techniques.two_of_four import check_int8_file

        result.details["pattern_2of4"] = check_int8_file(result.outputs["int8_model"], leaf, recipe.skip_layers)
    return result


def _palette_node(env, node, inputs, out, data, recipe, loss, trust_lambda) -> StageResult:
    return palette_stages.train_node(env, node, inputs, out, data, recipe, loss)


# technique -> stage function (env, node, inputs, out, data, recipe, loss, trust_lambda) -> StageResult
TECHNIQUES: dict[str | None, Callable[..., StageResult]] = {
    None: partial(keras_node_stage, baseline_node),
    "prune": partial(keras_node_stage, prune_node),
    "cluster": partial(keras_node_stage, cluster_node),
    "sparsity_preserving_cluster": partial(keras_node_stage, cluster_node),
    "qat": partial(keras_node_stage, qat_node),
    "palette": _palette_node,
    "palette_qat": _palette_node,
    "thin": partial(keras_node_stage, thin_node),
}
# conversion -> stage function (env, leaf, inputs, out, data, recipe) -> StageResult
CONVERSIONS: dict[str, Callable[..., StageResult]] = {
    "int8": convert_leaf,
    "palette_int8": _palette_leaf,
    "int16x8": convert_leaf_16x8,
}
