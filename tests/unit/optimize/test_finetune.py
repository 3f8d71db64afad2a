"""Fine-tuning plans without TensorFlow: pruning and learning-rate schedules, the hold-out split, best-epoch
bookkeeping, soft targets, and the recipe keys that turn each part off."""

from __future__ import annotations

import math

import numpy as np
import pytest

from edgedeploy.config.data import load_dataset
from edgedeploy.errors import InvalidInputError, UsageError
from edgedeploy.optimize.finetune.loop import Selector, holdout_split, learning_rate_at, log_probs, pruning_plan
from edgedeploy.config.recipe import Recipe, load_recipe

# --------------------------------------------------------------------------- pruning schedule


def _tfmot_prunes(step: int, plan) -> bool:
    """TFMOT's rule (pruning_schedule.py, _should_prune_in_step), written out independently."""
    in_range = step >= plan.begin_step and (step <= plan.end_step or plan.end_step < 0)
    return in_range and (step - plan.begin_step) % plan.frequency == 0


def _polynomial(step: int, plan, target: float) -> float:
    p = min(1.0, max(0.0, (step - plan.begin_step) / (plan.end_step - plan.begin_step)))
    return target * (1 - (1 - p) ** 3)


@pytest.mark.parametrize("steps_per_epoch,epochs,fraction", [(22, 1, 0.6), (43, 4, 0.6), (87, 8, 0.5), (1, 1, 0.6),
                                                             (157, 6, 0.9), (3, 2, 1.0)])
def test_polynomial_plan_reaches_the_target_on_a_mask_update(steps_per_epoch, epochs, fraction):
    plan = pruning_plan("polynomial", steps_per_epoch, epochs, fraction)
    total = steps_per_epoch * epochs
    # TFMOT's pruning step counts batches 1..total; the last mask update must be at the target
    updates = [s for s in range(1, total + 1) if _tfmot_prunes(s, plan)]
    assert updates, plan
    assert math.isclose(_polynomial(updates[-1], plan, 0.5), 0.5)
    assert updates[-1] == plan.end_step <= total
    # the target is reached by the end of full_epoch and not before its start
    assert plan.end_step <= plan.full_epoch * steps_per_epoch
    assert plan.end_step > (plan.full_epoch - 1) * steps_per_epoch
    assert plan.full_epoch <= epochs
    # about `fraction` of the stage, leaving the rest to recover at the final sparsity
    assert plan.end_step <= max(1, round(total * fraction))


def test_polynomial_plan_ramps_in_several_updates():
    plan = pruning_plan("polynomial", 43, 4, 0.6)
    updates = [s for s in range(1, 43 * 4 + 1) if _tfmot_prunes(s, plan)]
    sparsities = [_polynomial(s, plan, 0.5) for s in updates]
    assert len(updates) >= 8 and sparsities == sorted(sparsities) and sparsities[0] < 0.25
    assert plan.full_epoch == 3  # end step 100 of 172: inside epoch 3


def test_constant_plan_is_tfmots_one_shot():
    plan = pruning_plan("constant", 43, 4, 0.6)
    assert (plan.frequency, plan.end_step, plan.full_epoch) == (100, -1, 3)
    assert pruning_plan("constant", 22, 1, 0.6).frequency == 22  # fewer steps than 100: at the last one


# --------------------------------------------------------------------------- learning rate


def test_warmup_then_cosine():
    total, warm, base = 100, 10, 1e-3
    lrs = [learning_rate_at(s, total, base, "cosine", warm) for s in range(total)]
    assert lrs[0] == pytest.approx(base / 10) and lrs[9] == pytest.approx(base)
    assert all(a < b for a, b in zip(lrs[:10], lrs[1:10]))  # rising warm-up
    assert all(a >= b for a, b in zip(lrs[10:], lrs[11:]))  # then never rising
    assert lrs[55] == pytest.approx(base / 2, rel=0.05)  # half-way through the decay
    assert lrs[-1] < base * 0.01


def test_constant_learning_rate_without_warmup_is_tfmots_plain():
    assert {learning_rate_at(s, 50, 1e-4, "constant", 0) for s in range(50)} == {1e-4}


