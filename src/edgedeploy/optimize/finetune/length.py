"""How long each stage fine-tunes: at least ``min_steps`` optimizer steps, whatever the size of the data.

An epoch count alone makes training length follow the data: two epochs are some 90 steps on 3,000 clips and
28 on 900 (batch 64), too few for a pruned or clustered model to recover. With ``[training] min_steps``
each trained stage gets ``max(epochs, ceil(min_steps / steps_per_epoch))`` epochs, where steps per epoch
count the samples the stage trains on (:func:`~edgedeploy.optimize.finetune.fit.training_set`: the fine-tune split less
its hold-out). The stretched epochs become
the recipe's per-stage epochs, so the pruning schedule, the learning-rate schedule, batch-norm freezing and
the stage cache keys all follow them. ``min_steps = 0`` keeps the epochs as given.
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any

from edgedeploy.config.recipe import STAGE_KINDS, Recipe


def stretch(recipe: Recipe, samples: int) -> tuple[Recipe, dict[str, Any]]:
    """The recipe with per-stage epochs raised to reach ``recipe.min_steps``, and what was done."""
    steps = max(1, math.ceil(samples / recipe.batch_size))
    epochs: dict[str, list[int]] = {}
    stage_epochs = dict(recipe.stage_epochs)
    for kind in STAGE_KINDS:
        asked = recipe.stage(kind).epochs
        used = asked
        if asked > 0 and recipe.min_steps > 0 and asked * steps < recipe.min_steps:
            used = math.ceil(recipe.min_steps / steps)
            stage_epochs[kind] = used
        epochs[kind] = [asked, used]
    record = {"min_steps": recipe.min_steps, "train_samples": samples, "batch_size": recipe.batch_size,
              "steps_per_epoch": steps, "epochs": {k: {"asked": a, "used": u, "steps": u * steps}
                                                   for k, (a, u) in epochs.items()}}
    if stage_epochs == dict(recipe.stage_epochs):
        return recipe, record
    return replace(recipe, stage_epochs=stage_epochs), record
