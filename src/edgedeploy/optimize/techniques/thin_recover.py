"""Which channels a thinned model keeps, and how the layers that read them recover, from data.

:func:`channel_scores`: each channel's share of what the layers reading it compute, on calibration samples
(the mean square of the channel's activation where a consumer reads it, times the square norm of the
consumer's weights on it, summed over consumers). :func:`refit`: each Conv2D (over its input patches) or Dense
layer that reads a thinned group is refitted by ridge least squares to reproduce the original model's (pre-activation) output
from the thinned model's inputs, layer by layer in graph order, kept only where it lowers the error on the
other half of the samples. :func:`sensitivity`: the hold-out loss rise when one group alone is thinned to
each candidate width (refitted), the expected loss the width search trades against cycles.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import numpy as np

from edgedeploy.core.steptime import timed
from edgedeploy.keras.eager_outputs import model_outputs
from edgedeploy.keras.channel_surgery import ChannelGraph, keep_by_root, layout_index, layout_rows, thin_model

RIDGE = 1e-3  # ridge of the refit, relative to the mean diagonal of the inputs' Gram matrix
MAX_ROWS = 60_000  # rows (samples x positions) a refit solves over


def _inputs(model, names: Sequence[str], x: np.ndarray) -> dict[str, np.ndarray]:
    from edgedeploy.keras import tfenv

    keras = tfenv.load().keras
    if not names:
        return {}
    probe = keras.Model(model.inputs, [model.get_layer(n).input for n in names])
    out = model_outputs(probe, x)
    out = out if isinstance(out, list) else [out]
    return dict(zip(names, out))


@timed("channel_scores")
def channel_scores(model, graph: ChannelGraph, x: np.ndarray) -> dict[str, np.ndarray]:
    """Per thinnable group: each channel's energy in what its consumers compute (see the module)."""
    groups = graph.thinnable()
    consumers = sorted({c for g in groups for c in graph.consumers.get(g, [])},
                       key=[layer.name for layer in model.layers].index)
    acts = _inputs(model, consumers, x)
    scores = {g: np.zeros(groups[g].size) for g in groups}
    for c in consumers:
        kernel = model.get_layer(c).get_weights()[0]
        a = acts[c].reshape(len(acts[c]), -1) if graph.inputs[c][0][0] == "flat" else \
            acts[c].reshape(-1, acts[c].shape[-1])
        rows = np.mean(a.astype(np.float64) ** 2, axis=0) * np.sum(
            kernel.reshape(-1, kernel.shape[-2], kernel.shape[-1]).astype(np.float64) ** 2, axis=(0, 2))
        channels = layout_rows(graph, graph.inputs[c][0])
        if graph.inputs[c][0][0] == "flat":
            rows = rows.reshape(graph.inputs[c][0][1], len(channels)).sum(axis=0)
        for (g, i), e in zip(channels, rows):
            if g is not None:
                scores[g][i] += e
    for g, s in scores.items():  # a group nothing reads with weights: the L1 norm of its producers' filters
        if not s.any():
            for p in groups[g].producers:
                k = model.get_layer(p).get_weights()[0]
                s += np.abs(k.reshape(-1, k.shape[-1])).sum(axis=0)
    return scores


def top_channels(scores: np.ndarray, width: int) -> np.ndarray:
    return np.sort(np.argsort(-scores, kind="stable")[:width])


def _refittable(layer) -> bool:
    kind = layer.__class__.__name__
    cfg = layer.get_config()
    return kind == "Dense" or (kind == "Conv2D" and tuple(cfg.get("dilation_rate", (1, 1))) == (1, 1)
                               and int(cfg.get("groups", 1)) == 1)


def _design(acts: np.ndarray, layer, pick: np.ndarray | None) -> np.ndarray:
    """The rows a layer's kernel multiplies: a Dense layer's inputs; a Conv2D's input patch at each output position
    (im2col, ordered as its kernel's rows). ``pick``: sorted indices over all rows (samples x positions)."""
    if layer.__class__.__name__ == "Dense":
        rows = acts.reshape(-1, acts.shape[-1]).astype(np.float64)
        return rows if pick is None else rows[pick]
    from edgedeploy.keras import tfenv

    tf = tfenv.load().tf
    cfg = layer.get_config()
    (kh, kw), (sh, sw) = cfg["kernel_size"], cfg["strides"]
    parts, start = [], 0
    for i in range(0, len(acts), 32):
        patches = tf.image.extract_patches(acts[i:i + 32], [1, kh, kw, 1], [1, sh, sw, 1], [1, 1, 1, 1],
                                           cfg["padding"].upper()).numpy()
        patches = patches.reshape(-1, patches.shape[-1])
        if pick is None:
            parts.append(patches.astype(np.float64))
        else:
            lo, hi = np.searchsorted(pick, [start, start + len(patches)])
            parts.append(patches[pick[lo:hi] - start].astype(np.float64))
        start += len(patches)
    return np.concatenate(parts)


def _row_count(acts: np.ndarray, layer) -> int:
    if layer.__class__.__name__ == "Dense":
        return int(np.prod(acts.shape[:-1]))
    return len(_design(acts[:1], layer, None)) * len(acts)