# --------------------------------------------------------------------------- hold-out


def test_holdout_is_stratified_seeded_and_disjoint():
    rng = np.random.default_rng(3)
    y = rng.integers(0, 12, size=3066)
    y[:40] = -1  # unlabelled samples stay in training
    train, val = holdout_split(y, 0.1, seed=0)
    assert len(np.intersect1d(train, val)) == 0 and len(train) + len(val) == len(y)
    assert np.all(y[val] >= 0) and set(range(40)) <= set(train.tolist())
    for c in range(12):
        n = int(np.sum(y == c))
        assert int(np.sum(y[val] == c)) == round(0.1 * n)
    again, _ = holdout_split(y, 0.1, seed=0)
    other, val_other = holdout_split(y, 0.1, seed=1)
    assert np.array_equal(train, again) and not np.array_equal(val, val_other)


def test_holdout_keeps_single_samples_for_training_and_can_be_off():
    y = np.array([0, 0, 0, 1])
    train, val = holdout_split(y, 0.34, seed=0)
    assert 3 in train and len(val) == 1 and y[val[0]] == 0
    train, val = holdout_split(y, 0.0, seed=0)
    assert len(val) == 0 and len(train) == 4


def test_holdout_never_touches_the_evaluation_split(tmp_path):
    rng = np.random.default_rng(0)
    n = 400
    x = rng.normal(size=(n, 4)).astype(np.float32)
    x[:, 0] = np.arange(n)  # an id in the first feature
    split = (rng.random(n) < 0.4).astype(int)
    path = tmp_path / "d.npz"
    np.savez(path, x=x, y=rng.integers(0, 3, size=n), split=split)
    d = load_dataset(path, (4,), 3)
    train, val = holdout_split(d.y_fit, 0.1, seed=0)
    eval_ids = set(d.x_eval[:, 0].tolist())
    held_ids = set(d.x_fit[val, 0].tolist())
    assert held_ids and not held_ids & eval_ids
    assert held_ids <= set(np.where(split == 0)[0].tolist())


# --------------------------------------------------------------------------- selection


def test_selector_by_loss_only_counts_eligible_epochs_and_stops():
    s = Selector(patience=2, metric="loss")
    assert s.update(1, 90.0, 0.10, eligible=False) == (False, False)  # not yet at the target sparsity
    assert s.update(2, 80.0, 0.50, eligible=True) == (True, False)
    assert s.update(3, 85.0, 0.40, eligible=True) == (True, False)
    assert s.update(4, 86.0, 0.45, eligible=True) == (False, False)
    assert s.update(5, 87.0, 0.41, eligible=True) == (False, True)
    assert s.best_epoch == 3 and [r["eligible"] for r in s.history] == [False, True, True, True, True]


def test_selector_by_accuracy_breaks_ties_on_loss():
    s = Selector(patience=0, metric="accuracy")
    s.update(1, 90.0, 0.5, True)
    s.update(2, 90.0, 0.4, True)
    s.update(3, 89.0, 0.1, True)
    assert s.best_epoch == 2 and s.update(4, 85.0, 1.0, True) == (False, False)  # no patience: never stops


# --------------------------------------------------------------------------- soft targets


def test_log_probs_of_softmax_outputs_give_the_logits_back():
    logits = np.array([[2.0, -1.0, 0.5], [30.0, -30.0, 0.0]])  # gaps float32 probabilities still hold
    p = np.exp(logits - logits.max(1, keepdims=True))
    p /= p.sum(1, keepdims=True)
    lp = log_probs(p.astype(np.float32), from_logits=False)
    # log p = z - logsumexp(z): equal to the logits up to one constant per sample
    diff = lp - logits
    assert np.allclose(diff - diff[:, :1], 0, atol=1e-4)
    assert np.allclose(log_probs(logits, from_logits=True), lp, atol=1e-4)
    assert np.isfinite(log_probs(np.array([[1.0, 0.0]]), from_logits=False)).all()  # a zero probability


