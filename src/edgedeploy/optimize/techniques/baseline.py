"""The tree's root: the user's model, rewritten into layers every technique of the tree knows."""

from __future__ import annotations

import logging
from typing import Any

from edgedeploy.keras.model import load_model
from edgedeploy.keras.rewrites import conv1d_as_conv2d, fuse_separate_relu, separate_relu_layers, split_separable

log = logging.getLogger("edgedeploy")


def baseline_node(run) -> Any:
    """The user's model, rewritten into layers every technique of the tree knows."""
    model, info = load_model(run.inputs["model"], run.trust_lambda)
    if info.flattened:  # nested models, their layers now in the model's own graph (edgedeploy.keras.flatten)
        run.details["flattened"] = list(info.flattened)
    # TFMOT prunes a SeparableConv2D's pointwise kernel but has no QAT config for it (PQAT/PCQAT would then
    # train it freely and lose its zeros and clusters): the tree works on the two layers it computes
    model, split = split_separable(model)
    if split:
        run.details["split_separable"] = split
        log.info("split %s into a DepthwiseConv2D (NAME_depthwise) and a 1x1 Conv2D each", ", ".join(split))
    # nor has TFMOT a QAT config for Conv1D, and the palette leaves know 2-D kernels: the tree works on the
    # Conv2D each one computes (the converter writes it as one anyway)
    model, as_2d = conv1d_as_conv2d(model)
    if as_2d:
        run.details["conv1d_as_conv2d"] = as_2d
        log.info("rewrote %s as Conv2D layers between reshapes (NAME_2d, NAME_1d)", ", ".join(as_2d))
    relu = separate_relu_layers(model)
    if relu and run.recipe.fuse_relu:
        model, fused = fuse_separate_relu(model)
        run.details["fused_relu"] = fused
        run.warnings.append(f"folded the separate ReLU after {', '.join(fused)} into the layer's activation, "
                            "so QAT keeps their quantizers (and PQAT/PCQAT their sparsity and clusters)")
    elif relu:
        run.details["separate_relu"] = relu
    return model
