"""Nested models flattened into one graph of plain layers, with the same weights.

A Functional or Sequential model used as a layer of another (a ``keras.applications`` base under a new head,
a block model of the user's own, nested to any depth) is opaque to the tree: TFMOT cannot wrap a model inside a
model, and the graph rewrites and per-layer techniques see one layer where there are dozens. Its layers are put
into the outer model's graph in its place, read from the model config (no code runs): each keeps its name
unless an outer layer or another nested layer already has it (then ``_`` is appended), and its weights are
copied from the loaded layer. The flat model is checked against the nested one on samples before it is used.

What cannot be flattened stops with one line naming the layer and the reason: a nested model called more than
once (its calls share its weights, which separate layers would not), a subclassed model (its ``call`` is code,
not a graph), a call with arguments other than ``training``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from edgedeploy.errors import InvalidInputError
from edgedeploy.keras.eager_outputs import model_outputs
from edgedeploy.keras.inbound import call_refs, is_ref
from edgedeploy.keras.keras3 import FLATTEN_HINT, subclassed, unique_name

MODEL_KINDS = ("Functional", "Model", "Sequential")
# the largest difference between the nested and the flat model's outputs, relative to the outputs' largest
# magnitude (at least 1), that counts as the same function: both compute the same float32 operations
TOLERANCE = 1e-4
CHECK_SAMPLES = 8  # seeded samples the flat model is checked on when no data is at hand


def _fix_hint() -> str:
    return FLATTEN_HINT


class _Inliner:
    """Collects the flat graph's layer configs (:meth:`functional`, :meth:`sequential`) and, for each, the loaded
    layer whose weights it takes."""

    def __init__(self, path: Path, taken: set[str], model_class: type) -> None:
        self.path, self.taken, self.model_class = path, taken, model_class
        self.specs: list[dict] = []
        self.copies: list[tuple[Any, str]] = []  # (loaded layer, its name in the flat model)
        self.flattened: list[str] = []

    def refuse(self, where: str, why: str) -> InvalidInputError:
        return InvalidInputError(f"{self.path}: layer {where} {why}, so the model cannot be flattened", _fix_hint())

    def model(self, live, kind: str, config: dict, call: list[list], where: str) -> list[list]:
        """The layers of the nested model ``live`` (its ``config``), reading ``call``; returns its outputs."""
        if type(live).__name__ not in MODEL_KINDS:
            raise subclassed(self.path, where, type(live).__name__)
        self.flattened.append(where)
        if kind == "Sequential":
            return self.sequential(live, config, call, where)
        return self.functional(live, config, call, where)

    def functional(self, live, config: dict, call: list[list] | None, where: str) -> list[list]:
        """The layers of a functional model; ``call`` None for the outer model (its inputs stay), else the
        references its inputs read. Returns the references of its outputs in the flat graph."""
        refs: dict[tuple, list] = {}  # (layer, node, tensor) of this config -> reference in the flat graph
        rename: dict[str, str] = {}
        if call is not None:
            inputs = _ends(config["input_layers"])
            if len(inputs) != len(call):
                raise self.refuse(where, f"is called on {len(call)} tensors but has {len(inputs)} inputs")
            refs.update({tuple(ref[:3]): target for ref, target in zip(inputs, call)})
        for spec in config["layers"]:
            name, kind = spec["name"], spec["class_name"]
            if kind == "InputLayer" and call is not None:
                continue  # read through ``refs``
            nodes = [_resolve(node, refs, rename) for node in spec["inbound_nodes"]]
            inside = f"{where}/{name}" if where else name
            if kind in MODEL_KINDS or isinstance(live.get_layer(name), self.model_class):
                if len(nodes) != 1:
                    raise self.refuse(inside, f"is a nested {kind} model called {len(nodes)} times, whose calls "
                                              "share its weights")
                outputs = self.model(live.get_layer(name), kind, spec["config"], self.call_refs(nodes[0], inside),
                                     inside)
                # read at whatever node index the config gives its one call (tf_keras counts the nested
                # model's own node first)
                refs.update({(name, None, i): ref for i, ref in enumerate(outputs)})
                continue
            new = name if call is None else unique_name(name, self.taken)
            rename[name] = new
            self.specs.append({**spec, "name": new, "config": {**spec["config"], "name": new}, "inbound_nodes": nodes})
            self.copies.append((live.get_layer(name), new))
        return [_resolve(ref, refs, rename)[:3] for ref in _ends(config["output_layers"])]

    def sequential(self, live, config: dict, call: list[list], where: str) -> list[list]:
        if len(call) != 1:
            raise self.refuse(where, f"is a Sequential model called on {len(call)} tensors")
        ref = call[0]
        specs = [spec for spec in config["layers"] if spec["class_name"] != "InputLayer"]
        if len(specs) != len(live.layers):
            raise self.refuse(where, "is a Sequential model whose config and layers differ")
        for spec, layer in zip(specs, live.layers):
            name = spec["config"]["name"]
            if spec["class_name"] in MODEL_KINDS or isinstance(layer, self.model_class):
                outputs = self.model(layer, spec["class_name"], spec["config"], [ref], f"{where}/{name}")
                if len(outputs) != 1:
                    raise self.refuse(f"{where}/{name}", f"has {len(outputs)} outputs inside a Sequential model")
                ref = outputs[0]
                continue
            new = unique_name(name, self.taken)
            config = {k: v for k, v in spec["config"].items() if k not in ("batch_input_shape", "input_shape")}
            self.specs.append({**spec, "name": new, "config": {**config, "name": new},
                               "inbound_nodes": [[[*ref, {}]]]})
            self.copies.append((layer, new))
            ref = [new, 0, 0]
        return [ref]

    def call_refs(self, node: Any, where: str) -> list[list]:
        """The tensors a nested model is called on, in order; ``training`` is dropped (the flat layers take it
        from the outer call), any other argument refused."""
        found: list[list] = []
        for ref in call_refs(node):
            extra = {k: v for k, v in (ref[3] if len(ref) > 3 and isinstance(ref[3], dict) else {}).items()
                     if k != "training" and v is not None}
            if extra:
                raise self.refuse(where, f"is called with arguments {sorted(extra)}")
            found.append(list(ref[:3]))
        return found


def _resolve(obj: Any, refs: dict[tuple, list], rename: dict[str, str]) -> Any:
    """A node's references (``[layer, node, tensor, kwargs]``, also inside its kwargs) in the flat graph."""
    if is_ref(obj):
        for key in ((obj[0], obj[1], obj[2]), (obj[0], None, obj[2])):
            if key in refs:
                return [*refs[key], *obj[3:]]
        return [rename.get(obj[0], obj[0]), *obj[1:]]
    if isinstance(obj, (list, tuple)):
        return [_resolve(v, refs, rename) for v in obj]
    if isinstance(obj, dict):
        return {k: _resolve(v, refs, rename) for k, v in obj.items()}
    return obj


