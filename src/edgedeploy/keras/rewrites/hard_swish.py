"""Hard-swish and hard-sigmoid written as TensorFlow operations (``keras.applications`` MobileNetV3: ``x + 3``,
``ReLU(6)``, ``* (1 / 6)``, ``Multiply``) as one layer each, before QAT.

TFMOT's QAT cannot clone the TensorFlow operations (``TFOpLambda`` layers) these are built from, and fake
quantization between them would keep the int8 converter from fusing hard-swish into the one HARD_SWISH operator
``ptq`` gets. :class:`HardSwish` and :class:`HardSigmoid` compute the same operations on the same values (the
same float outputs); QAT fake-quantizes their outputs only (TFMOT's output config), so the converter still sees
``x * (relu6(x + 3) * (1 / 6))`` and writes HARD_SWISH. A squeeze-and-excitation's gate (a hard-sigmoid of a
convolution's output) keeps its ``ReLU(6)`` after the convolution, whose bias takes the ``+ 3``, as ``ptq``'s
converter folds it: a fake quantization between the two would leave an int8 ADD of its own.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any

import numpy as np

from edgedeploy.keras.model import KERNEL_LAYERS

ADD = ("__operators__.add", "math.add")
SCALE = {"math.multiply": 1.0 / 6.0, "math.truediv": 6.0}  # function -> the constant of a hard-sigmoid's last step


@lru_cache(maxsize=1)
def layer_classes() -> dict[str, Any]:
    """The two layers by name, registered with Keras (as ``edgedeploy>NAME``) when first asked for."""
    from edgedeploy.keras import tfenv

    env = tfenv.load()
    tf, keras = env.tf, env.keras
    layer: Any = keras.layers.Layer  # (the class of the Keras that tfenv loaded)

    # registered: rebuilding a model from its config (a rewrite, TFMOT's quantize_apply) finds them by name
    @keras.utils.register_keras_serializable(package="edgedeploy")
    class HardSigmoid(layer):
        """``relu6(x + 3) * (1 / 6)`` (``divide``: ``relu6(x + 3) / 6``), as the operations it replaces;
        ``clipped``: only the last step, its input already ``relu6(x + 3)``."""

        def __init__(self, divide: bool = False, clipped: bool = False, **kwargs):
            super().__init__(**kwargs)
            self.divide, self.clipped = divide, clipped

        def call(self, inputs):
            shifted = inputs if self.clipped else tf.nn.relu6(inputs + 3.0)
            return shifted / 6.0 if self.divide else tf.math.multiply(shifted, 1.0 / 6.0)

        def get_config(self):
            return {**super().get_config(), "divide": self.divide, "clipped": self.clipped}

    @keras.utils.register_keras_serializable(package="edgedeploy")
    class HardSwish(HardSigmoid):
        """``x * hard_sigmoid(x)``."""

        def call(self, inputs):
            return inputs * super().call(inputs)

    return {"HardSigmoid": HardSigmoid, "HardSwish": HardSwish}


def _constant(spec: dict) -> float | None:
    """The scalar ``y`` a TFOpLambda layer's spec applies, if it applies one to a single tensor."""
    nodes = spec["inbound_nodes"]
    node = nodes[0] if len(nodes) == 1 else None
    if not (isinstance(node, list) and len(node) == 4 and isinstance(node[0], str) and isinstance(node[3], dict)):
        return None
    y = node[3].get("y")
    return float(y) if isinstance(y, (int, float)) and not isinstance(y, bool) else None


def _source(spec: dict) -> str | None:
    """The one layer a spec reads (a TFOpLambda's node is [name, 0, 0, kwargs], a layer's [[name, 0, 0, {}]])."""
    nodes = spec["inbound_nodes"]
    if len(nodes) != 1:
        return None
    node = nodes[0]
    if isinstance(node, list) and node and isinstance(node[0], str):
        return node[0]
    if isinstance(node, list) and len(node) == 1 and isinstance(node[0], list) and node[0][2] == 0:
        return node[0][0]
    return None


