"""Quantization-aware training that keeps the palette: weight quantizers that snap each kernel to its
palette on every step (a straight-through estimator)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Iterator, Mapping

import numpy as np

from .projection import QMAX, channels_last, fit_palette, normalized, project

_CLASSES: list[Any] = []  # the palette quantizer classes, made once per process (they need TFMOT)


def _quantizer_classes():
    """The palette weight quantizer (a TFMOT LastValueQuantizer that snaps to the palette first) and the
    quantize config that puts it on a layer; TFMOT's base classes are imported here, on first use."""
    if _CLASSES:
        return _CLASSES[0], _CLASSES[1]
    from edgedeploy.keras import tfenv

    env = tfenv.load()
    from tensorflow_model_optimization.python.core.quantization.keras import quantizers
    from tensorflow_model_optimization.python.core.quantization.keras.default_8bit import (
        default_8bit_quantize_registry as registry,
    )

    weights_quantizer = _weights_quantizer_class(env.tf, quantizers, registry)
    config = _quantize_config_class(registry, weights_quantizer)
    _CLASSES[:] = [weights_quantizer, config]
    return weights_quantizer, config


def _snap_to_palette(tf, w, palette: list[int], mask, per_axis: bool, depthwise: bool):
    """``w`` with each weight moved to the nearest palette value times its channel's (or the tensor's) scale,
    the largest kept weight of each channel at ±QMAX; weights outside ``mask`` stay zero."""
    if mask is not None:  # before the scales: each channel's largest kept weight maps to ±127
        w = w * tf.cast(mask, w.dtype)
    levels = tf.constant(sorted(palette), dtype=w.dtype)
    shape = tf.shape(w)
    if depthwise:
        flat = tf.reshape(w, [-1, shape[2] * shape[3]])
    else:
        flat = tf.reshape(w, [-1, shape[-1]])
    if per_axis or depthwise:
        peak = tf.reduce_max(tf.abs(flat), axis=0, keepdims=True)
    else:
        peak = tf.reduce_max(tf.abs(flat))
    scale = peak / QMAX
    safe = tf.where(scale > 0, scale, tf.ones_like(scale))
    x = flat / safe
    idx = tf.argmin(tf.abs(x[..., None] - levels), axis=-1)
    snapped = tf.reshape(tf.gather(levels, idx) * scale, shape)
    if mask is not None:
        snapped = snapped * tf.cast(mask, snapped.dtype)
    return snapped


def _weights_quantizer_class(tf: Any, quantizers: Any, registry: Any) -> type:
    """The class of the palette weight quantizer, on TFMOT's ``LastValueQuantizer``."""

    class PaletteWeightsQuantizer(quantizers.LastValueQuantizer):
        """Snaps a kernel to ``palette`` x channel scale (straight-through gradient), then fake-quantizes it."""

        def __init__(self, palette, per_axis: bool, depthwise: bool = False):
            super().__init__(num_bits=8, per_axis=per_axis, symmetric=True, narrow_range=True)
            self.palette = [int(v) for v in palette]
            self.depthwise = bool(depthwise)
            # Off once the kernel itself holds palette values (see bake_palettes): the converter then sees the
            # plain constant -> FakeQuant pattern it folds into an int8 tensor.
            self.snap_enabled = True
            # 1 where the parent's kernel is non-zero (set by palette_qat_model): pruned weights stay zero.
            self.mask = None
            # Per-channel factor the layer's variable is multiplied by (see palette_qat_model); None once baked.
            self.gain = None

        def build(self, tensor_shape, name, layer):
            if self.per_axis:
                return registry.default_8bit_quantizers.Default8BitConvWeightsQuantizer.build(
                    self, tensor_shape, name, layer)
            return super().build(tensor_shape, name, layer)

        def _snap(self, w):
            return _snap_to_palette(tf, w, self.palette, self.mask, self.per_axis, self.depthwise)

        def __call__(self, inputs, training, weights, **kwargs):
            if self.gain is not None:
                inputs = inputs * self.gain
            if self.snap_enabled:
                inputs = inputs + tf.stop_gradient(self._snap(inputs) - inputs)
            if self.depthwise:
                # TFMOT's per-axis quantizer sees one channel in a (kh, kw, C, 1) kernel, i.e. one scale for the
                # tensor, which would move the palette values; snapped values are already exact int8 values of
                # their channel scale, and the converter quantizes depthwise kernels per channel itself.
                return inputs
            return super().__call__(inputs, training, weights, **kwargs)

        def get_config(self):
            return {"palette": self.palette, "per_axis": self.per_axis, "depthwise": self.depthwise}

        @classmethod
        def from_config(cls, config):
            return cls(**config)

    return PaletteWeightsQuantizer


