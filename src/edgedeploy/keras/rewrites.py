"""Graph rewrites of a Keras model before the tree trains it: separate ReLU layers fused into their convolution,
SeparableConv2D split into depthwise and pointwise, kernels that feed several layers given their own output,
Conv1D as Conv2D. Each returns a new model with the same function."""

from __future__ import annotations

import copy
from typing import Iterable

from edgedeploy.keras.model import is_linear, KERNEL_LAYERS, base_name, inner, unique_name


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


def split_separable(model):
    """Each SeparableConv2D as the DepthwiseConv2D and 1x1 Conv2D it computes, the two operators the converter
    writes for it anyway. Same function and weights; the 1x1 convolution keeps the layer's name, activation and
    bias (so a batch norm after it folds into it), the depthwise one is named ``NAME_depthwise``. A layer called
    more than once is left as it is. Returns (model, {name: depthwise name})."""
    from edgedeploy.keras import tfenv

    keras = tfenv.load().keras
    if model.__class__.__name__ != "Functional":
        return model, {}
    targets = {layer.name for layer in model.layers
               if layer.__class__.__name__ == "SeparableConv2D" and len(layer._inbound_nodes) == 1}
    if not targets:
        return model, {}
    config = model.get_config()
    taken = {layer.name for layer in model.layers}
    split: dict[str, str] = {}
    specs = []
    for spec in config["layers"]:
        if spec["name"] not in targets:
            specs.append(spec)
            continue
        c, name = spec["config"], spec["name"]
        depthwise_name = unique_name(f"{name}_depthwise", taken)
        depthwise = keras.layers.DepthwiseConv2D(
            c["kernel_size"], strides=c["strides"], padding=c["padding"], depth_multiplier=c["depth_multiplier"],
            data_format=c.get("data_format"), dilation_rate=c["dilation_rate"], use_bias=False,
            depthwise_regularizer=c.get("depthwise_regularizer"), depthwise_constraint=c.get("depthwise_constraint"),
            name=depthwise_name, dtype=c.get("dtype"))
        pointwise = keras.layers.Conv2D(
            c["filters"], 1, data_format=c.get("data_format"), activation=c.get("activation"),
            use_bias=c["use_bias"], kernel_regularizer=c.get("pointwise_regularizer"),
            bias_regularizer=c.get("bias_regularizer"), activity_regularizer=c.get("activity_regularizer"),
            kernel_constraint=c.get("pointwise_constraint"), bias_constraint=c.get("bias_constraint"), name=name,
            dtype=c.get("dtype"))
        specs.append({**keras.layers.serialize(depthwise), "name": depthwise_name,
                      "inbound_nodes": spec["inbound_nodes"]})
        specs.append({**keras.layers.serialize(pointwise), "name": name,
                      "inbound_nodes": [[[depthwise_name, 0, 0, {}]]]})
        split[name] = depthwise_name
    config["layers"] = specs
    new = keras.Model.from_config(config)
    depthwise_names = set(split.values())
    for layer in new.layers:
        if layer.name in depthwise_names:
            continue
        weights = model.get_layer(layer.name).get_weights()
        if layer.name in split:  # [depthwise kernel, pointwise kernel, (bias)]
            new.get_layer(split[layer.name]).set_weights(weights[:1])
            weights = weights[1:]
        layer.set_weights(weights)
    return new, split


def bypass_layers(config: dict, rename: dict[str, str]) -> dict:
    """Drop the layers named in ``rename`` from a functional model's config; their consumers read
    ``rename[name]`` (the layer before them) instead."""
    config["layers"] = [spec for spec in config["layers"] if spec["name"] not in rename]
    return redirect_consumers(config, rename)


