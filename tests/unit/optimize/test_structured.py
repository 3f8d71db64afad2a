"""The 2:4 pattern in NumPy: which axis its groups run along, masks (one-shot and gradual), the check."""

from __future__ import annotations

import numpy as np
import pytest

from edgedeploy.config import pattern as structured
from edgedeploy.errors import UsageError
from edgedeploy.config.recipe import load_recipe


def _conv(seed=0, shape=(3, 3, 8, 6)):
    return np.random.default_rng(seed).normal(size=shape).astype(np.float32)


def test_mask_zeroes_two_of_every_four_input_channels_of_each_output_channel():
    k = _conv()
    m = structured.mask_2of4(k, "Conv2D")
    assert m.shape == k.shape and (m == 0).mean() == 0.5
    # by hand: for every (h, w, out) the 8 input channels form two groups of four, each with exactly two zeros
    for h in range(3):
        for w in range(3):
            for o in range(6):
                col = m[h, w, :, o]
                assert (col[:4] == 0).sum() == 2 and (col[4:] == 0).sum() == 2
                kept = np.abs(k[h, w, :4, o])[col[:4] == 1]
                dropped = np.abs(k[h, w, :4, o])[col[:4] == 0]
                assert kept.min() >= dropped.max()  # the two smallest magnitudes go
    assert structured.violations(k * m, "Conv2D") == 0
    assert structured.violations(k, "Conv2D") == 3 * 3 * 6 * 2


def test_int8_layout_groups_are_the_same_groups():
    k = _conv(1)
    pruned = k * structured.mask_2of4(k, "Conv2D")
    ohwi = np.transpose(pruned, (3, 0, 1, 2))
    assert structured.violations(ohwi, "Conv2D", "int8") == 0
    d = _conv(2, (12, 5))
    dp = d * structured.mask_2of4(d, "Dense")
    assert structured.violations(dp.T, "Dense", "int8") == 0  # TFLite's [out, in]
    # the wrong axis (groups of output channels) is caught
    wrong = np.swapaxes(ohwi, 0, 3)
    assert structured.violations(np.ascontiguousarray(wrong), "Conv2D", "int8") > 0


def test_gradual_masks_grow_and_nest():
    k = _conv(3)
    prev = np.ones_like(k)
    for f in (0.0, 0.25, 0.5, 1.0):
        m = structured.mask_2of4(k * prev, "Conv2D", f)
        assert np.isclose((m == 0).mean(), 0.5 * f, atol=0.01)
        assert np.all(m <= prev)  # once zero, always zero
        prev = m
    assert structured.violations(k * prev, "Conv2D") == 0


def test_check_names_the_layer_and_leaves_out_odd_channels_and_depthwise():
    good = _conv(4)
    good = good * structured.mask_2of4(good, "Conv2D")
    bad = good.copy()
    bad[0, 0, :4, 0] = [1.0, 2.0, 3.0, 0.0]
    v = structured.check("pcqat", "keras", [("conv_ok", "Conv2D", good), ("conv_bad", "Conv2D", bad),
                                           ("first", "Conv2D", _conv(5, (3, 3, 3, 8))),
                                           ("dw", "DepthwiseConv2D", _conv(6, (3, 3, 8, 1)))])
    assert [r["status"] for r in v.rows] == ["ok", "failed", "left out", "left out"]
    assert v.left_out == ["first", "dw"]
    assert len(v.failures) == 1 and "conv_bad" in v.failures[0] and "1 of 108 groups" in v.failures[0]
    assert "3 input channels" in v.rows[2]["note"]


def test_recipe_key_and_values(tmp_path):
    assert load_recipe().sparsity_pattern == "unstructured"
    r = load_recipe(table={"sparsity_pattern": "2:4"})
    assert r.sparsity_pattern == "2:4" and r.node_params("pruned")["sparsity_pattern"] == "2:4"
    assert "sparsity_pattern" not in load_recipe().node_params("pruned")  # unstructured cache keys unchanged
    with pytest.raises(UsageError, match="allowed values: unstructured, 2:4"):
        load_recipe(table={"sparsity_pattern": "1:4"})
    with pytest.raises(UsageError, match="prunes exactly 0.5"):
        load_recipe(table={"sparsity_pattern": "2:4", "sparsity": 0.7})


def test_schedule_fraction_follows_the_plan():
    pytest.importorskip("edgedeploy.optimize.techniques.two_of_four")
    from edgedeploy.optimize.finetune.loop import pruning_plan
    from edgedeploy.optimize.techniques.two_of_four import schedule_fraction

    plan = pruning_plan("polynomial", 10, 2, 0.6)
    fractions = [schedule_fraction(plan, s) for s in range(20)]
    due = [f for f in fractions if f is not None]
    assert due[0] == 0.0 and due[-1] == 1.0 and due == sorted(due)
    assert all(f is None for f in fractions[plan.end_step + 1:])
    one_shot = pruning_plan("constant", 10, 2, 0.6)
    assert schedule_fraction(one_shot, 0) == 1.0
