"""Loading, checking and inspecting Keras 2 (tf_keras) models for the optimization stages."""

from __future__ import annotations

import copy
import json
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Iterator

from edgedeploy.errors import InvalidInputError
from edgedeploy.core.files import LIMITS, check_input_file
from edgedeploy.keras.keras3 import unique_name  # noqa: F401  (layer names are made unique the same way in both)
from edgedeploy.core.weights import WeightStats, stats

KERNEL_LAYERS = ("Conv2D", "DepthwiseConv2D", "Dense")


@dataclass(frozen=True)
class ModelFileInfo:
    path: Path
    keras_version: str | None
    lambda_layers: tuple[str, ...]
    training_config: dict[str, Any] | None


def _walk(config: Any) -> Iterator[dict]:
    if isinstance(config, dict):
        if "class_name" in config:
            yield config
        for v in config.values():
            yield from _walk(v)
    elif isinstance(config, list):
        for v in config:
            yield from _walk(v)


def inspect_model_file(path: Path) -> ModelFileInfo:
    """Read a model file's config without building it (no code from the file runs)."""
    path = Path(path)
    if not path.exists():
        raise InvalidInputError(f"model {path} does not exist", "check the path to the .h5 or .keras model")
    check_input_file(path, "model", "model")  # a regular file of bounded size, before h5py or zipfile open it
    if path.suffix == ".h5":
        import h5py

        try:
            with h5py.File(path, "r") as f:
                attrs = dict(f.attrs)
        except Exception as exc:  # OSError mostly; a damaged file fails inside h5py in other ways too
            raise InvalidInputError(f"{path} is not a readable HDF5 Keras model ({exc})".splitlines()[0],
                                    "save the model with model.save('x.h5')") from exc
        raw = attrs.get("model_config")
        if raw is None:
            raise InvalidInputError(f"{path} holds weights only, not a model", "save the whole model with model.save('x.h5')")
        try:
            config = json.loads(raw if isinstance(raw, str) else raw.decode())
            version = attrs.get("keras_version")
            version = version.decode() if isinstance(version, bytes) else version
            tc = attrs.get("training_config")
            training = json.loads(tc if isinstance(tc, str) else tc.decode()) if tc is not None else None
        except (ValueError, AttributeError, TypeError) as exc:  # JSON and UTF-8 errors are ValueErrors
            raise InvalidInputError(f"{path}: its model config is damaged ({type(exc).__name__})",
                                    "save the model again with model.save('x.h5')") from exc
    elif path.suffix == ".keras":
        try:
            with zipfile.ZipFile(path) as z:
                unpacked = sum(i.file_size for i in z.infolist())
                if unpacked > LIMITS["model"] or z.getinfo("config.json").file_size > LIMITS["manifest"]:
                    raise InvalidInputError(f"{path} unpacks to {unpacked:,} bytes, over the limit of "
                                            f"{LIMITS['model']:,}", "see 'Size limits' in docs/files.md")
                config = json.loads(z.read("config.json"))
                meta = json.loads(z.read("metadata.json")) if "metadata.json" in z.namelist() else {}
        except InvalidInputError:
            raise
        except Exception as exc:  # a bad zip, a missing member, bad JSON, a damaged deflate stream ...
            raise InvalidInputError(f"{path} is not a readable .keras model ({type(exc).__name__}: {exc})".splitlines()[0],
                                    "re-save the model") from exc
        version = meta.get("keras_version")
        training = config.get("compile_config")
    else:
        raise InvalidInputError(f"{path} is not a Keras model file", "pass a .h5 or .keras file saved by tf_keras or Keras 3")
    if not isinstance(config, dict) or not isinstance(training, (dict, type(None))):
        raise InvalidInputError(f"{path}: its model config is not a Keras model config", "re-save the model")
    lambdas = tuple(str((c.get("config") if isinstance(c.get("config"), dict) else {}).get("name", "?"))
                    for c in _walk(config) if c.get("class_name") == "Lambda")
    return ModelFileInfo(path, version, lambdas, training)