def redirect_consumers(config: dict, rename: dict[str, str], keep: Iterable[str] = ()) -> dict:
    """In a functional model's config, every layer (but those in ``keep``) and the model's inputs and outputs
    read ``rename[name]`` where they read ``name``."""
    keep = set(keep)

    def fix(obj):
        if isinstance(obj, list):
            if len(obj) >= 3 and isinstance(obj[0], str) and obj[0] in rename and isinstance(obj[1], int):
                return [rename[obj[0]], *obj[1:]]
            return [fix(v) for v in obj]
        if isinstance(obj, dict):
            return {k: fix(v) for k, v in obj.items()}
        return obj

    for spec in config["layers"]:
        if spec["name"] not in keep:
            spec["inbound_nodes"] = fix(spec["inbound_nodes"])
    config["output_layers"] = fix(config["output_layers"])
    config["input_layers"] = fix(config["input_layers"])
    return config


def separate_kernel_outputs(model):
    """A linear ``Activation`` (named ``LAYER_inI``) between each kernel layer and a ``Concatenate`` or ReLU layer
    it feeds, so that TFMOT's QAT transforms leave the kernel layer the scheme's quantize config.

    TFMOT's transform for ``Concatenate`` gives every layer feeding one, if it has no quantize config yet, the
    plain 8-bit config of TFMOT's default registry, whatever the scheme, and its transforms for a ReLU layer
    (``ReLU`` or ``Activation("relu")``) after a Conv/Dense give that layer a no-op config (a ``ReLU(6)`` cannot
    be folded into the layer, as TFMOT's QAT has no ``relu6`` activation; a plain ReLU is, unless the recipe
    says ``fuse_relu = false``): under PQAT/CQAT/PCQAT those layers then trained without the preserving
    quantizers and lost their zeros and clusters. With an identity layer in between, the transforms configure
    that instead (it has no weights). The converter drops the identities and still fuses the ReLU into the
    convolution. Returns (model, [names added])."""
    from edgedeploy.keras import tfenv

    keras = tfenv.load().keras
    if model.__class__.__name__ != "Functional":
        return model, []
    kernels = {layer.name for layer in model.layers if layer.__class__.__name__ in KERNEL_LAYERS}
    config = model.get_config()
    taken = {layer.name for layer in model.layers}
    specs, added = [], []
    for spec in config["layers"]:
        relu = spec["class_name"] == "ReLU" or (spec["class_name"] == "Activation"
                                                 and spec["config"].get("activation") == "relu")
        if (spec["class_name"] == "Concatenate" or relu) and len(spec["inbound_nodes"]) == 1:
            refs = []
            for i, ref in enumerate(spec["inbound_nodes"][0]):
                if ref[0] not in kernels:
                    refs.append(ref)
                    continue
                name = unique_name(f"{spec['name']}_in{i}", taken)
                identity = keras.layers.Activation("linear", name=name)
                specs.append({**keras.layers.serialize(identity), "name": name, "inbound_nodes": [[ref]]})
                refs.append([name, 0, 0, {}])
                added.append(name)
            spec = {**spec, "inbound_nodes": [refs]}
        specs.append(spec)
    if not added:
        return model, []
    config["layers"] = specs
    new = keras.Model.from_config(config)
    for layer in new.layers:
        if layer.name not in added:
            layer.set_weights(model.get_layer(layer.name).get_weights())
    return new, added


def _per_channel_follower(layer) -> bool:
    """A layer that computes the same on a (T, C) tensor as on (T, 1, C): a batch norm over the last axis, an
    activation."""
    kind = layer.__class__.__name__
    if kind == "BatchNormalization":
        return list(layer.get_config()["axis"]) in ([2], [-1])
    return kind in ("ReLU", "Activation", "LeakyReLU")