def hard_activations_as_layers(model):
    """Each hard-sigmoid (``relu6(x + 3) * (1 / 6)`` or ``/ 6`` from TensorFlow operations and a ``ReLU(6)``) as a
    :class:`HardSigmoid` named after its last operation, and each hard-swish (``Multiply`` of ``x`` and its
    hard-sigmoid) as a :class:`HardSwish` named after the ``Multiply``. A hard-sigmoid of a Conv/Dense layer's output
    (a squeeze-and-excitation's gate) keeps its ``ReLU(6)``, the ``+ 3`` moved into that layer's bias. Same
    function (to float rounding where a bias moved). Returns (model, [names])."""
    from edgedeploy.keras import tfenv

    keras = tfenv.load().keras
    if model.__class__.__name__ != "Functional":
        return model, []
    config = model.get_config()
    specs = {spec["name"]: spec for spec in config["layers"]}
    consumers = {layer.name: len(layer._outbound_nodes) for layer in model.layers}
    drop: set[str] = set()
    replace: dict[str, tuple[str, str, bool, bool]] = {}  # spec to replace -> (class, source, divide, clipped)
    shift: dict[str, float] = {}  # kernel layer -> what its bias gains
    reroute: dict[str, str] = {}  # layer -> the layer it reads instead
    for spec in config["layers"]:
        last = spec
        if last["class_name"] != "TFOpLambda" or last["config"].get("function") not in SCALE:
            continue
        relu = specs.get(_source(last) or "")
        add = specs.get(_source(relu) or "") if relu else None
        if relu is None or add is None or not _is_relu6(relu) or consumers[relu["name"]] != 1:
            continue
        if add["class_name"] != "TFOpLambda" or add["config"].get("function") not in ADD or _constant(add) != 3.0:
            continue
        if consumers[add["name"]] != 1 or _constant(last) != SCALE[last["config"]["function"]]:
            continue
        source, divide = _source(add), last["config"]["function"] == "math.truediv"
        if source is None:
            continue
        product = _hard_swish_product(config["layers"], last["name"], source) if consumers[last["name"]] == 1 else None
        if product is not None:
            drop |= {add["name"], relu["name"], last["name"]}
            replace[product] = ("HardSwish", source, divide, False)
        elif _biased_kernel(specs[source]) and consumers[source] == 1:
            # the + 3 into the kernel's bias, as ptq's converter folds it: the ReLU(6) then follows the kernel
            # (TFMOT fuses the two, the converter writes one kernel with a fused relu6), and no int8 ADD is left
            drop.add(add["name"])
            shift[source], reroute[relu["name"]] = 3.0, source
            replace[last["name"]] = ("HardSigmoid", relu["name"], divide, True)
        else:
            drop |= {add["name"], relu["name"]}
            replace[last["name"]] = ("HardSigmoid", source, divide, False)
    if not replace:
        return model, []
    classes = layer_classes()
    new_specs = []
    for spec in config["layers"]:
        if spec["name"] in drop:
            continue
        if spec["name"] in replace:
            kind, source, divide, clipped = replace[spec["name"]]
            layer = classes[kind](divide=divide, clipped=clipped, name=spec["name"])
            spec = {**keras.layers.serialize(layer), "name": spec["name"], "inbound_nodes": [[[source, 0, 0, {}]]]}
        elif spec["name"] in reroute:
            spec = {**spec, "inbound_nodes": [[[reroute[spec["name"]], 0, 0, {}]]]}
        new_specs.append(spec)
    config["layers"] = new_specs
    new = keras.Model.from_config(config)
    for layer in new.layers:
        if layer.name not in replace:
            weights = model.get_layer(layer.name).get_weights()
            if layer.name in shift:  # [kernel, bias]
                weights = [weights[0], weights[1] + np.float32(shift[layer.name])]
            layer.set_weights(weights)
    return new, sorted(replace)


def _biased_kernel(spec: dict) -> bool:
    """A Conv/Dense layer with a bias and no activation, called once."""
    c = spec["config"]
    return (spec["class_name"] in KERNEL_LAYERS and c.get("activation") in (None, "linear") and bool(c.get("use_bias"))
            and len(spec["inbound_nodes"]) == 1)


def _is_relu6(spec: dict) -> bool:
    c = spec["config"]
    return (spec["class_name"] == "ReLU" and c.get("max_value") is not None and float(c["max_value"]) == 6.0
            and not c.get("negative_slope") and not c.get("threshold"))


def _hard_swish_product(specs: list[dict], hard_sigmoid: str, source: str) -> str | None:
    """The ``Multiply`` of ``source`` and its hard-sigmoid, if there is one."""
    for spec in specs:
        nodes = spec["inbound_nodes"]
        if spec["class_name"] != "Multiply" or len(nodes) != 1 or len(nodes[0]) != 2:
            continue
        if sorted(ref[0] for ref in nodes[0]) == sorted([hard_sigmoid, source]) and all(r[1:3] == [0, 0] for r in nodes[0]):
            return spec["name"]
    return None