def test_unlabelled_fine_tune_samples(tmp_path):
    path = tmp_path / "d.npz"
    np.savez(path, x=np.zeros((5, 4), np.float32), y=np.array([0, -1, 1, 1, 0]), split=np.array([0, 0, 0, 1, 1]))
    d = load_dataset(path, (4,), 2)
    assert d.y_fit.tolist() == [0, -1, 1] and d.describe()["n_fit_unlabelled"] == 1
    np.savez(path, x=np.zeros((3, 4), np.float32), y=np.array([0, 1, -1]), split=np.array([0, 1, 1]))
    with pytest.raises(InvalidInputError, match="evaluation labels range from -1"):
        load_dataset(path, (4,), 2)


# --------------------------------------------------------------------------- recipe keys


def test_defaults_recover_and_plain_turns_everything_off(tmp_path):
    r = load_recipe()
    assert r.distill and r.pruning_schedule == "polynomial" and r.lr_schedule == "cosine"
    assert r.freeze_batch_norm and r.validation_fraction > 0 and r.restore_best and r.patience > 0
    p = load_recipe(overrides={"plain": True})
    assert not p.distill and p.pruning_schedule == "constant" and p.lr_schedule == "constant"
    assert p.warmup_fraction == 0 and not p.freeze_batch_norm and p.validation_fraction == 0
    assert (p.learning_rate, p.epochs, p.batch_size) == (1e-4, 4, 64)
    # keys given explicitly win over the preset, from a file or from flags
    path = tmp_path / "r.toml"
    path.write_text("plain = true\nepochs = 2\n[distillation]\nenabled = true\n")
    q = load_recipe(path, {"learning_rate": 3e-4})
    assert q.distill and q.epochs == 2 and q.learning_rate == 3e-4 and q.pruning_schedule == "constant"


def test_each_part_can_be_turned_off_and_changes_the_cache_key(tmp_path):
    path = tmp_path / "r.toml"
    path.write_text('[distillation]\nenabled = false\n[pruning]\nschedule = "constant"\n'
                    '[training]\nlr_schedule = "constant"\nwarmup_fraction = 0\nfreeze_batch_norm = false\n'
                    '[selection]\nvalidation_fraction = 0\n[clustering]\ngradient_aggregation = "avg"\n')
    r = load_recipe(path)
    assert not r.distill and r.pruning_schedule == "constant" and r.lr_schedule == "constant"
    assert not r.freeze_batch_norm and r.validation_fraction == 0 and r.cluster_gradient_aggregation == "avg"
    default = Recipe()
    for node in ("pruned", "pruned_clustered", "pcqat"):
        assert r.node_params(node) != default.node_params(node)
    assert r.node_params("baseline") == default.node_params("baseline")
    t = load_recipe(table={"distillation": {"temperature": 2, "label_weight": 0.3}, "selection": {"patience": 0}})
    assert t.distill_temperature == 2.0 and t.distill_label_weight == 0.3 and t.patience == 0


@pytest.mark.parametrize(
    "body,message",
    [
        ("[distillation]\ntemperature = 0", "`distillation.temperature` is 0.0"),
        ("[distillation]\nlabel_weight = 1.5", "`distillation.label_weight` is 1.5"),
        ("[distillation]\nalpha = 0.5", "unknown key `distillation.alpha`"),
        ('[training]\nlr_schedule = "step"', "allowed values: cosine, constant"),
        ("[training]\nfreeze_batch_norm = 1", "`training.freeze_batch_norm` is 1; it must be true or false"),
        ("[selection]\nvalidation_fraction = 0.7", "`selection.validation_fraction` is 0.7"),
        ('[selection]\nmetric = "f1"', "allowed values: loss, accuracy"),
        ("[pruning]\nend_fraction = 0", "`pruning.end_fraction` is 0.0"),
        ('[clustering]\ngradient_aggregation = "mean"', "allowed values: sum, avg"),
        ('plain = "yes"', "`plain` is 'yes'; it must be true or false"),
    ],
)
def test_bad_training_keys_name_file_and_key(tmp_path, body, message):
    path = tmp_path / "r.toml"
    path.write_text(body + "\n")
    with pytest.raises(UsageError) as err:
        load_recipe(path)
    assert message in err.value.one_line() and str(path) in err.value.one_line()
