"""Keras models for the palette nodes: batch norms folded into kernels, layer input hessians, applying a
plan; and the recipe keys the palette nodes read."""

from __future__ import annotations

from typing import Any, Iterable, Mapping, Sequence

import numpy as np

from edgedeploy.keras.model import KERNEL_LAYERS
from edgedeploy.config.recipe import PALETTE_DEFAULTS
from .projection import project, project_compensated


# Keras models (TensorFlow)

def fold_batch_norm(model):
    """Fold every BatchNormalization that directly follows a Conv2D/DepthwiseConv2D/Dense into its kernel and bias.

    Returns (model, {layer name: the per-output-channel factor gamma / sqrt(var + eps) folded into its kernel}).
    The function is unchanged (inference mode); the converter then has no per-channel factor left to multiply
    into a palette kernel.
    """
    from edgedeploy.keras import tfenv
    from edgedeploy.keras.rewrites.wiring import bypass_layers
    from edgedeploy.keras.model import inner

    keras = tfenv.load().keras
    if model.__class__.__name__ != "Functional":
        return model, {}
    pairs = {}
    for layer in model.layers:
        if inner(layer).__class__.__name__ not in KERNEL_LAYERS:
            continue
        consumers = [n.outbound_layer for n in layer._outbound_nodes]
        if len(consumers) == 1 and consumers[0].__class__.__name__ == "BatchNormalization":
            bn = consumers[0]
            if len(bn._inbound_nodes) == 1 and bn.get_config().get("axis") in (-1, [-1], [3], 3, [1], 1):
                pairs[layer.name] = bn
    if not pairs:
        return model, {}
    config = model.get_config()
    rename = {bn.name: conv for conv, bn in pairs.items()}
    for spec in config["layers"]:
        if spec["name"] in pairs:
            spec["config"]["use_bias"] = True
    new = keras.Model.from_config(bypass_layers(config, rename))
    factors = {}
    for layer in new.layers:
        old = model.get_layer(layer.name)
        if layer.name not in pairs:
            layer.set_weights(old.get_weights())
            continue
        bn = pairs[layer.name]
        weights = old.get_weights()
        kernel = weights[0]
        bias = weights[1] if len(weights) > 1 else np.zeros(_out_channels(old, kernel), dtype=np.float32)
        gamma, beta, mean, var = _bn_params(bn)
        factor = gamma / np.sqrt(var + bn.epsilon)
        factors[layer.name] = factor.astype(np.float32)
        if old.__class__.__name__ == "DepthwiseConv2D":
            kh, kw, cin, mult = kernel.shape
            kernel = (kernel.reshape(kh, kw, cin * mult) * factor).reshape(kernel.shape)
        else:
            kernel = kernel * factor
        layer.set_weights([kernel.astype(np.float32), ((bias - mean) * factor + beta).astype(np.float32)])
    return new, factors


def _out_channels(layer, kernel) -> int:
    if layer.__class__.__name__ == "DepthwiseConv2D":
        return kernel.shape[2] * kernel.shape[3]
    return kernel.shape[-1]


def _bn_params(bn):
    cfg = bn.get_config()
    values = list(bn.get_weights())
    n = values[-1].shape[0]
    gamma = values.pop(0) if cfg.get("scale", True) else np.ones(n, np.float32)
    beta = values.pop(0) if cfg.get("center", True) else np.zeros(n, np.float32)
    mean, var = values[0], values[1]
    return gamma, beta, mean, var


def kernel_layers(model, skip: Iterable[str] = ()) -> list[tuple[str, str]]:
    """(layer name, kind) of every Conv2D/DepthwiseConv2D/Dense with a kernel, minus ``skip``."""
    from edgedeploy.keras.model import base_name, inner

    skip = set(skip)
    out = []
    for layer in model.layers:
        kind = inner(layer).__class__.__name__
        if kind in KERNEL_LAYERS and base_name(layer.name) not in skip:
            out.append((base_name(layer.name), kind))
    return out


MAX_HESSIAN_ROWS = 200_000  # input positions per batch that feed a layer's hessian (a seeded subsample beyond)


def _hessian_support(layer) -> bool:
    """Whether :func:`layer_hessians` can read this layer's inputs as rows of its flattened kernel."""
    kind = layer.__class__.__name__
    if kind == "Conv2D":
        cfg = layer.get_config()
        return cfg.get("groups", 1) == 1 and cfg.get("data_format", "channels_last") == "channels_last"
    if kind == "DepthwiseConv2D":
        return layer.get_config().get("data_format", "channels_last") == "channels_last"
    return kind == "Dense"


def _input_rows(layer, inputs, tf):
    """The layer's inputs as rows in the order of its flattened kernel: (rows, k) or, depthwise, (rows, k, C)."""
    kind = layer.__class__.__name__
    if kind == "Dense":
        return tf.reshape(inputs, [-1, inputs.shape[-1]])
    cfg = layer.get_config()
    kh, kw = cfg["kernel_size"]
    sh, sw = cfg["strides"]
    dh, dw = cfg["dilation_rate"]
    p = tf.image.extract_patches(inputs, [1, kh, kw, 1], [1, sh, sw, 1], [1, dh, dw, 1], cfg["padding"].upper())
    if kind == "DepthwiseConv2D":  # patch depth is ordered (kh, kw, C)
        return tf.reshape(p, [-1, kh * kw, inputs.shape[-1]])
    return tf.reshape(p, [-1, p.shape[-1]])


