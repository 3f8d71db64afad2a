"""Palette QAT on the real MLPerf DS-CNN: folded layers train in their kernel's units before batch-norm folding.

The palette node folds every batch norm into its kernel (DS-CNN: depthwise kernels x6-7, the first convolution
x0.57). Palette QAT keeps the folded function but trains kernel / |factor|, as TFMOT's QAT of the unfolded model
does; these tests check that the reparametrisation leaves the function, the baked kernels and a save/load round
trip unchanged.
"""

from __future__ import annotations

import numpy as np
import pytest

pytestmark = pytest.mark.requires_data

CLUSTERS, SPARSITY = 16, 0.5


@pytest.fixture(scope="module")
def node(shared_data):
    """The published float DS-CNN, folded and projected as the palette node does (nearest projection)."""
    from edgedeploy.keras import tfenv
    from edgedeploy.optimize.palette.models import apply_plan, fold_batch_norm, kernel_layers
    from edgedeploy.keras.rewrites import fuse_separate_relu

    keras = tfenv.load().keras
    original = keras.models.load_model(shared_data / "kws" / "dscnn_mlperf_float.h5", compile=False)
    model, folded = fold_batch_norm(original)
    model, _ = fuse_separate_relu(model)
    plan = {name: {"clusters": CLUSTERS, "sparsity": SPARSITY} for name, _ in kernel_layers(model)}
    apply_plan(model, plan, seed=0)
    d = np.load(shared_data / "kws" / "speech_commands_v2_test_mfcc_mlperf.npz")
    clips = np.where(d["split"] == 1)[0][::29][:64]  # evaluation clips across the (class-sorted) file
    x = d["x"][clips].reshape(-1, 49, 10, 1).astype(np.float32)
    return original, model, folded, plan, x


def test_fold_records_each_kernels_factor_per_output_channel(node):
    from edgedeploy.optimize.palette.models import fold_batch_norm
    from edgedeploy.optimize.palette.projection import channels_last

    original, _, _, _, _ = node
    unprojected, folded = fold_batch_norm(original)
    assert len(folded) == 9
    for name, factor in folded.items():
        kind = original.get_layer(name).__class__.__name__
        before = channels_last(original.get_layer(name).get_weights()[0], kind)
        after = channels_last(unprojected.get_layer(name).get_weights()[0], kind)
        assert factor.shape == (before.shape[1],)
        np.testing.assert_allclose(after, before * factor, rtol=1e-5, atol=1e-7)
    depthwise = [f for n, f in folded.items() if "depthwise" in n]
    assert min(np.median(np.abs(f)) for f in depthwise) > 3  # far from 1: the units matter


def test_palette_qat_trains_unfolded_units_and_computes_the_same_function(node, tmp_path):
    from edgedeploy.optimize.palette.projection import channels_last
    from edgedeploy.optimize.palette.palette_qat import (
        bake_palettes,
        kernel_variable,
        load_palette_qat,
        palette_kind,
        palette_layers,
        palette_qat_model,
    )

    _, model, folded, plan, x = node
    as_folded = palette_qat_model(model, plan, 0)
    unfolded = palette_qat_model(model, plan, 0, folded)
    from edgedeploy.keras.model import base_name

    seen = 0
    for layer, quantizer in palette_layers(unfolded):
        name = base_name(layer.name)
        kernel = model.get_layer(name).get_weights()[0]
        kind = palette_kind(quantizer)
        variable = channels_last(kernel_variable(layer, quantizer).numpy(), kind)
        factor = np.abs(np.asarray(folded[name])) if name in folded else np.ones(variable.shape[1], np.float32)
        np.testing.assert_allclose(variable * factor, channels_last(kernel, kind), rtol=1e-5, atol=1e-7)
        seen += name in folded
    assert seen == len(folded)

    # The kernel each layer computes with (snapped, fake-quantized) is the same in both. One training-mode pass
    # sets the per-channel weight ranges, as training would.
    for m in (as_folded, unfolded):
        m(x, training=True)
    reference = effective_kernels(as_folded)
    assert sorted(reference) == sorted(plan)
    same_kernels(effective_kernels(unfolded), reference)

    # baking writes that kernel into the variable
    path = tmp_path / "qat.h5"
    unfolded.save_weights(path)
    assert sorted(bake_palettes(unfolded)) == sorted(f"quant_{name}" for name in plan)
    baked = {}
    for layer, quantizer in palette_layers(unfolded):
        assert quantizer.gain is None
        baked[base_name(layer.name)] = kernel_variable(layer, quantizer).numpy()
    same_kernels(baked, reference)
    # the convolutions keep the parent's kernels, already on their palettes (a Dense layer is quantized per
    # tensor and gets a palette of its own: see qat_palettes)
    same_kernels({n: k for n, k in baked.items() if "conv" in n},
                 {n: model.get_layer(n).get_weights()[0] for n in plan if "conv" in n})
    same_kernels(effective_kernels(unfolded), reference)

    # what the convert stage loads from the saved weights computes with the same kernels
    parent = tmp_path / "node.h5"
    model.save(parent, include_optimizer=False)
    same_kernels(effective_kernels(load_palette_qat(parent, path, plan, 0, folded)), reference)


def effective_kernels(model) -> dict[str, np.ndarray]:
    """Per palette layer, its weight quantizer's output in inference mode (what the layer multiplies with)."""
    from edgedeploy.optimize.palette.palette_qat import palette_layers
    from edgedeploy.keras.model import base_name

    out = {}
    for layer, quantizer in palette_layers(model):
        for weight, q, variables in layer._weight_vars:
            if q is quantizer:
                out[base_name(layer.name)] = q(weight, training=False, weights=variables).numpy()
    return out


def same_kernels(got: dict[str, np.ndarray], want: dict[str, np.ndarray]) -> None:
    assert sorted(got) == sorted(want)
    for name in want:
        np.testing.assert_allclose(got[name], want[name], rtol=1e-5, atol=1e-6, err_msg=name)