def _quantize_config_class(registry: Any, weights_quantizer: type) -> type:
    """The class of the quantize config that puts a ``weights_quantizer`` on a layer's kernel, on TFMOT's
    default 8-bit config."""

    class PaletteQuantizeConfig(registry.Default8BitQuantizeConfig):
        def __init__(self, weight_attrs, activation_attrs, quantize_output, palette, per_axis, depthwise=False):
            super().__init__(weight_attrs, activation_attrs, quantize_output)
            self.palette, self.per_axis, self.depthwise = list(palette), bool(per_axis), bool(depthwise)
            self.weight_quantizer = weights_quantizer(self.palette, self.per_axis, self.depthwise)

        def get_config(self):
            return {"weight_attrs": self.weight_attrs, "activation_attrs": self.activation_attrs,
                    "quantize_output": self.quantize_output, "palette": self.palette, "per_axis": self.per_axis,
                    "depthwise": self.depthwise}

    return PaletteQuantizeConfig


def qat_palettes(parent, plan: Mapping[str, Mapping[str, Any]], seed: int = 0) -> dict[str, dict[str, Any]]:
    """Per palette layer, the quantizer granularity QAT uses and the palette under it (from the parent kernel).

    Conv2D and DepthwiseConv2D are quantized per channel, as the parent node was projected, so their palette
    is read from the parent kernel. TFMOT quantizes Dense kernels per tensor: their palette is fitted anew.
    """
    out = {}
    for name, setting in plan.items():
        if setting.get("clusters") is None:
            continue
        layer = parent.get_layer(name)
        kind = layer.__class__.__name__
        kernel = layer.get_weights()[0]
        per_tensor = kind == "Dense"
        x, _ = normalized(channels_last(kernel.astype(np.float64), kind), per_tensor)
        palette = fit_palette(x, int(setting["clusters"]), keep_zero=bool(np.any(kernel == 0)), seed=seed)
        out[name] = {"kind": kind, "per_axis": not per_tensor, "palette": palette.tolist()}
    return out


def palette_qat_float(parent, details: dict[str, Any] | None = None):
    """``parent`` (a palette node's model) rewritten for QAT as the other QAT nodes rewrite theirs
    (:func:`edgedeploy.optimize.techniques.qat.qat_float`), then each ReLU or ReLU6 that a rewrite left after a
    kernel layer (a squeeze-and-excitation gate's, once its ``+ 3`` is in the bias) fused into that layer, as the
    palette node fused the others: TFMOT's QAT would otherwise take the layer with its ReLU and drop the layer's
    weight quantizer, its palette with it. The rewrites keep every kernel layer's name and kernel, so the plan and
    its palettes apply as they are. ``details`` (when given) records them under ``qat_rewrites``. The same
    function on every call (a rewritten model comes back as it is)."""
    from edgedeploy.keras.rewrites import fuse_separate_relu

    from ..techniques.qat import qat_float

    model, fused = fuse_separate_relu(qat_float(parent, details), relu6=True)
    if fused and details is not None:
        details.setdefault("qat_rewrites", {})["fuse_separate_relu"] = sorted(fused)
    return model


