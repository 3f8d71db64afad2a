"""Keras 3 activations that tf_keras lacks, or has as another function, as the tf_keras layers computing them.

Keras 3's ``hard_sigmoid`` is ``relu6(x + 3) / 6``, where tf_keras's is ``clip(0.2 x + 0.5, 0, 1)``; Keras 3's
``hard_silu`` (``hard_swish``) is ``x * hard_sigmoid(x)``, which tf_keras has not. They are rebuilt as tf_keras's
own ``keras.applications`` MobileNetV3 writes them: ``x + 3`` and ``* (1 / 6)`` as TensorFlow operations
(``TFOpLambda``) around ``ReLU(6)``, and a ``Multiply`` by ``x``. The TFLite converter fuses that pattern into one
``HARD_SWISH`` operator, which runs on the Ethos-U NPU. ``relu6`` and ``leaky_relu`` (slope 0.2 in Keras 3, 0.3
in tf_keras) are one tf_keras layer each; ``silu`` is tf_keras's ``swish``.
"""

from __future__ import annotations

from typing import Any

# Keras 3 activations tf_keras has under another name (the same function)
RENAMED = {"silu": "swish"}
# Keras 3 activations tf_keras has as a layer of its own (the same function)
AS_LAYER = {"relu6": ("ReLU", {"max_value": 6.0}), "leaky_relu": ("LeakyReLU", {"alpha": 0.2})}
# Keras 3 activations tf_keras computes with several layers (see :func:`chain`)
AS_GRAPH = ("hard_sigmoid", "hard_silu", "hard_swish")


def unique_name(name: str, taken: set[str]) -> str:
    """``name``, with ``_`` appended until no layer in ``taken`` has it; the result is added to ``taken``."""
    while name in taken:
        name += "_"
    taken.add(name)
    return name


def _op(name: str, function: str, dtype: Any, nodes: list[list], y: float) -> dict:
    """A TFOpLambda ``function(x, y)`` of a tensor and a constant, called once per node in ``nodes``."""
    return {"class_name": "TFOpLambda", "name": name,
            "config": {"name": name, "trainable": True, "dtype": dtype, "function": function},
            # (tf_keras writes a TFOpLambda's call as the one reference, not a list of them)
            "inbound_nodes": [[*node[0][:3], {"y": y, "name": None}] for node in nodes]}


def chain(activation: str, name: str, nodes: list[list], dtype: Any, taken: set[str]) -> list[dict]:
    """The tf_keras layers computing the Keras 3 ``activation`` (one of :data:`AS_GRAPH`) of the tensor each of
    ``nodes`` (``[[layer, node, tensor, {}]]``) gives, in order; the last one is named ``name``, the others take
    names not in ``taken``."""
    last = len(nodes)
    hard_swish = activation != "hard_sigmoid"

    def named(part: str, is_last: bool) -> str:
        return name if is_last else unique_name(f"{name}_{part}", taken)

    add = _op(named("add", False), "__operators__.add", dtype, nodes, 3.0)
    relu_name = named("relu6", False)
    relu = {"class_name": "ReLU", "name": relu_name,
            "config": {"name": relu_name, "trainable": True, "dtype": dtype, "max_value": 6.0},
            "inbound_nodes": [[[add["name"], i, 0, {}]] for i in range(last)]}
    scale = _op(named("scale", not hard_swish), "math.multiply", dtype,
                [[[relu["name"], i, 0, {}]] for i in range(last)], 1.0 / 6.0)
    layers = [add, relu, scale]
    if hard_swish:
        layers.append({"class_name": "Multiply", "name": name,
                       "config": {"name": name, "trainable": True, "dtype": dtype},
                       "inbound_nodes": [[[*node[0][:3], {}], [scale["name"], i, 0, {}]]
                                         for i, node in enumerate(nodes)]})
    return layers
