"""The rewrite that gives a kernel layer feeding a Concatenate or a ReLU layer an identity output of its own, so
that TFMOT's QAT transforms leave the kernel layer the scheme's quantize config."""

from __future__ import annotations

from edgedeploy.keras.model import KERNEL_LAYERS, unique_name


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