def palette_qat_model(parent, plan: Mapping[str, Mapping[str, Any]], seed: int = 0,
                      folded: Mapping[str, Any] | None = None, details: dict[str, Any] | None = None):
    """The QAT model of a palette node: TFMOT's default 8-bit scheme, palette quantizers on the palette layers.

    ``parent`` is first rewritten into layers TFMOT quantizes as the int8 converter computes them, with the
    rewrites of the other QAT nodes (:func:`palette_qat_float`: hard-swish as one layer, batch norms it cannot
    fold as depthwise convolutions, a kernel's swish as a layer of its own). Preprocessing at the input (a
    ``Rescaling``, ``Normalization``) is then folded into the kernels it feeds, as for the other QAT nodes
    (:func:`edgedeploy.optimize.techniques.qat.fold_qat_input`), so that the int8 model takes the raw input as
    ``ptq`` does; ``details``, when given, records both. Only a scaling by one value is
    folded (a palette kernel times one value keeps its palette), and the kernels folded into keep their folded
    weights in training. The fold is the same on every call, so the trained weights load into the model that
    the convert stage builds again.

    ``folded`` maps a layer to the batch-norm factors folded into its kernel (:func:`fold_batch_norm`). Those
    layers train in the units of their kernel before folding, as TFMOT's QAT of the unfolded model does: the
    variable holds kernel / |factor| and the quantizer multiplies it back. Adam moves every variable by about
    the learning rate per step whatever its size, and folding scales kernels by x0.014 (ResNet-8's first
    convolution) to x7 (DS-CNN's depthwise ones); trained as folded, such a layer's steps are some 70x too
    large (each one moving a weight by up to a tenth of itself) or several times too small.
    """
    return palette_qat_of_float(palette_qat_float(parent, details), plan, seed, folded, details)


def palette_qat_of_float(parent, plan: Mapping[str, Mapping[str, Any]], seed: int = 0,
                         folded: Mapping[str, Any] | None = None, details: dict[str, Any] | None = None):
    """:func:`palette_qat_model` of a parent :func:`palette_qat_float` has rewritten already."""
    from edgedeploy.keras import tfenv

    env = tfenv.load()
    quant = env.tfmot.quantization.keras
    from edgedeploy.keras.model import clone
    from edgedeploy.keras.qat_annotate import freeze_quantized, quantize_for_qat
    from ..techniques.qat import fold_qat_input

    parent, inputs_folded = fold_qat_input(parent, uniform_only=True, details=details)
    quantizer_cls, config_cls = _quantizer_classes()
    palettes = qat_palettes(parent, plan, seed)

    def annotate(layer):
        info = palettes.get(layer.name)
        if info is None:
            return layer
        attr = kernel_attr(info["kind"] == "DepthwiseConv2D")
        # TFMOT's quantize-aware activations have no relu6 (a fused ReLU6, see fuse_separate_relu): the layer then
        # keeps its own activation and its output is fake-quantized after it, as the converter fuses them
        own = layer.get_config().get("activation") == "relu6"
        config = config_cls([attr], [] if own else ["activation"], own, info["palette"], info["per_axis"],
                            info["kind"] == "DepthwiseConv2D")
        return quant.quantize_annotate_layer(layer, quantize_config=config)

    base = clone(parent)
    annotated = env.keras.models.clone_model(base, clone_function=annotate)
    annotated.set_weights(base.get_weights())
    model = quantize_for_qat(annotated, custom_objects={"PaletteQuantizeConfig": config_cls,
                                                        "PaletteWeightsQuantizer": quantizer_cls}, what="palette QAT")
    freeze_quantized(model, {name for into in inputs_folded.values() for name in into})
    from edgedeploy.keras.model import base_name

    for layer, quantizer in palette_layers(model):
        kernel = parent.get_layer(base_name(layer.name)).get_weights()[0]
        # keep the parent's zeros (its pruning) in every forward pass
        quantizer.mask = env.tf.constant((kernel != 0).astype(np.float32))
        factor = (folded or {}).get(base_name(layer.name))
        if factor is not None:
            gain = np.abs(np.asarray(factor, np.float32))
            gain = np.where(gain > 0, gain, 1.0).astype(np.float32)
            gain = gain.reshape(kernel.shape[2:] if quantizer.depthwise else kernel.shape[-1:])
            quantizer.gain = env.tf.constant(gain)
            kernel_variable(layer, quantizer).assign(kernel / gain)
    return model


