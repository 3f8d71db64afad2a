"""What every technique of the tree reads from the recipe: which layers it optimizes, and whether it fine-tunes
on mirrored images as well."""

from __future__ import annotations

from edgedeploy.config.recipe import Recipe
from edgedeploy.keras.model import base_name, inner


def optimizable(layer, recipe: Recipe) -> bool:
    kind = inner(layer).__class__.__name__
    return kind in ("Conv2D", "Dense") and base_name(layer.name) not in recipe.skip_layers


def mirrored(run) -> bool:
    """The node fine-tunes on mirrored images as well: ``thin_augment = "hflip"`` in the thinned branch."""
    return run.recipe.thin_augment == "hflip" and run.node.keeps_channels
