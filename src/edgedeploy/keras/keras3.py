"""Keras 3 models rebuilt as the same tf_keras (Keras 2) models, which TFMOT can wrap.

TensorFlow 2.21's ``tf.keras`` is Keras 3 unless ``TF_USE_LEGACY_KERAS=1`` is set, so models trained today are
often Keras 3 files (``.keras``, or ``.h5`` saved by Keras 3). tf_keras cannot read them. Their layer graph is
read from Keras 3 itself (Keras 3 is installed with TensorFlow) and written out in tf_keras's config format:
the same layers with the same names, settings and connections; then every layer's weights are copied by name.
What tf_keras has no equivalent for (a Keras 3 operation such as ``keras.ops.divide`` in the graph, a setting
such as LoRA) is refused with one line naming the layer.
"""

from __future__ import annotations

import inspect
import re
from pathlib import Path
from typing import Any

from edgedeploy.errors import InvalidInputError

# keyword arguments every tf_keras layer takes (tf_keras.layers.Layer.__init__ and its **kwargs)
_BASE_KWARGS = {"trainable", "name", "dtype", "dynamic", "input_dim", "input_shape", "batch_input_shape",
                "batch_size", "weights", "activity_regularizer", "autocast"}


# Keras 3 settings tf_keras has under another name
_RENAMED = {("LeakyReLU", "negative_slope"): "alpha"}
# Keras 3 activations tf_keras has under another name, or as a layer of its own (the same function)
_ACTIVATION_NAMES = {"silu": "swish"}
_ACTIVATION_LAYERS = {"relu6": ("ReLU", {"max_value": 6.0}), "leaky_relu": ("LeakyReLU", {"alpha": 0.2})}


def _fail(path: Path, what: str) -> InvalidInputError:
    return InvalidInputError(f"{path}: {what}",
                             "re-create the model with tf_keras (import tf_keras as keras) and save it as .h5")


def _plain(obj: Any) -> Any:
    """Keras 3's serialized objects ({module, class_name, config, registered_name}) in tf_keras's plain form;
    a dtype policy becomes its dtype name."""
    if isinstance(obj, dict):
        if obj.get("class_name") in ("DTypePolicy", "FloatDTypePolicy") and isinstance(obj.get("config"), dict):
            return obj["config"]["name"]
        if "class_name" in obj and "config" in obj and ("module" in obj or "registered_name" in obj):
            target = _tf_keras_class(obj["class_name"], obj.get("module") or "")
            config = {k: _plain(v) for k, v in obj["config"].items()}
            if target is not None:
                accepted = _accepted(target)
                config = {k: v for k, v in config.items() if k in accepted or v is not None}
            return {"class_name": obj["class_name"], "config": config}
        return {k: _plain(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_plain(v) for v in obj]
    return obj


def _tf_keras_class(class_name: str, module: str):
    import tf_keras

    for space in (tf_keras.layers, tf_keras.initializers, tf_keras.regularizers, tf_keras.constraints):
        if space.__name__.rsplit(".", 1)[-1] in module and hasattr(space, class_name):
            return getattr(space, class_name)
    return None


def _accepted(cls) -> set[str]:
    """The keyword arguments ``cls`` takes: its own, and its bases' where it passes **kwargs on."""
    names: set[str] = set(_BASE_KWARGS) if _is_layer_class(cls) else set()
    for klass in cls.__mro__:
        if "__init__" not in vars(klass):
            continue
        params = inspect.signature(klass.__init__).parameters
        names |= {n for n, p in params.items() if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)} - {"self"}
        if not any(p.kind == p.VAR_KEYWORD for p in params.values()):
            break
    return names


def _is_layer_class(cls) -> bool:
    import tf_keras

    return isinstance(cls, type) and issubclass(cls, tf_keras.layers.Layer)


def _layer_config(path: Path, entry: dict) -> dict:
    """One layer of a Keras 3 model config as a tf_keras layer config."""
    name, kind = entry.get("name") or entry["config"].get("name"), entry["class_name"]
    module = entry.get("module") or ""
    cls = _tf_keras_class(kind, module) if module.startswith("keras.layers") or module == "keras" else None
    if cls is None and module.startswith("keras.src.ops"):
        raise InvalidInputError(f"{path}: {name} is a Keras 3 operation ({kind}), which tf_keras has no layer for",
                                "write it as a Keras layer (an input scaling x / 255 - 0.5 is "
                                "keras.layers.Rescaling(1 / 255, offset=-0.5)) and save the model again")
    if cls is None:
        raise _fail(path, f"layer {name} is a Keras 3 {kind} ({module or 'custom'}), which tf_keras has no layer for")
    if kind == "Lambda":  # its code is stored as Keras 3 bytecode, which tf_keras cannot load
        raise _fail(path, f"layer {name} is a Keras 3 Lambda, whose code tf_keras cannot load")
    config = {k: _plain(v) for k, v in entry["config"].items()}
    if kind == "InputLayer":
        config["batch_input_shape"] = config.pop("batch_shape", config.pop("batch_input_shape", None))
    for (klass, key), renamed in _RENAMED.items():
        if kind == klass and key in config:
            config[renamed] = config.pop(key)
    activation = config.get("activation")
    if isinstance(activation, str):
        config["activation"] = activation = _ACTIVATION_NAMES.get(activation, activation)
        if kind == "Activation" and activation in _ACTIVATION_LAYERS:  # the layer itself becomes that layer
            kind, settings = _ACTIVATION_LAYERS[activation]
            cls = _tf_keras_class(kind, "keras.layers")
            config = {"name": config["name"], "trainable": config.get("trainable", True),
                      "dtype": config.get("dtype"), **settings}
        elif activation not in _ACTIVATION_LAYERS and not hasattr(_tf_keras_activations(), activation):
            raise _fail(path, f"layer {name} ({kind}) uses the activation {activation}, which tf_keras does not have")
    accepted = _accepted(cls)
    for key in [k for k in config if k not in accepted]:
        value = config.pop(key)
        if value not in (None, False, 0, [], {}):
            raise _fail(path, f"layer {name} ({kind}) sets {key} = {value!r}, which tf_keras's {kind} does not have")
    return {"class_name": kind, "config": config, "name": name}

