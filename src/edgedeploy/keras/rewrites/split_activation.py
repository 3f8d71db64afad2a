"""Swish taken out of the Conv/Dense layer that computes it, as an ``Activation`` layer of its own, before QAT.

TFMOT fake-quantizes a layer's own activation only after it (``swish`` is one of its post-quantized activations),
but TFLite computes swish in three operators (the kernel's, LOGISTIC, MUL): the kernel's output, before the
activation, then has no QAT range, the int8 converter leaves those operators in float and they are calibrated
afterwards, where the converter quantizes the kernel's bias for its calibrated input scale while the input keeps
its QAT scale. As a layer of its own the activation reads the kernel's fake-quantized output: every tensor has a
QAT range, and the model computes the same (the same ``swish`` on the same values).
"""

from __future__ import annotations

from edgedeploy.keras.model import KERNEL_LAYERS, unique_name
from edgedeploy.keras.rewrites.wiring import redirect_consumers

# activations a kernel layer computes that TFLite writes as operators of their own after the kernel's
SPLIT_ACTIVATIONS = {"swish", "silu"}


def separate_swish(model):
    """Each Conv/Dense layer with a swish activation as the layer (linear) and an ``Activation`` named
    ``NAME_swish`` after it. Same function and weights. Returns (model, [names of the layers split])."""
    from edgedeploy.keras import tfenv

    keras = tfenv.load().keras
    if model.__class__.__name__ != "Functional":
        return model, []
    config = model.get_config()
    taken = {layer.name for layer in model.layers}
    specs, rename, added = [], {}, []
    for spec in config["layers"]:
        specs.append(spec)
        if (spec["class_name"] not in KERNEL_LAYERS or len(spec["inbound_nodes"]) != 1
                or spec["config"].get("activation") not in SPLIT_ACTIVATIONS):
            continue
        name = spec["name"]
        activation = keras.layers.Activation(spec["config"]["activation"], name=unique_name(f"{name}_swish", taken))
        spec["config"]["activation"] = "linear"
        specs.append({**keras.layers.serialize(activation), "name": activation.name,
                      "inbound_nodes": [[[name, 0, 0, {}]]]})
        rename[name] = activation.name
        added.append(activation.name)
    if not added:
        return model, []
    config["layers"] = specs
    new = keras.Model.from_config(redirect_consumers(config, rename, keep=added))
    for layer in new.layers:
        if layer.name not in added:
            layer.set_weights(model.get_layer(layer.name).get_weights())
    return new, sorted(rename)
