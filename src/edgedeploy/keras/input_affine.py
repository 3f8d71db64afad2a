"""Input preprocessing folded into the first kernels: a ``Rescaling``, ``Normalization`` or batch norm that reads a
model input is an affine map ``y = a * x + b`` per channel, and the kernel layers it feeds compute the same on the
raw input with ``a`` folded into their kernel and ``b`` into their bias.

The int8 converter does this fold itself for a float model (``ptq``), but not in a quantization-aware model: there
the layer's output is fake-quantized, and the int8 model keeps it as a MUL (and ADD) over the whole input, which on
an Ethos-U costs NPU cycles that ``ptq`` does not spend. Folded before QAT, every QAT-derived leaf takes the raw
input as ``ptq`` does. The fold is exact: an offset (``b`` not zero) is only folded into layers that pad nothing
(``padding = "valid"``, a Dense), as a padded border would read ``b`` where it read zero; a layer is otherwise left,
with its reason, and at an image input computed as one 1x1 ``DepthwiseConv2D`` (kernel ``a``, bias ``b``): the same
function, which TFMOT quantizes as a convolution, where a fake-quantized ``Rescaling`` or ``Normalization`` converts
to a DEQUANTIZE/QUANTIZE pair on the CPU before its MUL and ADD.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from edgedeploy.keras.model import KERNEL_LAYERS
from edgedeploy.keras.rewrites.wiring import bypass_layers

AFFINE_LAYERS = ("Rescaling", "Normalization", "BatchNormalization")
# layers an input scaling passes through unchanged: zero padding (when there is no offset), reshapes
_PASS_LAYERS = ("ZeroPadding1D", "ZeroPadding2D", "Reshape", "Flatten")


def affine_of(layer, channels: int) -> tuple[np.ndarray, np.ndarray] | None:
    """``(a, b)``, one value per channel of the last axis, of an affine preprocessing layer (None: not one)."""
    kind = layer.__class__.__name__
    cfg = layer.get_config()
    if kind == "Rescaling":
        scale, offset = np.asarray(cfg["scale"], np.float64), np.asarray(cfg["offset"], np.float64)
        if scale.size not in (1, channels) or offset.size not in (1, channels):
            return None
        return np.broadcast_to(scale.reshape(-1), (channels,)), np.broadcast_to(offset.reshape(-1), (channels,))
    if kind == "Normalization":
        axis = cfg.get("axis")
        axis = tuple(axis) if isinstance(axis, (list, tuple)) else (axis,)
        if cfg.get("invert") or axis not in ((-1,), (len(layer.input_shape) - 1,)):
            return None
        from edgedeploy.keras import tfenv

        epsilon = float(tfenv.load().keras.backend.epsilon())
        mean = np.asarray(layer.mean, np.float64).reshape(-1)
        std = np.maximum(np.sqrt(np.asarray(layer.variance, np.float64).reshape(-1)), epsilon)
        if mean.size not in (1, channels) or std.size not in (1, channels):
            return None
        a = np.broadcast_to(1.0 / std, (channels,))
        return a, np.broadcast_to(-mean, (channels,)) * a
    if kind == "BatchNormalization":
        axis = cfg.get("axis")
        axis = tuple(axis) if isinstance(axis, (list, tuple)) else (axis,)
        if axis not in ((-1,), (len(layer.input_shape) - 1,)):
            return None
        weights = [np.asarray(w, np.float64) for w in layer.get_weights()]
        gamma = weights.pop(0) if cfg.get("scale", True) else np.ones(channels)
        beta = weights.pop(0) if cfg.get("center", True) else np.zeros(channels)
        mean, variance = weights
        a = gamma / np.sqrt(variance + float(cfg["epsilon"]))
        return a, beta - mean * a
    return None


def _consumers(layer) -> list:
    return [node.outbound_layer for node in layer._outbound_nodes]


def _chain(model, start) -> tuple[list, np.ndarray, np.ndarray]:
    """The affine layers read one after another from ``start`` (a model input) and their composed ``(a, b)``."""
    channels = int(start.output_shape[0][-1] if isinstance(start.output_shape, list) else start.output_shape[-1])
    layers: list = []
    a, b = np.ones(channels), np.zeros(channels)
    layer = start
    while True:
        nxt = _consumers(layer)
        if len(nxt) != 1 or nxt[0].__class__.__name__ not in AFFINE_LAYERS or len(nxt[0]._inbound_nodes) != 1:
            return layers, a, b
        found = affine_of(nxt[0], channels)
        if found is None:
            return layers, a, b
        a, b = a * found[0], b * found[0] + found[1]
        layers.append(nxt[0])
        layer = nxt[0]


def _targets(layer, a: np.ndarray, b: np.ndarray) -> tuple[list, str | None]:
    """The kernel layers the affine output of ``layer`` reaches, or the reason it cannot be folded into them."""
    uniform = bool(np.all(a == a[0]) and np.all(b == b[0]))
    found, todo = [], _consumers(layer)
    while todo:
        nxt = todo.pop()
        kind, cfg = nxt.__class__.__name__, nxt.get_config()
        if len(nxt._inbound_nodes) != 1:
            return [], f"{nxt.name} is called more than once"
        if kind in _PASS_LAYERS:
            if kind.startswith("ZeroPadding") and np.any(b != 0):
                return [], f"{nxt.name} pads with zeros where the offset would be"
            keeps_channels = kind.startswith("ZeroPadding") or nxt.output_shape[-1] == nxt.input_shape[-1]
            if not (uniform or keeps_channels):
                return [], f"{nxt.name} moves the channels the scaling applies to"
            todo.extend(_consumers(nxt))
            continue
        if kind not in KERNEL_LAYERS:
            return [], f"{nxt.name} ({kind}) has no kernel to fold it into"
        if cfg.get("data_format", "channels_last") != "channels_last" or cfg.get("groups", 1) != 1:
            return [], f"{nxt.name} is not a channels-last convolution of one group"
        if np.any(b != 0) and kind != "Dense" and cfg.get("padding") != "valid":
            return [], f"{nxt.name} pads its input (padding '{cfg.get('padding')}'), where the offset would be"
        found.append(nxt)
    return found, None


def _fold(layer, a: np.ndarray, b: np.ndarray, weights: list[np.ndarray]) -> list[np.ndarray]:
    """``layer``'s weights computing on the raw input what they computed on ``a * x + b``; with a bias."""
    kernel = np.asarray(weights[0], np.float64)
    bias = np.asarray(weights[1], np.float64) if len(weights) > 1 else None
    if layer.__class__.__name__ == "DepthwiseConv2D":  # (kh, kw, C, multiplier): output c * m + j reads channel c
        folded = kernel * a[None, None, :, None]
        shift = (kernel * b[None, None, :, None]).sum(axis=(0, 1)).reshape(-1)
    else:  # Conv2D (kh, kw, C, out), Dense (C, out): the input channel is the kernel's second-to-last axis
        if kernel.shape[-2] != len(a):  # a Dense after a Flatten: channels last, so the channel varies fastest
            a, b = np.tile(a, kernel.shape[-2] // len(a)), np.tile(b, kernel.shape[-2] // len(b))
        shape = [1] * kernel.ndim
        shape[-2] = len(a)
        folded = kernel * a.reshape(shape)
        shift = (kernel * b.reshape(shape)).reshape(-1, kernel.shape[-1]).sum(axis=0)
    if not np.any(b != 0):
        shift = np.zeros_like(shift)
    new_bias = shift if bias is None else bias + shift
    return [folded.astype(np.float32), new_bias.astype(np.float32), *weights[2:]]


AS_DEPTHWISE = "computed as one 1x1 depthwise convolution"  # the end of the reason of a chain kept that way


def fold_input_affine(model, freeze: bool = True, uniform_only: bool = False
                      ) -> tuple[Any, dict[str, list[str]], dict[str, str]]:
    """``model`` with each affine preprocessing layer at a model input folded into the kernel layers it feeds (see
    the module's text): ``(model, {folded layer: [layers folded into]}, {layer left: reason})`` (a
    layer left at an image input is now part of one 1x1 depthwise convolution, not trained with ``freeze``).

    With ``freeze`` the layers folded into are built not trainable: their kernels are now in the units of the raw
    input (x 1/255 for a ``Rescaling(1/255)``), where an optimizer step of about the learning rate, whatever the
    weight's size, would move them that much too far (a QAT model also needs
    :func:`edgedeploy.keras.qat_annotate.freeze_quantized`). With ``uniform_only`` only a scaling by one value is folded:
    one per channel would multiply the distinct values of a clustered kernel by the channels."""
    from edgedeploy.keras import tfenv

    keras = tfenv.load().keras
    if model.__class__.__name__ != "Functional":
        return model, {}, {}
    plans: list = []
    swaps: list = []  # (layers, a, b): affine chains at an image input that stay, as one 1x1 depthwise convolution
    left: dict[str, str] = {}
    for start in model._input_layers:
        layers, a, b = _chain(model, start)
        if not layers:
            continue
        targets, reason = _targets(layers[-1], a, b)
        if reason is None and {layer.name for layer in layers} & {layer.name for layer in model._output_layers}:
            reason = "its output is an output of the model"
        elif reason is None and not targets:
            reason = "it feeds no kernel layer"
        if reason is None and uniform_only and not np.all(a == a[0]):
            reason = "its scale differs per channel, which would multiply the clusters of the kernels it feeds"
        if reason is not None:
            if len(start.output_shape[0] if isinstance(start.output_shape, list) else start.output_shape) == 4:
                swaps.append((layers, a, b))  # an image input: one 1x1 depthwise convolution computes the chain
                reason += "; " + AS_DEPTHWISE
            left.update({layer.name: reason for layer in layers})
            continue
        plans.append((start, layers, a, b, targets))
    if not plans and not swaps:
        return model, {}, left
    config = model.get_config()
    rename = {layer.name: (plan[1][i - 1].name if i else plan[0].name)
              for plan in plans for i, layer in enumerate(plan[1])}
    rename.update({layer.name: layers[0].name for layers, _, _ in swaps for layer in layers[1:]})
    config = bypass_layers(config, {name: _first(rename, name) for name in rename})
    folds = {t.name: (t, a, b) for _, _, a, b, ts in plans for t in ts}
    depthwise = {layers[0].name: [a.reshape(1, 1, -1, 1).astype(np.float32), b.astype(np.float32)]
                 for layers, a, b in swaps}
    for spec in config["layers"]:
        if spec["name"] in folds:
            spec["config"]["use_bias"] = True
            if freeze:
                spec["config"]["trainable"] = False
        if spec["name"] in depthwise:
            spec["class_name"] = "DepthwiseConv2D"
            spec["config"] = {"name": spec["name"], "kernel_size": (1, 1), "use_bias": True, "padding": "valid",
                              "trainable": not freeze, "dtype": spec["config"].get("dtype", "float32")}
    new = keras.Model.from_config(config)
    for layer in new.layers:
        if layer.__class__.__name__ == "InputLayer":
            continue
        weights = depthwise.get(layer.name) or model.get_layer(layer.name).get_weights()
        if layer.name in folds:
            weights = _fold(*folds[layer.name], weights)
        layer.set_weights(weights)
    return new, {layer.name: sorted(t.name for t in plan[4]) for plan in plans for layer in plan[1]}, left


def _first(rename: dict[str, str], name: str) -> str:
    """The model input a chain of bypassed layers reads."""
    while name in rename:
        name = rename[name]
    return name