def unique_name(name: str, taken: set[str]) -> str:
    """``name``, with ``_`` appended until no layer in ``taken`` has it; the result is added to ``taken``."""
    while name in taken:
        name += "_"
    taken.add(name)
    return name


def _tf_keras_activations():
    import tf_keras

    return tf_keras.activations


def _activation_layer(layer: dict, taken: set[str]) -> dict | None:
    """For a layer whose activation tf_keras has only as a layer (``relu6``): that layer, to follow it, and the
    layer's own activation set to linear. None for any other layer."""
    activation = layer["config"].get("activation")
    if layer["class_name"] == "Activation" or activation not in _ACTIVATION_LAYERS:
        return None
    kind, settings = _ACTIVATION_LAYERS[activation]
    layer["config"]["activation"] = "linear"
    name = unique_name(f"{layer['name']}_{activation}", taken)
    return {"class_name": kind, "name": name, "config": {"name": name, "dtype": layer["config"].get("dtype"), **settings}}


def _tensor_refs(path: Path, name: str, args: Any, after: dict[str, str], models: set[str]) -> list[list[Any]]:
    """The [layer, node, tensor, {}] references of the Keras tensors in a node's arguments, in order (a layer in
    ``after`` read through the activation layer that follows it; a call of a nested model in ``models`` one node
    later, as tf_keras counts the model's own node first)."""
    refs = []
    for a in args if isinstance(args, (list, tuple)) else [args]:
        if isinstance(a, (list, tuple)):
            refs += _tensor_refs(path, name, a, after, models)
        elif isinstance(a, dict) and a.get("class_name") == "__keras_tensor__":
            layer, node, index = a["config"]["keras_history"]
            refs.append([after.get(layer, layer), node + (layer in models), index, {}])
        else:
            raise _fail(path, f"layer {name} is called with a constant argument ({a!r}), which tf_keras cannot "
                              "rebuild")
    return refs


def _functional_config(path: Path, config: dict) -> dict:
    layers, after = [], dict[str, str]()
    taken = {entry.get("name") or entry["config"].get("name") for entry in config["layers"]}
    models: set[str] = set()
    for entry in config["layers"]:
        out = _nested_config(path, entry)
        if out:
            models.add(out["name"])
        out = out or _layer_config(path, entry)
        nodes = []
        for node in entry.get("inbound_nodes", []):
            # `training` is given at call time in tf_keras (Keras 3 records it for a Dropout, for example)
            kwargs = {k: v for k, v in node.get("kwargs", {}).items() if k != "training" and v is not None}
            if kwargs:
                raise _fail(path, f"layer {out['name']} is called with arguments {sorted(kwargs)}, which "
                                  "edgedeploy cannot rebuild in tf_keras")
            nodes.append(_tensor_refs(path, out["name"], node.get("args", []), after, models))
        out["inbound_nodes"] = nodes
        layers.append(out)
        activation = _activation_layer(out, taken)
        if activation:
            activation["inbound_nodes"] = [[[out["name"], i, 0, {}]] for i in range(len(nodes))]
            layers.append(activation)
            after[out["name"]] = activation["name"]

    def ends(value):  # Keras 3 writes one input or output as [name, 0, 0], several as a list of those
        return [value] if value and isinstance(value[0], str) else value

    outputs = [[after.get(layer, layer), node + (layer in models), *rest]
               for layer, node, *rest in ends(config["output_layers"])]
    return {"name": config.get("name", "model"), "layers": layers, "input_layers": ends(config["input_layers"]),
            "output_layers": outputs}


