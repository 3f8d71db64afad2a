"""2:4 pruning of Keras models with TFMOT's pruning wrapper, and the 2:4 check after each stage.

TFMOT 0.8.1's ``prune_low_magnitude(..., sparsity_m_by_n=(2, 4))`` groups the same input channels
(:mod:`edgedeploy.config.pattern`), but sets its mask once, at the first training step, whatever the pruning
schedule. So that the gradual (polynomial) schedule and the hold-out selection work as for unstructured
pruning, the layers are wrapped with a schedule that never updates the mask itself, and a callback sets the
masks on the steps of the recipe's schedule: a growing fraction of the groups of four (those that lose the
least magnitude first) gets its two smallest weights zeroed, all of them from the schedule's end step
(the one-shot ``constant`` schedule: all at the first step). TFMOT's wrapper then keeps the masked weights at
zero through training, as for unstructured pruning.
"""

from __future__ import annotations

from typing import Any, Callable, Iterable

import numpy as np

from edgedeploy.config import pattern as structured
from edgedeploy.keras.model import KERNEL_LAYERS, base_name, inner, kernel_of
from edgedeploy.optimize.preserve import Verdict

NEVER = 2**31 - 1  # begin step of the wrapper's own schedule: it never updates a mask


def schedule_fraction(plan, step: int) -> float | None:
    """The fraction of groups pruned from optimizer step ``step`` (0-based), or None when no mask update is due.

    Follows TFMOT's PolynomialDecay (power 3, from 0 to the target) on the plan's update steps; ``constant``:
    everything on the first step, refreshed every ``frequency`` steps."""
    if plan.kind == "constant":
        return 1.0 if step % max(1, plan.frequency) == 0 else None
    if step > plan.end_step or (step - plan.begin_step) % max(1, plan.frequency):
        return None
    span = max(1, plan.end_step - plan.begin_step)
    progress = min(1.0, max(0.0, (step - plan.begin_step) / span))
    return float(1.0 - (1.0 - progress) ** 3)


class TwoOfFour:
    """Wraps the eligible layers of one model and sets their 2:4 masks on the schedule's steps."""

    def __init__(self, env, plan) -> None:
        self.env, self.plan = env, plan
        self.left_out: dict[str, str] = {}
        self.wrapped: list[str] = []
        self.updates = 0

    def wrap(self, layer):
        kind = inner(layer).__class__.__name__
        kernel = kernel_of(layer) if layer.built else None
        shape = tuple(kernel.shape) if kernel is not None else None
        reason = structured.why_left_out(kind, shape) if shape is not None else f"{kind} kernel not built"
        if reason:
            self.left_out[base_name(layer.name)] = reason
            return layer
        sparsity = self.env.tfmot.sparsity.keras
        self.wrapped.append(base_name(layer.name))
        never = sparsity.ConstantSparsity(0.5, begin_step=NEVER, frequency=1)
        return sparsity.prune_low_magnitude(layer, pruning_schedule=never)

    def callback(self):
        keras: Any = self.env.keras
        owner = self

        class SetMasks(keras.callbacks.Callback):
            step = 0

            def on_train_batch_begin(self, batch, logs=None):
                fraction = schedule_fraction(owner.plan, SetMasks.step)
                SetMasks.step += 1
                if fraction is not None:
                    owner.set_masks(self.model, fraction)

        return SetMasks()

    def set_masks(self, model, fraction: float) -> None:
        for layer in model.layers:
            for weight, mask, _threshold in getattr(layer, "pruning_vars", []):
                kind = inner(layer).__class__.__name__
                new = structured.mask_2of4(weight.numpy(), kind, fraction)
                mask.assign(new)
                weight.assign(weight.numpy() * new)
        self.updates += 1

    def describe(self) -> dict[str, Any]:
        return {"pattern": "2:4", "groups": "four consecutive input channels of one output channel",
                "layers": self.wrapped, "left_out": dict(self.left_out), "mask_updates": self.updates,
                "mask": "the two smallest magnitudes of each group; groups that lose least go first"}


