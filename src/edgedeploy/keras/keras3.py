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
from edgedeploy.keras.keras3_activations import AS_GRAPH, AS_LAYER, RENAMED, chain, unique_name

# keyword arguments every tf_keras layer takes (tf_keras.layers.Layer.__init__ and its **kwargs)
_BASE_KWARGS = {"trainable", "name", "dtype", "dynamic", "input_dim", "input_shape", "batch_input_shape",
                "batch_size", "weights", "activity_regularizer", "autocast"}


# Keras 3 settings tf_keras has under another name
_RENAMED = {("LeakyReLU", "negative_slope"): "alpha"}
# the largest difference between the Keras 3 and the tf_keras model's outputs on seeded samples, relative to the
# outputs' largest magnitude (at least 1), that counts as the same function
TOLERANCE = 1e-4
CHECK_SAMPLES = 4
# Keras 3 operations (keras.ops) that tf_keras has as a TensorFlow operation layer (TFOpLambda) when one operand is
# a constant number, as in keras.applications' MobileNetV3 (its hard sigmoid is ReLU(6)(x + 3) * (1 / 6))
_OPERATIONS = {"Add": "__operators__.add", "Multiply": "math.multiply"}


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
        config["activation"] = activation = RENAMED.get(activation, activation)
        if kind == "Activation" and activation in AS_LAYER:  # the layer itself becomes that layer
            kind, settings = AS_LAYER[activation]
            cls = _tf_keras_class(kind, "keras.layers")
            config = {"name": config["name"], "trainable": config.get("trainable", True),
                      "dtype": config.get("dtype"), **settings}
        elif activation not in (*AS_LAYER, *AS_GRAPH) and not hasattr(_tf_keras_activations(), activation):
            raise _fail(path, f"layer {name} ({kind}) uses the activation {activation}, which tf_keras does not have")
    accepted = _accepted(cls)
    for key in [k for k in config if k not in accepted]:
        value = config.pop(key)
        if value not in (None, False, 0, [], {}):
            raise _fail(path, f"layer {name} ({kind}) sets {key} = {value!r}, which tf_keras's {kind} does not have")
    return {"class_name": kind, "config": config, "name": name}

def _tf_keras_activations():
    import tf_keras

    return tf_keras.activations


def _graph_activation(entry: dict) -> str | None:
    """The activation of a Keras 3 Activation layer that tf_keras computes with several layers; else None."""
    activation = entry["config"].get("activation") if entry["class_name"] == "Activation" else None
    return activation if activation in AS_GRAPH else None


def _activation_layers(layer: dict, calls: int, taken: set[str]) -> list[dict]:
    """For a layer whose activation tf_keras has only as a layer (``relu6``) or as several (``hard_silu``): those
    layers, to follow each of its ``calls``, and the layer's own activation set to linear. [] for any other
    layer."""
    activation = layer["config"].get("activation")
    if layer["class_name"] == "Activation" or activation not in (*AS_LAYER, *AS_GRAPH):
        return []
    layer["config"]["activation"] = "linear"
    name, dtype = unique_name(f"{layer['name']}_{activation}", taken), layer["config"].get("dtype")
    nodes = [[[layer["name"], i, 0, {}]] for i in range(calls)]
    if activation in AS_GRAPH:
        return chain(activation, name, nodes, dtype, taken)
    kind, settings = AS_LAYER[activation]
    return [{"class_name": kind, "name": name, "config": {"name": name, "dtype": dtype, **settings},
             "inbound_nodes": nodes}]


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


def _operation(path: Path, entry: dict, after: dict[str, str], models: set[str]) -> dict | None:
    """A Keras 3 operation of a tensor and a number (``x + 3.0``) as the same tf_keras TFOpLambda layer; None for
    any other layer (an operation tf_keras has not is refused by :func:`_layer_config`)."""
    kind, module = entry["class_name"], entry.get("module") or ""
    if not module.startswith("keras.src.ops") or kind not in _OPERATIONS:
        return None
    name, nodes = entry.get("name") or entry["config"].get("name"), []
    for node in entry.get("inbound_nodes", []):
        args = node.get("args", [])
        tensors = [a for a in args if isinstance(a, dict) and a.get("class_name") == "__keras_tensor__"]
        numbers = [a for a in args if isinstance(a, (int, float)) and not isinstance(a, bool)]
        if node.get("kwargs") or len(tensors) != 1 or len(numbers) != 1 or len(args) != 2:
            return None
        ref = _tensor_refs(path, name, tensors, after, models)[0]
        nodes.append([*ref[:3], {"y": float(numbers[0]), "name": None}])  # one reference, as tf_keras writes it
    return {"class_name": "TFOpLambda", "name": name, "inbound_nodes": nodes,
            "config": {"name": name, "trainable": True, "dtype": "float32", "function": _OPERATIONS[kind]}}


