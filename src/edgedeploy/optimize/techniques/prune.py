"""The ``prune`` technique: magnitude pruning with TFMOT (or the Ethos-U85's 2:4 pattern, see
:mod:`.two_of_four`), fine-tuned, then stripped of its wrappers."""

from __future__ import annotations

from typing import Any

from edgedeploy.config.data import Dataset
from edgedeploy.config.recipe import Recipe
from edgedeploy.config.task import Task
from edgedeploy.errors import UsageError
from edgedeploy.keras.model import clone
from edgedeploy.optimize.finetune.fit import fine_tune, training_set

from .selection import mirrored, optimizable


def prune(env, parent, data: Dataset, recipe: Recipe, loss: Task, *, record: dict | None = None,
          mirrored: bool = False):
    from edgedeploy.optimize.finetune.loop import pruning_plan

    keras, sparsity = env.keras, env.tfmot.sparsity.keras
    settings = recipe.stage("prune")
    if settings.epochs < 1:
        raise UsageError("pruning needs at least one epoch of fine-tuning", "set [stages.prune] epochs >= 1")
    ts = training_set(data, recipe, mirrored)
    plan = pruning_plan(recipe.pruning_schedule, ts.steps_per_epoch(recipe.batch_size), settings.epochs,
                        recipe.pruning_end_fraction)
    if plan.kind == "polynomial":
        schedule = sparsity.PolynomialDecay(initial_sparsity=0.0, final_sparsity=recipe.sparsity,
                                            begin_step=plan.begin_step, end_step=plan.end_step,
                                            frequency=plan.frequency)
    else:
        schedule = sparsity.ConstantSparsity(recipe.sparsity, begin_step=plan.begin_step, frequency=plan.frequency)

    pattern = None
    if recipe.sparsity_pattern == "2:4":  # Ethos-U85 structured sparsity (edgedeploy.optimize.techniques.two_of_four)
        from edgedeploy.optimize.techniques.two_of_four import TwoOfFour

        pattern = TwoOfFour(env, plan)

    def wrap(layer):
        if optimizable(layer, recipe):
            if pattern is not None:
                return pattern.wrap(layer)
            return sparsity.prune_low_magnitude(layer, pruning_schedule=schedule)
        return layer

    model = keras.models.clone_model(clone(parent), clone_function=wrap)
    callbacks = [sparsity.UpdatePruningStep()] + ([pattern.callback()] if pattern is not None else [])
    report = fine_tune(env, model, data, recipe, "prune", loss, "prune", callbacks=callbacks,
                       train_set=ts, eligible_from=plan.full_epoch, record=record)
    report["pruning"] = {"target_sparsity": recipe.sparsity, **plan.to_dict(),
                         **({"structured": pattern.describe()} if pattern is not None else {})}
    return sparsity.strip_pruning(model)


def prune_node(run) -> Any:
    return prune(run.env, run.parent(), run.data, run.recipe, run.loss, record=run.training, mirrored=mirrored(run))
