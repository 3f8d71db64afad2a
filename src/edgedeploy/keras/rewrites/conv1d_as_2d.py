"""The rewrite that writes each Conv1D as the Conv2D it computes, between two reshapes."""

from __future__ import annotations

import copy

from edgedeploy.keras.model import unique_name
from edgedeploy.keras.rewrites.wiring import redirect_consumers


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