def layer_hessians(model, x: np.ndarray, layers: Sequence[str], batch_size: int = 64, seed: int = 0
                   ) -> dict[str, np.ndarray]:
    """Per layer, the second moment ``E[x x^T]`` of its inputs over ``x``, in its flattened kernel's order.

    One pass over ``x`` through a model that outputs every listed layer's input. Conv2D inputs are taken as
    the patches its kernel sees (same strides, dilation and padding); a DepthwiseConv2D gets one matrix per
    channel, shape (channels, k, k). Layers whose inputs cannot be read so (grouped convolutions, several
    inputs) are left out and keep the nearest-level projection.
    """
    from edgedeploy.keras import tfenv

    env = tfenv.load()
    tf, keras = env.tf, env.keras
    wanted = []
    for name in layers:
        layer = model.get_layer(name)
        if _hessian_support(layer) and len(layer._inbound_nodes) == 1 and not isinstance(layer.input, (list, tuple)):
            wanted.append(layer)
    if not wanted:
        return {}
    probe = keras.Model(model.inputs, [layer.input for layer in wanted])
    sums: dict[str, np.ndarray] = {}
    counts: dict[str, int] = {}
    rng = np.random.default_rng(seed)
    for start in range(0, len(x), batch_size):
        outs = probe(x[start:start + batch_size], training=False)
        outs = outs if isinstance(outs, (list, tuple)) else [outs]
        for layer, inputs in zip(wanted, outs):
            rows = _input_rows(layer, tf.cast(inputs, tf.float32), tf).numpy()
            if rows.shape[0] > MAX_HESSIAN_ROWS:
                rows = rows[np.sort(rng.choice(rows.shape[0], MAX_HESSIAN_ROWS, replace=False))]
            rows = rows.astype(np.float64)
            if rows.ndim == 3:  # depthwise: (rows, k, C) -> (C, k, k)
                part = np.einsum("nic,njc->cij", rows, rows)
            else:
                part = rows.T @ rows
            sums[layer.name] = sums.get(layer.name, 0.0) + part
            counts[layer.name] = counts.get(layer.name, 0) + rows.shape[0]
    from edgedeploy.keras.model import base_name

    out = {}
    for layer in wanted:
        h = sums[layer.name] / max(counts[layer.name], 1)
        if h.ndim == 3:  # output channel c * multiplier + m reads input channel c
            h = np.repeat(h, int(layer.get_config().get("depth_multiplier", 1)), axis=0)
        out[base_name(layer.name)] = h
    return out


def apply_plan(model, plan: Mapping[str, Mapping[str, Any]], seed: int = 0,
               hessians: Mapping[str, np.ndarray] | None = None, scales: str = "peak") -> dict[str, dict[str, Any]]:
    """Project the layers of ``model`` (in place) as ``plan`` says; returns what was done per layer.

    With ``hessians`` (:func:`layer_hessians` of the unprojected model), a layer that has one is projected
    with error compensation (:func:`project_compensated`); the others snap to their nearest palette value.
    ``scales``: how each channel's scale is chosen (:func:`fit_palette_and_scales`).
    """
    done = {}
    for name, setting in plan.items():
        if setting.get("clusters") is None:
            continue
        layer = model.get_layer(name)
        kind = layer.__class__.__name__
        weights = layer.get_weights()
        clusters, sparsity = int(setting["clusters"]), float(setting.get("sparsity") or 0.0)
        if hessians is not None and name in hessians:
            p = project_compensated(weights[0], kind, hessians[name], clusters, sparsity, seed=seed, scales=scales)
            method = "gptq"
        else:
            p = project(weights[0], kind, clusters, sparsity, seed=seed, scales=scales)
            method = "nearest"
        layer.set_weights([p.kernel, *weights[1:]])
        done[name] = {"palette": p.palette.tolist(), "sparsity": round(p.sparsity, 4),
                      "distinct_int8_per_channel_quant": p.distinct_int8, "method": method}
    return done


# recipe helpers

def default_plan(model, recipe) -> dict[str, dict[str, Any]]:
    """Every eligible layer at the recipe's clusters, with per-layer overrides from ``[layers.NAME]``."""
    layers = getattr(recipe, "layers", {}) or {}
    plan = {}
    for name, _kind in kernel_layers(model, recipe.skip_layers):
        over = layers.get(name, {})
        plan[name] = {"clusters": int(over.get("clusters", recipe.clusters)),
                      "sparsity": float(over.get("sparsity", 0.0))}
    return plan


def _palette_opt(recipe, key: str, default):
    return (getattr(recipe, "palette", None) or {}).get(key, default)


HESSIAN_SAMPLES = 1000  # fine-tune samples (random, seeded) whose layer inputs drive the error compensation


def projection_method(recipe) -> str:
    """``[palette] projection``: "gptq" (default, error-compensating) or "nearest" (each weight to its nearest value)."""
    return str(_palette_opt(recipe, "projection", PALETTE_DEFAULTS["projection"]))


def scale_method(recipe) -> str:
    """``[palette] scales``: "peak" (default, max|w| / 127 per channel) or "fitted" (:func:`fitted_scales`)."""
    return str(_palette_opt(recipe, "scales", PALETTE_DEFAULTS["scales"]))
