"""Quantization-aware training of a Keras model with TFMOT: which layers it can wrap, the annotation, the
activation ranges it starts from."""

from __future__ import annotations

from edgedeploy.keras.rewrites.bn_as_depthwise import folds_into_source


def unsupported_for_qat(model) -> list[str]:
    """Layers TFMOT's default 8-bit QAT registry has no quantize config for (e.g. ``TFOpLambda`` ``tf.reshape``)."""
    from edgedeploy.keras import tfenv

    tfenv.load()
    from tensorflow_model_optimization.python.core.quantization.keras.default_8bit import (
        default_8bit_quantize_registry as registry_module,
    )
    from tensorflow_model_optimization.python.core.quantization.keras.quantize_annotate import QuantizeAnnotate

    registry = registry_module.Default8BitQuantizeRegistry()

    def supported(layer) -> bool:
        kind = layer.__class__.__name__
        if kind == "InputLayer" or isinstance(layer, QuantizeAnnotate):
            return True
        if kind == "BatchNormalization":
            # not in the registry: TFMOT's graph transforms (Conv2DBatchNormQuantize, DenseBatchNormQuantize and
            # their activation variants) fold a batch norm into the layer before it, where that is one Conv2D,
            # DepthwiseConv2D or Dense (KERNEL_LAYERS) without an activation of its own, read by nothing else;
            # a batch norm after any other layer (a Concatenate, an Add) or a convolution read by other layers
            # too makes quantize_apply refuse the whole model (edgedeploy.keras.rewrites.bn_as_depthwise rewrites those)
            return folds_into_source(layer) and registry.supports(layer._inbound_nodes[0].inbound_layers)
        return registry.supports(layer)

    return [layer.name for layer in model.layers if not supported(layer)]


# layers that only move or pick their input's values (and zeros): their int8 output keeps the input's scale
SHAPE_ONLY_LAYERS = {"Reshape", "Flatten", "Permute", "RepeatVector", "MaxPooling1D", "MaxPooling3D",
                     "GlobalMaxPooling1D", "GlobalMaxPooling3D", "Cropping1D", "Cropping3D", "ZeroPadding1D",
                     "ZeroPadding3D", "UpSampling1D"}
SHAPE_ONLY_OPS = {"reshape", "squeeze", "expand_dims", "transpose", "identity"}  # TFOpLambda functions
# layers whose int8 TFLite operator (AVERAGE_POOL_2D) needs the same scale at its input and output: a range of
# their own in QAT (TFMOT's registry gives them one) makes the converter add a requantize after them
SAME_SCALE_LAYERS = {"AveragePooling1D", "AveragePooling2D"}


def shape_only(layer) -> bool:
    """Whether ``layer`` only moves or picks values (a reshape, a max pooling), so its int8 output keeps its
    input's scale and QAT gives it no quantizer of its own."""
    kind = layer.__class__.__name__
    if kind == "TFOpLambda":
        return str(layer.get_config().get("function", "")).rsplit(".", 1)[-1] in SHAPE_ONLY_OPS
    return kind in SHAPE_ONLY_LAYERS


def annotate_for_qat(model):
    """``quantize_annotate_model`` for the layers TFMOT can quantize; the others stay as they are.

    TFMOT refuses a whole model over one unsupported layer (Arm's DS-CNN-S has ``tf.reshape`` as TFOpLambda
    layers). Shape-only ones (:func:`shape_only`) get TFMOT's no-op quantize config, the one its registry gives
    keras ``Reshape``: no fake quantization of their own in QAT; the int8 converter quantizes them afterwards
    (they keep their input's scale). Average poolings (:data:`SAME_SCALE_LAYERS`) get it too, whatever the scheme:
    their int8 operator keeps its input's scale, and an output range learnt in QAT only adds a requantize. Any other (a ``Rescaling`` of the input) gets its output fake-quantized, as
    TFMOT does for an ``Add``: without a range of its own the converter folds an input scaling into the next
    layer's kernel *after* that kernel's fake quantization, and a 1/255 scaling then rounds every int8 weight of
    the first convolution to zero. Layers already annotated (with their own config) are kept.
    """
    from edgedeploy.keras import tfenv

    env = tfenv.load()
    quant = env.tfmot.quantization.keras
    skip = set(unsupported_for_qat(model))
    same_scale = {layer.name for layer in model.layers if layer.__class__.__name__ in SAME_SCALE_LAYERS}
    if not skip and not same_scale:
        return quant.quantize_annotate_model(model)
    from tensorflow_model_optimization.python.core.quantization.keras.default_8bit.default_8bit_quantize_configs import (
        Default8BitOutputQuantizeConfig,
        NoOpQuantizeConfig,
    )
    from tensorflow_model_optimization.python.core.quantization.keras.quantize_annotate import QuantizeAnnotate

    def annotate(layer):
        if isinstance(layer, QuantizeAnnotate):
            return layer
        if layer.name in skip or layer.name in same_scale:
            keeps_scale = shape_only(layer) or layer.name in same_scale
            config = NoOpQuantizeConfig() if keeps_scale else Default8BitOutputQuantizeConfig()
            return quant.quantize_annotate_layer(layer, quantize_config=config)
        return quant.quantize_annotate_layer(layer)

    annotated = env.keras.models.clone_model(model, clone_function=annotate)
    annotated.set_weights(model.get_weights())
    return annotated