def _ends(value: list) -> list:
    """A model's ``input_layers``/``output_layers``: one reference or a list of them, as a list."""
    return [value] if value and isinstance(value[0], str) else list(value)


def flatten_nested(model, path: Path):
    """``model`` (a tf_keras Functional) with every nested Functional or Sequential model replaced by its layers.
    Returns (model, [the nested models' names, ``outer/inner`` for deeper ones]); (the model itself, []) when
    nothing is nested."""
    from edgedeploy.keras import tfenv

    keras = tfenv.load().keras
    if not any(isinstance(layer, keras.Model) for layer in model.layers):
        return model, []
    config = model.get_config()
    inliner = _Inliner(Path(path), {spec["name"] for spec in config["layers"]}, keras.Model)
    outputs = inliner.functional(model, config, None, "")
    flat_config = {**config, "layers": inliner.specs, "output_layers": outputs}
    try:
        flat = keras.Model.from_config(flat_config)
    except Exception as exc:  # tf_keras raises many kinds of errors on configs it cannot build
        raise InvalidInputError(f"{path}: the nested models {', '.join(inliner.flattened)} cannot be rebuilt as "
                                f"one graph ({type(exc).__name__}: {' '.join(str(exc).split())[:200]})",
                                _fix_hint()) from exc
    for layer, name in inliner.copies:
        target, weights = flat.get_layer(name), layer.get_weights()
        if [w.shape for w in target.get_weights()] != [w.shape for w in weights]:
            raise InvalidInputError(f"{path}: layer {name} has weights of shapes {[list(w.shape) for w in weights]} "
                                    f"nested but {[list(w.shape) for w in target.get_weights()]} flattened",
                                    _fix_hint())
        target.set_weights(weights)
    return flat, inliner.flattened


def seeded_samples(model, count: int = CHECK_SAMPLES) -> np.ndarray:
    """``count`` seeded samples in [0, 1) of the model's input shape (a dimension left open: 8)."""
    shape = [d or 8 for d in model.input_shape[1:]]
    return np.random.default_rng(0).uniform(size=(count, *shape)).astype("float32")


def _outputs(model, samples: np.ndarray) -> np.ndarray:
    """``model``'s outputs on ``samples`` (32 at a time, :func:`~edgedeploy.keras.eager_outputs.model_outputs`),
    one row of every output's values per sample."""
    if not len(samples):
        return np.zeros((0, 0))
    out = model_outputs(model, samples, batch=32)
    outs = out if isinstance(out, list) else [out]
    return np.concatenate([np.asarray(o, dtype=np.float64).reshape(len(samples), -1) for o in outs], axis=1)


def same_outputs(nested, flat, samples: np.ndarray, path: Path, where: str) -> float:
    """The largest difference between ``nested``'s and ``flat``'s outputs on ``samples`` (``where``: what they
    are, for the message); over :data:`TOLERANCE` of the outputs' magnitude it stops with one line."""
    ref, got = _outputs(nested, samples), _outputs(flat, samples)
    diff = float(np.max(np.abs(ref - got))) if ref.size else 0.0
    if not diff <= TOLERANCE * max(1.0, float(np.max(np.abs(ref))) if ref.size else 1.0):
        raise InvalidInputError(f"{path}: flattened, the model's outputs differ from the nested model's by up to "
                                f"{diff:.3g} on {where}", _fix_hint())
    return diff