@timed("refit")
def refit(original, thinned, graph: ChannelGraph, keep: Mapping[str, Any], x: np.ndarray,
          only: Sequence[str] | None = None, seed: int = 0) -> dict[str, Any]:
    """Refit the Conv2D and Dense layers of ``thinned`` that read a thinned group (see the module).
    ``only``: the thinned groups whose consumers are refitted (default: all in ``keep``)."""
    by_root = keep_by_root(graph, keep)
    names = set(keep if only is None else only)
    order = [layer.name for layer in original.layers]
    consumers = sorted({c for g in names for c in graph.consumers.get(g, [])}, key=order.index)
    done: dict[str, Any] = {}
    rng = np.random.default_rng(seed)
    for c in consumers:
        layer = thinned.get_layer(c)
        if not _refittable(layer):
            done[c] = "not refitted (a dilated or grouped convolution)"
            continue
        full = _inputs(original, [c], x)[c]
        total = _row_count(full, layer)
        pick = np.sort(rng.choice(total, MAX_ROWS, replace=False)) if total > MAX_ROWS else None
        w0 = original.get_layer(c).get_weights()
        bias0 = w0[1] if len(w0) > 1 else np.zeros(w0[0].shape[-1])
        out_idx = layout_index(graph, graph.layouts[c], by_root)
        kernel0 = w0[0].reshape(-1, w0[0].shape[-1])[:, out_idx]
        target = _design(full, original.get_layer(c), pick) @ kernel0 + bias0[out_idx]
        xt = _design(_inputs(thinned, [c], x)[c], layer, pick)
        done[c] = _solve(layer, xt, target)
    return done


def _solve(layer, xt: np.ndarray, target: np.ndarray) -> dict[str, Any]:
    """Ridge least squares of ``layer``'s kernel (and bias) from rows ``xt`` to ``target``, fitted on half the
    rows and kept when it reproduces the other half better than the sliced weights."""
    half = np.arange(len(xt)) % 2 == 0
    a = np.hstack([xt, np.ones((len(xt), 1))])
    gram = a[half].T @ a[half]
    gram += np.eye(len(gram)) * RIDGE * np.mean(np.diag(gram))
    solved = np.linalg.solve(gram, a[half].T @ target[half])
    wt = layer.get_weights()
    now = wt[0].reshape(-1, wt[0].shape[-1])
    plain = a[~half] @ np.vstack([now, (wt[1] if len(wt) > 1 else np.zeros(now.shape[1]))[None]])
    denom = np.sum((target[~half] - target[~half].mean(axis=0)) ** 2) or 1.0
    err_plain = float(np.sum((plain - target[~half]) ** 2) / denom)
    err_fit = float(np.sum((a[~half] @ solved - target[~half]) ** 2) / denom)
    if err_fit < err_plain:
        new = [solved[:-1].reshape(wt[0].shape).astype(np.float32)]
        if len(wt) > 1:
            new.append(solved[-1].astype(np.float32))
        else:  # no bias to hold the constant: refit without it
            new = [np.linalg.lstsq(a[half][:, :-1], target[half], rcond=None)[0].reshape(wt[0].shape)
                   .astype(np.float32)]
        layer.set_weights(new)
    return {"relative_error_sliced": round(err_plain, 4), "relative_error_refit": round(err_fit, 4),
            "kept": "refit" if err_fit < err_plain else "sliced"}


def _loss(out: np.ndarray, teacher: np.ndarray, classifier: bool, from_logits: bool) -> float:
    from edgedeploy.optimize.finetune.loop import log_probs

    if not classifier:
        return float(np.mean((np.asarray(out, np.float64) - teacher) ** 2))
    lp = log_probs(out, from_logits).astype(np.float64)
    lt = log_probs(teacher, from_logits).astype(np.float64)
    return float(np.mean(np.sum(np.exp(lt) * (lt - lp), axis=-1)))


@timed("sensitivity")
def sensitivity(model, graph: ChannelGraph, scores: Mapping[str, np.ndarray], widths: Mapping[str, list[int]],
                x_fit: np.ndarray, x_hold: np.ndarray, classifier: bool, from_logits: bool
                ) -> dict[str, list[float]]:
    """Per group, per candidate width: the rise of the hold-out loss (KL divergence to the unthinned model's
    outputs, or their mean square error) with that group alone thinned to it and its readers refitted."""
    teacher = model_outputs(model, x_hold)
    drops: dict[str, list[float]] = {}
    for g, ws in widths.items():
        row = [0.0]
        for w in ws[1:]:
            if w == ws[0]:
                row.append(0.0)
                continue
            keep = {g: top_channels(scores[g], w)}
            thinned = thin_model(model, graph, keep)
            refit(model, thinned, graph, keep, x_fit)
            row.append(max(0.0, _loss(model_outputs(thinned, x_hold), teacher, classifier,
                                      from_logits)))
        drops[g] = list(np.maximum.accumulate(row))  # a narrower width never counts as cheaper
    return drops