def _functional_config(path: Path, config: dict) -> dict:
    layers, after = [], dict[str, str]()
    taken = {entry.get("name") or entry["config"].get("name") for entry in config["layers"]}
    models: set[str] = set()
    for entry in config["layers"]:
        out = _nested_config(path, entry)
        if out:
            models.add(out["name"])
        operation = None if out else _operation(path, entry, after, models)
        if operation:
            layers.append(operation)
            continue
        out = out or _layer_config(path, entry)
        nodes = []
        for node in entry.get("inbound_nodes", []):
            # `training` is given at call time in tf_keras (Keras 3 records it for a Dropout, for example)
            kwargs = {k: v for k, v in node.get("kwargs", {}).items() if k != "training" and v is not None}
            if kwargs:
                raise _fail(path, f"layer {out['name']} is called with arguments {sorted(kwargs)}, which "
                                  "edgedeploy cannot rebuild in tf_keras")
            nodes.append(_tensor_refs(path, out["name"], node.get("args", []), after, models))
        graph = _graph_activation(out)
        if graph:  # the layer becomes the layers computing it, the last one under its name
            layers += chain(graph, out["name"], nodes, out["config"].get("dtype"), taken)
            continue
        out["inbound_nodes"] = nodes
        layers.append(out)
        follow = _activation_layers(out, len(nodes), taken)
        if follow:
            layers += follow
            after[out["name"]] = follow[-1]["name"]

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
    if kind == "Sequential" and _needs_graph(entry["config"]):
        kind, config = "Functional", _functional_config(path, _sequential_as_functional(path, entry["config"]))
    elif kind == "Sequential":
        config = _sequential_config(path, entry["config"])
    else:
        config = _functional_config(path, entry["config"])
    return {"class_name": kind, "config": {**config, "name": name}, "name": name}


def _needs_graph(config: dict) -> bool:
    """Whether a Sequential model's config has an activation tf_keras computes with several layers (which a
    Sequential model cannot hold: they read the activation's input twice)."""
    return any(entry["config"].get("activation") in AS_GRAPH for entry in config["layers"])


def _sequential_entries(config: dict, taken: set[str]) -> list[dict]:
    """A Sequential model's layer entries, an input layer first where it was built without one (as when it is
    built, so that tf_keras numbers its calls as Keras 3's config does)."""
    entries = config["layers"]
    if config.get("build_input_shape") and (not entries or entries[0]["class_name"] != "InputLayer"):
        entries = [{"module": "keras.layers", "class_name": "InputLayer",
                    "config": {"batch_shape": list(config["build_input_shape"]),
                               "name": unique_name(f"{config.get('name', 'sequential')}_input", taken)}}, *entries]
    return entries


def _sequential_as_functional(path: Path, config: dict) -> dict:
    """A Sequential model's Keras 3 config as the config of the same functional model, each layer reading the
    one before it."""
    entries = _sequential_entries(config, {entry["config"].get("name") for entry in config["layers"]})
    if not entries or entries[0]["class_name"] != "InputLayer":
        raise _fail(path, f"the Sequential model {config.get('name', 'sequential')} has no input shape")
    layers, previous = [], ""
    for entry in entries:
        name = entry.get("name") or entry["config"]["name"]
        tensor = {"class_name": "__keras_tensor__", "config": {"keras_history": [previous, 0, 0]}}
        layers.append({**entry, "name": name, "inbound_nodes": [{"args": [tensor], "kwargs": {}}] if previous else []})
        previous = name
    first = layers[0]["name"]
    return {"name": config.get("name", "sequential"), "layers": layers, "input_layers": [[first, 0, 0]],
            "output_layers": [[previous, 0, 0]]}


def _sequential_config(path: Path, config: dict) -> dict:
    layers, taken = [], {entry["config"].get("name") for entry in config["layers"]}
    for entry in _sequential_entries(config, taken):
        layers.append(_nested_config(path, entry) or _layer_config(path, entry))
        for follow in _activation_layers(layers[-1], 1, taken):
            layers.append({k: v for k, v in follow.items() if k != "inbound_nodes"})
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
    if kind == "Sequential" and _needs_graph(config):
        functional = _functional_config(path, _sequential_as_functional(path, config))
        build = lambda: tf_keras.Model.from_config(functional)  # noqa: E731
    elif kind == "Sequential":
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
    _check_same_function(path, source, model)
    return model


def _check_same_function(path: Path, source, model) -> None:
    """The tf_keras model computes what the Keras 3 one does: their outputs on seeded samples in [-4, 4) (where
    the hard activations bend) differ by at most :data:`TOLERANCE`; else one line says by how much. A model with
    a non-float input is not checked."""
    import numpy as np

    if not all(t.dtype.is_floating for t in model.inputs):  # token ids, say: no seeded floats to check on
        return
    rng = np.random.default_rng(0)
    shapes = model.input_shape if isinstance(model.input_shape, list) else [model.input_shape]
    samples = [rng.uniform(-4, 4, size=(CHECK_SAMPLES, *[d or 8 for d in shape[1:]])).astype("float32")
               for shape in shapes]
    inputs = samples if len(samples) > 1 else samples[0]
    ref, got = source(inputs, training=False), model(inputs, training=False)
    ref, got = ([np.asarray(t, dtype=np.float64) for t in (v if isinstance(v, (list, tuple)) else [v])]
                for v in (ref, got))
    for r, g in zip(ref, got):
        diff = float(np.max(np.abs(r - g))) if r.size else 0.0
        if not diff <= TOLERANCE * max(1.0, float(np.max(np.abs(r))) if r.size else 1.0):
            raise _fail(path, f"rebuilt in tf_keras, the model's outputs differ from Keras 3's by up to {diff:.3g} "
                              f"on {CHECK_SAMPLES} seeded samples")
