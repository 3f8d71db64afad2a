"""The ``cluster`` and ``sparsity_preserving_cluster`` techniques: weight clustering with TFMOT, fine-tuned,
then stripped of its wrappers."""

from __future__ import annotations

from typing import Any

import numpy as np

from edgedeploy.config.data import Dataset
from edgedeploy.config.recipe import Recipe
from edgedeploy.config.task import Task
from edgedeploy.keras.model import base_name, clone, inner, kernel_of
from edgedeploy.optimize.finetune.fit import fine_tune
from edgedeploy.optimize.preserve import PER_TENSOR_FALLBACK

from .selection import mirrored, optimizable


def _too_few(values: np.ndarray, clusters: int, preserve_sparsity: bool) -> str | None:
    """Why TFMOT cannot form ``clusters`` centroids from ``values`` (one output channel, or a whole kernel), or
    None. k-means++ draws each centroid from a distinct weight: plain clustering needs more weights than centroids
    (TFMOT leaves a Conv2D with no more as it is); sparsity-preserving clustering keeps zero as a centroid of its
    own and draws the other ``clusters - 1`` from the non-zero weights, so it needs at least that many."""
    if preserve_sparsity:
        nonzero = int(np.count_nonzero(values))
        if nonzero < clusters - 1:
            return f"{nonzero} non-zero weights < {clusters - 1} non-zero clusters"
    elif values.size <= clusters:
        return f"{values.size} weights <= {clusters} clusters"
    return None


def clustering_plan(kernel: np.ndarray, clusters: int, preserve_sparsity: bool, per_channel: bool
                    ) -> tuple[str, str]:
    """How one kernel is clustered: ("per channel" | "per tensor" | "not clustered", why). A kernel asked for
    per-channel clusters whose output channels (last axis) hold too few weights is clustered per tensor; one too
    small for that too is not clustered. Either way it holds at most ``clusters`` distinct values per channel."""
    if per_channel:
        channels = np.moveaxis(kernel, -1, 0).reshape(kernel.shape[-1], -1)
        worst = min(channels, key=lambda c: np.count_nonzero(c) if preserve_sparsity else c.size)
        why = _too_few(worst, clusters, preserve_sparsity)
        if why is None:
            return "per channel", ""
        why = f"an output channel holds {why}"
        if _too_few(kernel, clusters, preserve_sparsity) is None:
            return "per tensor", why
        return "not clustered", why
    why = _too_few(kernel, clusters, preserve_sparsity)
    return ("per tensor", "") if why is None else ("not clustered", f"the kernel holds {why}")


def cluster(env, parent, data: Dataset, recipe: Recipe, loss: Task, preserve_sparsity: bool, *,
            record: dict | None = None, mirrored: bool = False):
    from tensorflow_model_optimization.python.core.clustering.keras.cluster_config import GradientAggregation
    from tensorflow_model_optimization.python.core.clustering.keras.cluster_wrapper import ClusterWeights

    keras, clustering = env.keras, env.tfmot.clustering.keras
    aggregation = {"sum": GradientAggregation.SUM, "avg": GradientAggregation.AVG}[recipe.cluster_gradient_aggregation]
    init = {
        "kmeans++": clustering.CentroidInitialization.KMEANS_PLUS_PLUS,
        "linear": clustering.CentroidInitialization.LINEAR,
        "density": clustering.CentroidInitialization.DENSITY_BASED,
        "random": clustering.CentroidInitialization.RANDOM,
    }[recipe.centroid_init]

    fallback: dict[str, str] = {}

    def wrap(layer):
        if not optimizable(layer, recipe):
            return layer
        conv = inner(layer).__class__.__name__ == "Conv2D"
        how, why = clustering_plan(kernel_of(layer), recipe.clusters, preserve_sparsity,
                                   recipe.per_channel_clusters and conv)
        if why:
            fallback[base_name(layer.name)] = f"{PER_TENSOR_FALLBACK if how == 'per tensor' else how}: {why}"
        if how == "not clustered":
            return layer
        kwargs = {"preserve_sparsity": preserve_sparsity, "cluster_gradient_aggregation": aggregation}
        if how == "per channel":
            # TFMOT's own size check counts a Conv2D's channels from its last trainable weight, which is the
            # kernel itself when the layer has no bias; the plan above has counted them, so wrap directly.
            return ClusterWeights(layer, recipe.clusters, init, cluster_per_channel=True, **kwargs)
        return clustering.cluster_weights(layer, number_of_clusters=recipe.clusters,
                                          cluster_centroids_init=init, **kwargs)

    model = keras.models.clone_model(clone(parent), clone_function=wrap)
    report = fine_tune(env, model, data, recipe, "cluster", loss, "cluster", record=record, mirrored=mirrored)
    report["clustering"] = {"clusters": recipe.clusters, "centroid_init": recipe.centroid_init,
                            "preserve_sparsity": preserve_sparsity, "per_channel": recipe.per_channel_clusters,
                            "centroid_gradient": recipe.cluster_gradient_aggregation,
                            "centroid_learning_rate": "the stage's (TFMOT 0.8.1 has no separate centroid rate)",
                            "fallback_layers": fallback}
    return clustering.strip_clustering(model)


def cluster_node(run) -> Any:
    return cluster(run.env, run.parent(), run.data, run.recipe, run.loss,
                   preserve_sparsity=bool(run.node.settings.get("preserve_sparsity", False)), record=run.training,
                   mirrored=mirrored(run))