def init_activation_ranges(qat_model, float_model, x, batch_size: int) -> int:
    """Start each fake-quantized layer output of ``qat_model`` at the range its training would settle at.

    TFMOT starts every activation range at [-6, 6] and moves it towards each training batch's [min, max] by
    0.1% per step, so after a fine-tuning of a few hundred steps the ranges are still mostly that start: a ReLU
    output spends a third of its int8 codes on negative values it never takes, and large outputs are clipped.
    The range of layer L is set instead to the mean over ``batch_size`` batches of ``x`` of the batch's
    [min(L, 0), max(L, 0)] in ``float_model`` (the model ``qat_model`` was built from): the value TFMOT's moving
    average tends to. Outputs that are not a layer of ``float_model`` (e.g. before an activation) keep TFMOT's
    start. Returns the number of layers set.
    """
    import numpy as np

    from edgedeploy.keras import tfenv

    keras = tfenv.load().keras
    float_layers = {layer.name: layer for layer in float_model.layers}
    targets = []  # (float layer name, [(min variable, max variable)])
    for layer in qat_model.layers:
        inner_layer = getattr(layer, "layer", None)
        if inner_layer is None or len(getattr(float_layers.get(inner_layer.name), "_inbound_nodes", ())) != 1:
            continue  # not in the float model, or called more than once there (no single output)
        by_name = {v.name.split("/")[-1].split(":")[0]: v for v in layer.non_trainable_weights}
        pairs = [(by_name[f"{p}_min"], by_name[f"{p}_max"]) for p in ("post_activation", "output")
                 if f"{p}_min" in by_name and f"{p}_max" in by_name]
        if pairs:
            targets.append((inner_layer.name, pairs))
    if not targets or len(x) == 0:
        return 0
    probe = keras.Model(float_model.inputs, [float_layers[name].output for name, _ in targets])
    low, high, batches = np.zeros(len(targets)), np.zeros(len(targets)), 0
    for start in range(0, len(x), batch_size):
        outs = probe(x[start:start + batch_size], training=False)
        outs = outs if isinstance(outs, (list, tuple)) else [outs]
        low += [min(float(np.min(o)), 0.0) for o in outs]
        high += [max(float(np.max(o)), 0.0) for o in outs]
        batches += 1
    for (_, pairs), lo, hi in zip(targets, low / batches, high / batches):
        for vmin, vmax in pairs:
            vmin.assign(np.full(vmin.shape, lo, np.float32))
            vmax.assign(np.full(vmax.shape, hi, np.float32))
    return len(targets)


def quantize_for_qat(model, scheme=None, custom_objects=None, what: str = "QAT"):
    """``quantize_apply`` on :func:`annotate_for_qat` of ``model`` (TFMOT's default scheme unless given).

    A model TFMOT still cannot rewrite raises :class:`~edgedeploy.errors.InvalidInputError`, its message starting
    with ``what`` (e.g. the stage).
    """
    from edgedeploy.keras import tfenv
    from edgedeploy.errors import InvalidInputError

    quant = tfenv.load().tfmot.quantization.keras
    from tensorflow_model_optimization.python.core.quantization.keras.default_8bit.default_8bit_quantize_configs import (
        Default8BitOutputQuantizeConfig,
        NoOpQuantizeConfig,
    )

    annotated = annotate_for_qat(model)
    try:
        with quant.quantize_scope({"NoOpQuantizeConfig": NoOpQuantizeConfig,
                                   "Default8BitOutputQuantizeConfig": Default8BitOutputQuantizeConfig,
                                   **(custom_objects or {})}):
            return quant.quantize_apply(annotated) if scheme is None else quant.quantize_apply(annotated, scheme)
    except (RuntimeError, ValueError, AttributeError, TypeError) as exc:  # layers and weights it cannot take
        reason = " ".join(str(exc).split())[:300] or type(exc).__name__
        leave_out = "leave the QAT leaves out (e.g. --leaves ptq,pruned,pruned_clustered,clustered)"
        # TFMOT's model cloning misroutes TensorFlow math ops (TFOpLambda), e.g. an input scaling x / 255 - 0.5
        ops = list(dict.fromkeys(  # the operations by their TensorFlow name (a layer's name may carry a _N suffix)
            f"tf.{layer.symbol}" if getattr(layer, "symbol", None) else layer.name for layer in model.layers
            if layer.__class__.__name__ == "TFOpLambda" and not shape_only(layer)))
        fix = (f"write the TensorFlow ops {', '.join(ops[:4])} as Keras layers (an input scaling x / 255 - 0.5 is "
               f"keras.layers.Rescaling(1 / 255, offset=-0.5)), or {leave_out}" if ops else
               f"{leave_out}, or report this model")
        raise InvalidInputError(f"{what}: TFMOT cannot build the quantization-aware model ({reason})", fix) from exc


def freeze_quantized(qat_model, names) -> list[str]:
    """Keep the weights of the wrapped layers ``names`` of ``qat_model`` out of training; returns those frozen.

    A layer built non-trainable stays so in Keras, but TFMOT's ``QuantizeWrapper`` takes each weight it quantizes
    out of the layer and lists it among its own trainable weights, whatever the layer says: here it is listed
    among the wrapper's non-trainable weights instead."""
    names, frozen = set(names), []
    for layer in qat_model.layers:
        inner = getattr(layer, "layer", None)
        if inner is None or inner.name not in names:
            continue
        inner.trainable = False
        # the quantized weights: the wrapper holds them (the layer itself reads their fake-quantized values)
        own = {w.name for w in inner.weights} | {weight.name for weight, _, _ in getattr(layer, "_weight_vars", [])}
        # (changed in place: assigning a list of variables to a layer's attribute makes Keras track them again)
        for i in reversed(range(len(layer._trainable_weights))):
            if layer._trainable_weights[i].name in own:
                layer._non_trainable_weights.insert(0, layer._trainable_weights[i])
                del layer._trainable_weights[i]
        frozen.append(inner.name)
    return frozen
