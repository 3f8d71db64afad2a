"""Fine-tuning length follows the data: each trained stage takes at least `min_steps` optimizer steps."""

from __future__ import annotations

import pytest

from edgedeploy.errors import UsageError
from edgedeploy.optimize.finetune.length import stretch
from edgedeploy.config.recipe import load_recipe


def test_small_data_gets_more_epochs_large_data_keeps_its_own():
    recipe = load_recipe(overrides={"epochs": 2, "batch_size": 64, "min_steps": 300})
    small, rec = stretch(recipe, 810)  # the bundled example: 900 clips less a 10% hold-out, 13 steps an epoch
    assert rec["steps_per_epoch"] == 13
    assert small.stage("prune").epochs == small.stage("cluster").epochs == small.stage("qat").epochs == 24
    assert rec["epochs"]["qat"] == {"asked": 2, "used": 24, "steps": 312}
    large, rec = stretch(recipe, 2760 * 4)  # 173 steps an epoch: two epochs are already 346 steps
    assert large is recipe and rec["epochs"]["prune"]["used"] == 2


def test_zero_keeps_epochs_and_a_stage_set_to_zero_epochs_stays_off():
    recipe = load_recipe(table={"epochs": 1, "training": {"min_steps": 0}})
    assert stretch(recipe, 100)[0] is recipe
    recipe = load_recipe(table={"epochs": 2, "stages": {"cluster": {"epochs": 0}}, "training": {"min_steps": 100}})
    out, _ = stretch(recipe, 320)  # 10 steps an epoch
    assert out.stage("cluster").epochs == 0 and out.stage("prune").epochs == 10
    # a per-stage epoch count is raised the same way, and the stage cache key follows
    assert out.node_params("pruned")["epochs"] == 10 != recipe.node_params("pruned")["epochs"]


def test_plain_recipe_keeps_epochs_and_a_negative_minimum_is_refused():
    assert load_recipe(overrides={"plain": True}).min_steps == 0
    with pytest.raises(UsageError, match="training.min_steps"):
        load_recipe(table={"training": {"min_steps": -1}})
