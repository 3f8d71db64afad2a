"""The rewrite that folds a separate ReLU layer (optionally a ReLU6) into the Conv/Dense layer before it, as that
layer's activation: the same function, and TFMOT's QAT then keeps the layer's quantizers."""

from __future__ import annotations

from edgedeploy.keras.model import is_linear, KERNEL_LAYERS, base_name, inner
from edgedeploy.keras.rewrites.wiring import bypass_layers


def separate_relu_layers(model, relu6: bool = False) -> list[str]:
    """Conv/Dense layers whose only consumer is a separate ReLU layer (QAT then skips their quantizers).

    With ``relu6`` also those followed by a ``ReLU(max_value=6)``: TFMOT's QAT drops their weight quantizers
    the same way, but cannot take ``relu6`` as a layer's own activation, so only quantize configs of our own
    (the palette QAT's) can take the fused layer.
    """
    out = []
    for layer in model.layers:
        if inner(layer).__class__.__name__ not in KERNEL_LAYERS:
            continue
        consumers = [n.outbound_layer for n in layer._outbound_nodes]
        if len(consumers) == 1 and _relu_kind(consumers[0], relu6) and is_linear(layer):
            out.append(base_name(layer.name))
    return out


def _relu_kind(layer, relu6: bool = False) -> str | None:
    """``"relu"`` for a plain ReLU layer, ``"relu6"`` (with ``relu6``) for ``ReLU(max_value=6)``, else None."""
    name = layer.__class__.__name__
    if name == "ReLU":
        cfg = layer.get_config()
        if cfg.get("negative_slope") or cfg.get("threshold"):
            return None
        if cfg.get("max_value") is None:
            return "relu"
        return "relu6" if relu6 and float(cfg["max_value"]) == 6.0 else None
    if name == "Activation":
        return "relu" if layer.get_config().get("activation") == "relu" else None
    return None


def fuse_separate_relu(model, relu6: bool = False):
    """Fold a separate ReLU (with ``relu6`` also a ReLU6) into the Conv/Dense before it as its activation (same
    function, QAT-friendly). Returns (model, fused)."""
    from edgedeploy.keras import tfenv

    keras = tfenv.load().keras
    targets = set(separate_relu_layers(model, relu6))
    if not targets or model.__class__.__name__ != "Functional":
        return model, []
    config = model.get_config()
    layers = {l["name"]: l for l in config["layers"]}
    rename: dict[str, str] = {}
    fused = []
    for layer in model.layers:
        if layer.name not in targets:
            continue
        relu = layer._outbound_nodes[0].outbound_layer
        layers[layer.name]["config"]["activation"] = _relu_kind(relu, relu6)
        rename[relu.name] = layer.name
        fused.append(layer.name)
    new = keras.Model.from_config(bypass_layers(config, rename))
    new.set_weights(model.get_weights())
    return new, fused