def load_model(path: Path, trust_lambda: bool = False):
    """Load a Keras model as tf_keras (a Keras 3 file rebuilt, see :mod:`edgedeploy.keras.keras3`); refuse ``Lambda`` layers
    (they run code stored in the file) unless trusted."""
    from edgedeploy.keras import tfenv

    info = inspect_model_file(path)
    if info.lambda_layers and not trust_lambda:
        raise InvalidInputError(
            f"{path} has Lambda layers ({', '.join(info.lambda_layers[:3])}) whose code would run on loading",
            "pass --trust-lambda if you trust this file",
        )
    keras = tfenv.load().keras
    if info.keras_version and str(info.keras_version).startswith("3"):
        from edgedeploy.keras.keras3 import load_keras3

        model = load_keras3(path, trust_lambda)  # TFMOT wraps Keras 2 (tf_keras) models only
    else:
        try:
            model = keras.models.load_model(path, compile=False, safe_mode=not trust_lambda) \
                if path.suffix == ".keras" else keras.models.load_model(path, compile=False)
        except Exception as exc:  # Keras raises many kinds of errors on bad files
            raise InvalidInputError(f"{path} does not load with tf_keras ({type(exc).__name__}: {exc})".splitlines()[0],
                                    "check the file was saved by tf_keras 2.x") from exc
    if len(model.inputs) != 1 or len(model.outputs) != 1:
        raise InvalidInputError(f"{path} has {len(model.inputs)} inputs and {len(model.outputs)} outputs",
                                "the deployment tree needs a single-input, single-output classifier")
    return as_functional(model), info


def check_recurrent_layers(model, path: Path, leaves: Iterable[str], qat_leaves: Iterable[str]) -> None:
    """Refuse recurrent layers that TFLite's int8 conversion cannot take, before any training.

    Only a Keras ``LSTM`` layer becomes a TFLite operator of its own (UNIDIRECTIONAL_SEQUENCE_LSTM); any other
    recurrent layer that is not unrolled (GRU, SimpleRNN, RNN over a cell) becomes a loop whose int8
    calibration crashes the converter (a segmentation fault in TensorFlow 2.21), so no leaf could be converted.
    TFMOT has no QAT config for an LSTM, and the converter cannot convert its quantization-aware model, so the
    QAT leaves (``qat_leaves`` of ``leaves``) are refused for it; unrolled layers are plain operators and pass.
    """
    looping, lstm = [], []
    for layer in model.layers:
        kind = layer.__class__.__name__
        rnn = layer.forward_layer if kind == "Bidirectional" else layer
        if not hasattr(rnn, "cell") or getattr(rnn, "unroll", False):
            continue
        inside = rnn.__class__.__name__ if rnn is not layer else rnn.cell.__class__.__name__ if kind == "RNN" else ""
        what = f"{layer.name} ({kind}{f'({inside})' if inside else ''})"
        (lstm if rnn.__class__.__name__ == "LSTM" else looping).append(what)
    if looping:
        raise InvalidInputError(
            f"{path}: recurrent layer {', '.join(looping)} is not unrolled, and TFLite's int8 converter crashes on "
            "its loop", "rebuild it with unroll=True (fixed time steps), or use keras.layers.LSTM, which converts "
            "to one operator")
    qat = [leaf for leaf in leaves if leaf in set(qat_leaves)]
    if lstm and qat:
        others = [leaf for leaf in leaves if leaf not in qat]
        raise InvalidInputError(
            f"{path}: TFLite cannot convert the quantization-aware model of LSTM layer {', '.join(lstm)}, so "
            f"QAT leaf {', '.join(qat)} cannot be built",
            f"leave them out (e.g. --leaves {','.join(others or ['ptq', 'pruned', 'pruned_clustered'])}), or "
            "rebuild the LSTM with unroll=True")