def palette_layers(model) -> Iterator[tuple[Any, Any]]:
    """(layer, palette weight quantizer) of every palette layer of a palette QAT model."""
    quantizer_cls, _ = _quantizer_classes()
    for layer in model.layers:
        quantizer = getattr(getattr(layer, "quantize_config", None), "weight_quantizer", None)
        if isinstance(quantizer, quantizer_cls):
            yield layer, quantizer


def palette_kind(quantizer) -> str:
    """The layer kind a palette quantizer stands for (as :func:`channels_last` names it)."""
    return "DepthwiseConv2D" if quantizer.depthwise else ("Conv2D" if quantizer.per_axis else "Dense")


def kernel_attr(depthwise: bool) -> str:
    """The name of a kernel layer's weight attribute (and of its variable and fake-quant ranges)."""
    return "depthwise_kernel" if depthwise else "kernel"


def kernel_variable(layer, quantizer):
    """The kernel variable of a TFMOT-wrapped palette layer (the wrapper leaves the quantized tensor in the
    layer's attribute, so it is found by name)."""
    return next(w for w in layer.weights if w.name.split("/")[-1] == f"{kernel_attr(quantizer.depthwise)}:0")


def load_palette_qat(parent_path: Path, weights_path: Path, plan: Mapping[str, Mapping[str, Any]], seed: int = 0,
                     folded: Mapping[str, Any] | None = None):
    """The trained QAT model of a palette node, its kernels snapped to their palettes (ready to convert): the
    model :func:`palette_qat_model` builds from the parent (the same rewrites and input fold as in training)."""
    from edgedeploy.keras import tfenv

    parent = tfenv.load().keras.models.load_model(parent_path, compile=False)
    model = palette_qat_model(parent, plan, seed, folded)
    model.load_weights(weights_path)
    bake_palettes(model)
    return model


def bake_palettes(model) -> list[str]:
    """Write each palette layer's snapped kernel into its variable and stop snapping in the graph.

    The forward pass is unchanged (snapping a snapped kernel is the identity); the converter then finds the
    constant -> FakeQuant pattern it turns into an int8 tensor.
    """
    baked = []
    for layer, quantizer in palette_layers(model):
        attr = kernel_attr(quantizer.depthwise)
        variable = kernel_variable(layer, quantizer)
        kernel = variable.numpy()
        if quantizer.gain is not None:
            kernel = kernel * quantizer.gain.numpy()
            quantizer.gain = None
        kind = palette_kind(quantizer)
        if quantizer.mask is not None:
            kernel = kernel * quantizer.mask.numpy()
        p = project(kernel, kind, len(quantizer.palette), per_tensor=not quantizer.per_axis and not quantizer.depthwise,
                    palette=np.asarray(quantizer.palette))
        variable.assign(p.kernel)
        # The fake-quant ranges TFMOT stored at the last training step can differ slightly from the final
        # kernel's channel maxima; the converter takes its scales from them, so set them to the kernel's.
        # (Depthwise kernels skip TFMOT's fake quant, whose one range would span all channels: nothing to set.)
        flat = channels_last(p.kernel, kind)
        peak = np.abs(flat).max(axis=0) if quantizer.per_axis else np.abs(flat).max()
        for w in ([] if quantizer.depthwise else layer.weights):
            short = w.name.split("/")[-1]
            if short in (f"{attr}_min:0", f"{attr}_max:0"):
                value = np.broadcast_to(-peak if short.endswith("_min:0") else peak, w.shape).astype(np.float32)
                w.assign(value)
        quantizer.snap_enabled = False
        baked.append(layer.name)
    return baked