def _nested_config(path: Path, entry: dict) -> dict | None:
    """A Functional or Sequential model used as a layer, as the same tf_keras model's config (flattened after
    loading, see :mod:`edgedeploy.keras.flatten`); None for any other layer."""
    kind, module = entry["class_name"], entry.get("module") or ""
    if kind not in ("Functional", "Sequential") or not module.startswith("keras"):
        return None
    name = entry.get("name") or entry["config"].get("name")
    config = _sequential_config(path, entry["config"]) if kind == "Sequential" else \
        _functional_config(path, entry["config"])
    return {"class_name": kind, "config": {**config, "name": name}, "name": name}


def _sequential_config(path: Path, config: dict) -> dict:
    layers, taken = [], {entry["config"].get("name") for entry in config["layers"]}
    entries = config["layers"]
    if config.get("build_input_shape") and (not entries or entries[0]["class_name"] != "InputLayer"):
        # an input layer first, as when it is built, so that tf_keras numbers its calls as Keras 3's config does
        entries = [{"module": "keras.layers", "class_name": "InputLayer",
                    "config": {"batch_shape": list(config["build_input_shape"]),
                               "name": unique_name(f"{config.get('name', 'sequential')}_input", taken)}}, *entries]
    for entry in entries:
        layers.append(_nested_config(path, entry) or _layer_config(path, entry))
        layers += filter(None, [_activation_layer(layers[-1], taken)])
    return {"name": config.get("name", "sequential"), "layers": layers}


def _copy_weights(path: Path, source, model) -> None:
    """Every layer's weights from the Keras 3 model ``source`` into the tf_keras ``model``, by name (a nested
    model's layer by layer: tf_keras orders a model's weights differently)."""
    import numpy as np

    for layer in source.layers:
        target = model.get_layer(layer.name)
        if layer.__class__.__name__ in ("Functional", "Sequential") and hasattr(target, "layers"):
            _copy_weights(path, layer, target)
            continue
        weights = layer.get_weights()
        if [w.shape for w in target.get_weights()] != [w.shape for w in weights]:
            raise _fail(path, f"layer {layer.name} ({layer.__class__.__name__}) has weights of shapes "
                              f"{[list(w.shape) for w in weights]} in Keras 3 but "
                              f"{[list(w.shape) for w in target.get_weights()]} in tf_keras")
        target.set_weights([np.asarray(w) for w in weights])


# how to bring a model whose nested models cannot be flattened (edgedeploy.keras.flatten)
FLATTEN_HINT = ("build the model without a model inside it (keras.applications models take input_tensor=), or "
                "call the inner model once")


def subclassed(path: Path, where: str, kind: str) -> InvalidInputError:
    """The refusal of a subclassed model used as a layer (``where``, of class ``kind``)."""
    return InvalidInputError(f"{path}: layer {where} is a subclassed model ({kind}), whose call is code, not a graph "
                             "of layers, so the model cannot be flattened", FLATTEN_HINT)


def _refuse_subclassed(path: Path, model, model_class: type, where: str = "") -> None:
    """A subclassed model used as a layer (at any depth) cannot be flattened: refused with its name."""
    for layer in model.layers:
        inside = f"{where}/{layer.name}" if where else layer.name
        if isinstance(layer, model_class):
            if layer.__class__.__name__ not in ("Functional", "Sequential"):
                raise subclassed(path, inside, layer.__class__.__name__)
            _refuse_subclassed(path, layer, model_class, inside)


def load_keras3(path: Path, trust_lambda: bool = False):
    """The Keras 3 model in ``path`` rebuilt as a tf_keras model with the same layers and weights."""
    import keras as keras3  # Keras 3 (a TensorFlow dependency), whatever TF_USE_LEGACY_KERAS says
    import tf_keras

    try:
        source = keras3.saving.load_model(path, compile=False, safe_mode=not trust_lambda)
    except Exception as exc:  # Keras raises many kinds of errors on bad files
        custom = re.search(r"Could not locate (?:class|function) '([^']+)'", str(exc))
        if custom:
            raise _fail(path, f"the model uses {custom.group(1)}, a custom Keras 3 class or function that tf_keras "
                              "cannot rebuild") from exc
        raise InvalidInputError(f"{path} does not load with Keras 3 ({type(exc).__name__}: "
                                f"{' '.join(str(exc).split())[:200]})", "check the file was saved by Keras 3") from exc
    kind = source.__class__.__name__
    if kind not in ("Functional", "Sequential"):
        raise _fail(path, f"the model is a subclassed Keras 3 model ({kind}); only Sequential and functional "
                          "models can be rebuilt in tf_keras")
    _refuse_subclassed(path, source, keras3.Model)
    config = source.get_config()
    if kind == "Sequential":
        sequential = _sequential_config(path, config)
        build = lambda: tf_keras.Sequential.from_config(sequential)  # noqa: E731
    else:
        functional = _functional_config(path, config)
        build = lambda: tf_keras.Model.from_config(functional)  # noqa: E731
    try:
        model = build()
    except Exception as exc:  # tf_keras raises many kinds of errors on configs it cannot take
        raise _fail(path, f"tf_keras cannot rebuild this Keras 3 model ({type(exc).__name__}: "
                          f"{' '.join(str(exc).split())[:200]})") from exc
    _copy_weights(path, source, model)
    return model
