"""A batch norm that TFMOT cannot fold, as the 1x1 ``DepthwiseConv2D`` it computes, before QAT.

TFMOT's QAT folds a batch norm into the Conv/Dense layer before it, and has no quantize config for any other:
one after a ``Concatenate`` (DenseNet's pre-activation), an ``Add``, or a convolution whose output other layers
read as well makes it refuse the whole model. In inference a batch norm is a per-channel affine map
``x * scale + offset`` (``scale = gamma / sqrt(variance + epsilon)``, ``offset = beta - mean * scale``): a 1x1
depthwise convolution with that kernel and bias, which TFMOT quantizes (and fuses with a ReLU after it) and the
int8 converter writes as one DEPTHWISE_CONV_2D where it wrote a MUL and an ADD for the batch norm.
"""

from __future__ import annotations

import numpy as np

from edgedeploy.keras.model import KERNEL_LAYERS, is_linear


def folds_into_source(layer) -> bool:
    """Whether TFMOT folds the batch norm ``layer`` into the layer before it: one Conv2D, DepthwiseConv2D or Dense
    without an activation of its own, read by nothing else."""
    nodes = layer._inbound_nodes
    source = nodes[0].inbound_layers if len(nodes) == 1 else None
    return (source is not None and not isinstance(source, (list, tuple))
            and source.__class__.__name__ in KERNEL_LAYERS and is_linear(source)
            and len(source._outbound_nodes) == 1)


def batch_norms_as_depthwise(model):
    """Each batch norm over the channels of a 4-D tensor that TFMOT cannot fold (:func:`folds_into_source`) as
    a 1x1 ``DepthwiseConv2D`` of the same name with its inference-time scale and offset. Returns (model, [names])."""
    from edgedeploy.keras import tfenv

    keras = tfenv.load().keras
    if model.__class__.__name__ != "Functional":
        return model, []
    targets = {layer.name: layer for layer in model.layers
               if layer.__class__.__name__ == "BatchNormalization" and len(layer._inbound_nodes) == 1
               and len(layer.input_shape) == 4 and list(layer.get_config()["axis"]) in ([3], [-1])
               and not folds_into_source(layer)}
    if not targets:
        return model, []
    config = model.get_config()
    for spec in config["layers"]:
        layer = targets.get(spec["name"])
        if layer is None:
            continue
        depthwise = keras.layers.DepthwiseConv2D(1, use_bias=True, name=layer.name, dtype=spec["config"].get("dtype"))
        spec.update({k: v for k, v in keras.layers.serialize(depthwise).items() if k != "inbound_nodes"})
        spec["name"] = layer.name
    new = keras.Model.from_config(config)
    for layer in new.layers:
        norm = targets.get(layer.name)
        if norm is None:
            layer.set_weights(model.get_layer(layer.name).get_weights())
            continue
        channels = int(norm.input_shape[-1])
        gamma = norm.gamma.numpy() if norm.scale else np.ones(channels, np.float32)
        beta = norm.beta.numpy() if norm.center else np.zeros(channels, np.float32)
        scale = gamma / np.sqrt(norm.moving_variance.numpy() + norm.epsilon)
        offset = beta - norm.moving_mean.numpy() * scale
        layer.set_weights([scale.reshape(1, 1, channels, 1).astype(np.float32), offset.astype(np.float32)])
    return new, sorted(targets)
