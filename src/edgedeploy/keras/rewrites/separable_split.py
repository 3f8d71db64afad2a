"""The rewrite that splits each SeparableConv2D into the DepthwiseConv2D and 1x1 Conv2D it computes."""

from __future__ import annotations

from edgedeploy.keras.model import unique_name


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