def keras_kernels(model) -> list[tuple[str, str, np.ndarray]]:
    out = []
    for layer in model.layers:
        kind = inner(layer).__class__.__name__
        if kind in KERNEL_LAYERS:
            k = kernel_of(layer)
            if k is not None:
                out.append((base_name(layer.name), kind, k))
    return out


def left_out(found: Iterable, where: str) -> dict[str, str]:
    """The left-out layers among weight statistics (``preserve.WeightStats``) of Keras or int8 kernels."""
    return structured.left_out_layers(((s.layer, s.kind, s.shape) for s in found), where)


def merge(node: str, verdict: Verdict, pattern: structured.PatternVerdict, reasons: dict[str, str]) -> Verdict:
    """The unstructured verdict (left-out layers passed to it as skipped) with the 2:4 verdict folded in."""
    by_layer = {row["layer"]: row for row in pattern.rows}
    for row in verdict.rows:
        extra = by_layer.get(row["layer"])
        if row["layer"] in reasons and row["status"] == "skipped":
            row.update(status="left out", note=f"2:4: {reasons[row['layer']]}")
        if extra is not None and "groups" in extra:
            row.update(pattern="2:4", groups=extra["groups"], groups_short=extra["groups_short"])
            if extra["status"] == "failed":
                row.update(status="failed", note="; ".join(n for n in (row.get("note"), extra["note"]) if n))
    return Verdict(verdict.rows, verdict.warnings, verdict.failures + pattern.failures)


def check_int8_file(path, node: str, skipped: Iterable[str] = ()) -> list[dict[str, Any]]:
    """The 2:4 check on every int8 convolution and fully connected kernel of a TFLite file with input channels
    divisible by four (for leaves whose kernels are not matched to Keras layers, e.g. the palette leaves);
    raises :class:`~edgedeploy.errors.PreservationError` naming the first layer that lost the pattern."""
    from edgedeploy.optimize.preserve import raise_failures
    from edgedeploy.tflite.reader import read_weight_tensors

    kinds = {"CONV_2D": "Conv2D", "FULLY_CONNECTED": "Dense", "DEPTHWISE_CONV_2D": "DepthwiseConv2D"}
    skipped = set(skipped)
    kernels = []
    for t in read_weight_tensors(path):
        if t.op in kinds and t.dtype == "int8":
            name = t.name.split(";")[0]
            if not any(s in name.split("/") for s in skipped):
                kernels.append((name, kinds[t.op], t.values()))
    verdict = structured.check(node, "int8", kernels)
    raise_failures(Verdict([], [], verdict.failures), f"{node} (int8)")
    return verdict.rows


def pattern_verdict(node: str, where: str, found, kernels, skip_layers, check) -> Verdict:
    """A 2:4 node's verdict: ``check(skipped)`` (the unstructured checks) with the layers that get no pattern
    passed as skipped, and every group of four of the others checked."""
    reasons = left_out(found, where)
    verdict = check(tuple(skip_layers) + tuple(reasons))
    return merge(node, verdict, structured.check(node, where, kernels, skip_layers), reasons)


def pruned_copy(model, eligible: Callable[[Any], bool]):
    """A copy of ``model`` whose ``eligible`` layers (those the prune stage wraps), less those the pattern leaves
    out, hold the prune stage's final 2:4 mask: what Vela compiles for a 2:4 leaf of this shape."""
    from edgedeploy.keras.model import clone

    copy = clone(model)
    for layer in copy.layers:
        if not eligible(layer):
            continue
        kind = inner(layer).__class__.__name__
        kernel = kernel_of(layer)
        if kernel is None or structured.why_left_out(kind, tuple(kernel.shape)):
            continue
        weights = layer.get_weights()  # (the kernel first, then the bias)
        weights[0] = kernel * structured.mask_2of4(kernel, kind)
        layer.set_weights(weights)
    return copy