def conv1d_as_conv2d(model):
    """Each Conv1D as the Conv2D it computes, between two reshapes, as the converter writes it anyway (a kernel
    of k x 1 on a T x 1 image). TFMOT has no QAT config for Conv1D and the palette leaves only know 2-D kernels;
    as a Conv2D the layer is pruned, clustered, quantization-aware trained and paletted like any other. Same
    function and weights; the Conv2D keeps the layer's name, the reshapes are ``NAME_2d`` and ``NAME_1d``
    (causal padding: a ``NAME_pad`` before the convolution). A layer called more than once, or with groups, is
    left as it is. Returns (model, [names])."""
    from edgedeploy.keras import tfenv

    keras = tfenv.load().keras
    if model.__class__.__name__ != "Functional":
        return model, []
    targets = {layer.name: layer for layer in model.layers
               if layer.__class__.__name__ == "Conv1D" and len(layer._inbound_nodes) == 1
               and layer.get_config().get("groups", 1) == 1
               and layer.get_config().get("data_format", "channels_last") == "channels_last"}
    if not targets:
        return model, []
    # A batch norm and activations right after the convolution move into the 2-D part with it: there TFMOT's
    # QAT and the palette leaves fold the batch norm into the kernel, and the converter fuses the activation.
    followers: dict[str, list[str]] = {}
    for name, layer in targets.items():
        chain, last = [], layer
        while True:
            outs = last._outbound_nodes
            nxt = outs[0].outbound_layer if len(outs) == 1 else None
            if nxt is None or len(nxt._inbound_nodes) != 1 or not _per_channel_follower(nxt):
                break
            chain.append(nxt.name)
            last = nxt
        followers[name] = chain
    moved_names = {n for chain in followers.values() for n in chain}
    config = model.get_config()
    taken = {layer.name for layer in model.layers}
    moved_specs = {spec["name"]: spec for spec in config["layers"] if spec["name"] in moved_names}
    specs, rename, added, chained = [], {}, set[str](), set[str]()
    for spec in config["layers"]:
        if spec["name"] in moved_names:
            continue  # placed with its convolution
        layer = targets.get(spec["name"])
        if layer is None:
            specs.append(spec)
            continue
        c, name = spec["config"], spec["name"]
        k, stride, dilation = c["kernel_size"][0], c["strides"][0], c["dilation_rate"][0]
        chain = [keras.layers.Reshape((-1, 1, int(layer.input_shape[-1])), name=unique_name(f"{name}_2d", taken))]
        if c["padding"] == "causal":
            chain.append(keras.layers.ZeroPadding2D(((dilation * (k - 1), 0), (0, 0)),
                                                    name=unique_name(f"{name}_pad", taken)))
        chain.append(keras.layers.Conv2D(
            c["filters"], (k, 1), strides=(stride, 1), padding="valid" if c["padding"] == "causal" else c["padding"],
            dilation_rate=(dilation, 1), activation=c.get("activation"), use_bias=c["use_bias"],
            kernel_regularizer=c.get("kernel_regularizer"), bias_regularizer=c.get("bias_regularizer"),
            activity_regularizer=c.get("activity_regularizer"), kernel_constraint=c.get("kernel_constraint"),
            bias_constraint=c.get("bias_constraint"), name=name, dtype=c.get("dtype")))
        pieces = [{**keras.layers.serialize(piece), "name": piece.name} for piece in chain]
        for follower in followers[name]:
            moved = copy.deepcopy(moved_specs[follower])
            if "axis" in moved["config"]:  # a batch norm: the channels' axis of the 4-D tensor
                moved["config"]["axis"] = [3]
            pieces.append(moved)
        back = keras.layers.Reshape((-1, int(c["filters"])), name=unique_name(f"{name}_1d", taken))
        pieces.append({**keras.layers.serialize(back), "name": back.name})
        inbound = spec["inbound_nodes"]
        for piece in pieces:
            specs.append({**piece, "inbound_nodes": inbound})
            inbound = [[[piece["name"], 0, 0, {}]]]
        added.update(p["name"] for p in pieces if p["name"] not in moved_names and p["name"] != name)  # no weights
        chained.update(p["name"] for p in pieces[1:])  # they read the chain itself, not a renamed layer
        rename[(followers[name] or [name])[-1]] = back.name
    config["layers"] = specs
    new = keras.Model.from_config(redirect_consumers(config, rename, keep=chained))
    for layer in new.layers:
        if layer.name in added:
            continue
        weights = model.get_layer(layer.name).get_weights()
        if layer.name in targets:  # kernel (k, in, out) -> (k, 1, in, out)
            weights = [weights[0][:, None], *weights[1:]]
        layer.set_weights(weights)
    return new, sorted(targets)
