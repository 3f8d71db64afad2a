"""The ``cluster`` and ``sparsity_preserving_cluster`` techniques: weight clustering with TFMOT, fine-tuned,
then stripped of its wrappers."""

from __future__ import annotations

from typing import Any

from edgedeploy.config.data import Dataset
from edgedeploy.config.recipe import Recipe
from edgedeploy.config.task import Task
from edgedeploy.keras.model import clone, inner
from edgedeploy.optimize.finetune.fit import fine_tune

from .selection import mirrored, optimizable


def cluster(env, parent, data: Dataset, recipe: Recipe, loss: Task, preserve_sparsity: bool, *,
            record: dict | None = None, mirrored: bool = False):
    from tensorflow_model_optimization.python.core.clustering.keras.cluster_config import GradientAggregation

    keras, clustering = env.keras, env.tfmot.clustering.keras
    aggregation = {"sum": GradientAggregation.SUM, "avg": GradientAggregation.AVG}[recipe.cluster_gradient_aggregation]
    init = {
        "kmeans++": clustering.CentroidInitialization.KMEANS_PLUS_PLUS,
        "linear": clustering.CentroidInitialization.LINEAR,
        "density": clustering.CentroidInitialization.DENSITY_BASED,
        "random": clustering.CentroidInitialization.RANDOM,
    }[recipe.centroid_init]

    def wrap(layer):
        if optimizable(layer, recipe):
            kwargs = {"preserve_sparsity": preserve_sparsity, "cluster_gradient_aggregation": aggregation}
            if recipe.per_channel_clusters and inner(layer).__class__.__name__ == "Conv2D":
                kwargs["cluster_per_channel"] = True
            return clustering.cluster_weights(layer, number_of_clusters=recipe.clusters,
                                              cluster_centroids_init=init, **kwargs)
        return layer

    model = keras.models.clone_model(clone(parent), clone_function=wrap)
    report = fine_tune(env, model, data, recipe, "cluster", loss, "cluster", record=record, mirrored=mirrored)
    report["clustering"] = {"clusters": recipe.clusters, "centroid_init": recipe.centroid_init,
                            "preserve_sparsity": preserve_sparsity, "per_channel": recipe.per_channel_clusters,
                            "centroid_gradient": recipe.cluster_gradient_aggregation,
                            "centroid_learning_rate": "the stage's (TFMOT 0.8.1 has no separate centroid rate)"}
    return clustering.strip_clustering(model)


def cluster_node(run) -> Any:
    return cluster(run.env, run.parent(), run.data, run.recipe, run.loss,
                   preserve_sparsity=bool(run.node.settings.get("preserve_sparsity", False)), record=run.training,
                   mirrored=mirrored(run))
