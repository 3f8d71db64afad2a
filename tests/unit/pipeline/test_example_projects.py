"""Every project file under examples/ loads as `edgedeploy compile` reads it: its keys, recipe and requirements
are valid, and the files it names are found (a project that reads the shared data folder is skipped where that
folder is absent)."""

from __future__ import annotations

from pathlib import Path

import pytest

from edgedeploy.config.tree import nodes_for
from edgedeploy.pipeline.project import load_project

EXAMPLES = Path(__file__).resolve().parents[3] / "examples"
PROJECTS = sorted(EXAMPLES.glob("*/edgedeploy.toml"))
# the shared data folder where the examples that read it look for it (beside the repository)
NEEDS_SHARED_DATA = pytest.mark.skipif(not (EXAMPLES.parents[1] / "shared" / "data").is_dir(),
                                    reason="reads the shared data folder, which is not beside this clone")


def test_the_examples_hold_project_files():
    assert {p.parent.name for p in PROJECTS} >= {"kws_tree", "sweep", "resnet8_thin_u85"}


@pytest.mark.parametrize("path", [pytest.param(p, marks=NEEDS_SHARED_DATA) if "shared/data" in p.read_text() else p
                                  for p in PROJECTS], ids=lambda p: p.parent.name)
def test_an_example_project_loads_and_names_files_that_exist(path):
    project = load_project(path)
    for model in project.models or (project,):
        assert Path(model.model).is_file(), model.model
        assert Path(model.data).is_file(), model.data
    assert nodes_for(list(project.recipe.leaves))


@NEEDS_SHARED_DATA
def test_the_thinned_2_of_4_example_holds_the_recipe_of_its_published_figures():
    """Row 22 of docs/results/thin.md's ResNet-8 2:4 runs: the bench options, written as a project's recipe."""
    project = load_project(EXAMPLES / "resnet8_thin_u85" / "edgedeploy.toml")
    r = project.recipe
    assert project.targets == ("ethos-u85-256",)
    assert project.requirements == {"max_accuracy_drop": 1.5, "max_npu_cycles": 43984}  # half ptq's 87,969
    assert (r.sparsity_pattern, r.thin_speedup, r.thin_targets, r.thin_augment) == ("2:4", 0.5, ("ethos-u85-256",),
                                                                                   "hflip")
    assert (r.epochs, r.stage_epochs, r.patience, r.distill_label_weight) == (15, {"thin": 15}, 0, 0.8)
    assert r.stage_learning_rates == {"thin": 1e-3, "prune": 1e-3} and r.skip_layers == ("dense",)
    assert (r.thin_trials, r.thin_trial_epochs) == (8, 2)