def as_functional(model):
    """A ``Sequential`` model as the same functional model (fresh layers of the same names and weights).

    The graph rewrites (batch norms folded, separate ReLUs fused) and TFMOT's Conv + BatchNorm patterns work
    on functional models; other models are returned as they are.
    """
    if model.__class__.__name__ != "Sequential":
        return model
    from edgedeploy.keras import tfenv

    keras = tfenv.load().keras
    inputs = keras.Input(batch_shape=model.input_shape)
    x = inputs
    for layer in model.layers:
        x = layer.__class__.from_config(layer.get_config())(x)
    functional = keras.Model(inputs, x, name=model.name)
    for layer in model.layers:
        functional.get_layer(layer.name).set_weights(layer.get_weights())
    return functional


def clone(model):
    """A fresh copy with the same weights: TFMOT wrappers change the layers they wrap."""
    from edgedeploy.keras import tfenv

    keras = tfenv.load().keras
    copy = keras.models.clone_model(model)
    copy.set_weights(model.get_weights())
    return copy


def inner(layer):
    """The layer inside TFMOT wrappers (or the layer itself)."""
    while hasattr(layer, "layer") and hasattr(layer.layer, "weights"):
        layer = layer.layer
    return layer


def base_name(name: str) -> str:
    for prefix in ("quant_", "prune_low_magnitude_", "cluster_"):
        if name.startswith(prefix):
            return name[len(prefix):]
    return name


def kernel_of(layer):
    """The kernel weights of a (possibly wrapped) Conv2D/DepthwiseConv2D/Dense layer, read by name."""
    for w in layer.weights:
        short = w.name.split("/")[-1]
        if short in ("kernel:0", "depthwise_kernel:0"):
            return w.numpy()
    return None


def keras_weight_stats(model) -> list[WeightStats]:
    found = []
    for layer in model.layers:
        kind = inner(layer).__class__.__name__
        if kind not in KERNEL_LAYERS:
            continue
        k = kernel_of(layer)
        if k is None:
            continue
        # output channels: last axis of Conv2D/Dense kernels; the input-channel axis of depthwise kernels
        axis = 2 if kind == "DepthwiseConv2D" else k.ndim - 1
        found.append(stats(base_name(layer.name), kind, k, axis))
    return found


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
        if len(consumers) == 1 and _relu_kind(consumers[0], relu6) and _linear(layer):
            out.append(base_name(layer.name))
    return out


def _linear(layer) -> bool:
    act = getattr(inner(layer), "activation", None)
    return act is None or getattr(act, "__name__", "") == "linear"


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
    specs, rename, added, chained = [], {}, set(), set()
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
            # DepthwiseConv2D or Dense (KERNEL_LAYERS) without an activation of its own (any other one, e.g. after
            # a SeparableConv2D or an Add, makes quantize_apply refuse the whole model)
            sources = [n.inbound_layers for n in layer._inbound_nodes]
            source = sources[0] if len(sources) == 1 and not isinstance(sources[0], (list, tuple)) else None
            return (source is not None and source.__class__.__name__ in KERNEL_LAYERS
                    and _linear(source) and registry.supports(source))
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
    except (RuntimeError, ValueError) as exc:  # what quantize_apply raises for layers and weights it cannot take
        reason = " ".join(str(exc).split())[:300] or type(exc).__name__
        leave_out = "leave the QAT leaves out (e.g. --leaves ptq,pruned,pruned_clustered,clustered)"
        # TFMOT's model cloning misroutes TensorFlow math ops (TFOpLambda), e.g. an input scaling x / 255 - 0.5
        ops = [layer.name for layer in model.layers if layer.__class__.__name__ == "TFOpLambda" and not shape_only(layer)]
        fix = (f"write the TensorFlow ops {', '.join(ops[:4])} as Keras layers (an input scaling x / 255 - 0.5 is "
               f"keras.layers.Rescaling(1 / 255, offset=-0.5)), or {leave_out}" if ops else
               f"{leave_out}, or report this model")
        raise InvalidInputError(f"{what}: TFMOT cannot build the quantization-aware model ({reason})", fix) from exc
