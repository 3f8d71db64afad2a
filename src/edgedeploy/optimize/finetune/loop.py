"""Fine-tuning on a few thousand samples: distillation, schedules, hold-out validation and best-epoch selection.

Users rarely have the full training set when they deploy, so every trained node of the tree is fine-tuned
with what recovers accuracy from little data:

- **Distillation.** Each stage learns the float baseline's outputs (soft targets at a temperature ``T``) mixed
  with the hard labels: ``loss = w * CE(label, p) + (1 - w) * T^2 * KL(softmax(t / T) || softmax(s / T))``,
  averaged over the batch, where ``s`` and ``t`` are the student's and the teacher's logits. Samples without a
  label (label ``-1`` in the fine-tune split) contribute only the distillation term. Models ending in softmax
  give probabilities, not logits; since ``log p = z - logsumexp(z)``, ``softmax(log p / T) = softmax(z / T)``,
  so distilling on log-probabilities at a temperature is distilling on the logits. Probabilities are clipped
  at ``1e-30`` before the log (a clipped value gets no gradient, never NaN), which only matters for logit gaps
  beyond 69.
- **Schedules.** Pruning ramps sparsity up with TFMOT's ``PolynomialDecay`` and reaches the target after a
  fraction of the stage, on a mask update; the learning rate warms up linearly and then follows a cosine
  decay; batch normalization can be frozen: it runs in inference mode (moving statistics used and kept), as
  the int8 model does once the converter folds it into the convolution. TFMOT's default 8-bit QAT does not
  fold BN while training: it drops the fake-quant between Conv/Depthwise and BN and quantizes after BN (and
  ReLU), with BN on batch statistics in training mode; the converter folds it at the end.
- **Model selection.** A seeded, stratified slice of the fine-tune split is held out; after each epoch the
  model is scored on it, the best epoch's weights are restored at the end and training stops early when it
  stops improving. Only epochs where the technique is fully in place (pruning at its target sparsity) can
  be selected. The evaluation split is never seen while training.

The planning functions here are pure Python/NumPy; the Keras pieces are built by functions given the
``keras``/``tf`` modules, so importing this module does not import TensorFlow.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

LOG_EPS = 1e-30  # probabilities are clipped here before the log (float32 holds it)
UNLABELLED = -1


# --------------------------------------------------------------------------- plans (pure)


@dataclass(frozen=True)
class PruningPlan:
    """When TFMOT updates the masks. Steps count batches from 1 (TFMOT's pruning step after its increment)."""

    kind: str  # "polynomial" or "constant"
    begin_step: int
    end_step: int
    frequency: int
    full_epoch: int  # the first epoch (1-based) at whose end every pruned layer is at the target sparsity

    def to_dict(self) -> dict[str, Any]:
        return {"schedule": self.kind, "begin_step": self.begin_step, "end_step": self.end_step,
                "frequency": self.frequency, "target_reached_after_epoch": self.full_epoch}


def pruning_plan(kind: str, steps_per_epoch: int, epochs: int, end_fraction: float, updates: int = 10) -> PruningPlan:
    """A pruning schedule that surely reaches its target within ``epochs``.

    ``polynomial``: sparsity rises from 0 over about ``end_fraction`` of the steps, in about ``updates`` mask
    updates; TFMOT prunes on steps where ``(step - begin) % frequency == 0`` up to ``end_step``, so
    ``end_step - begin_step`` is a multiple of ``frequency`` (else the last update, at the target, never comes).
    ``constant``: TFMOT's one-shot recipe, the whole target at one mask update (step ``min(100, total)``),
    kept to the end.
    """
    total = max(1, steps_per_epoch * epochs)
    if kind == "constant":
        freq = max(1, min(100, total))
        return PruningPlan(kind, 0, -1, freq, math.ceil(freq / steps_per_epoch))
    want_end = min(total, max(1, round(total * end_fraction)))
    freq = max(1, want_end // max(1, updates))
    end = (want_end // freq) * freq
    return PruningPlan(kind, 0, end, freq, max(1, math.ceil(end / steps_per_epoch)))


def learning_rate_at(step: int, total_steps: int, base: float, schedule: str, warmup_steps: int,
                     final_fraction: float = 0.0) -> float:
    """The learning rate of optimizer step ``step`` (0-based): linear warm-up, then constant or cosine decay."""
    if warmup_steps > 0 and step < warmup_steps:
        return base * (step + 1) / warmup_steps
    if schedule == "constant":
        return base
    span = max(1, total_steps - warmup_steps)
    progress = min(1.0, max(0.0, (step - warmup_steps) / span))
    return base * (final_fraction + (1 - final_fraction) * 0.5 * (1 + math.cos(math.pi * progress)))


def holdout_split(y: np.ndarray, fraction: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Seeded, stratified (train, validation) indices into the fine-tune split.

    Each class gives ``round(fraction * n)`` labelled samples to validation (at least one when it has two or
    more, none when it has one); unlabelled samples (label -1) always stay in training. Both index arrays are
    sorted and disjoint; ``fraction == 0`` gives an empty validation set.
    """
    y = np.asarray(y)
    idx = np.arange(len(y))
    if fraction <= 0:
        return idx, idx[:0]
    rng = np.random.default_rng(seed)
    val = []
    for c in np.unique(y[y >= 0]):
        members = idx[y == c]
        n = len(members)
        k = 0 if n < 2 else min(n - 1, max(1, int(round(fraction * n))))
        if k:
            val.append(rng.choice(members, size=k, replace=False))
    val_idx = np.sort(np.concatenate(val)) if val else idx[:0]
    train_idx = np.setdiff1d(idx, val_idx)
    return train_idx, val_idx


def log_probs(outputs: np.ndarray, from_logits: bool) -> np.ndarray:
    """Log-probabilities (float32) from a model's outputs: log-softmax of logits, or the log of probabilities."""
    out = np.asarray(outputs, dtype=np.float64)
    if from_logits:
        out = out - out.max(axis=-1, keepdims=True)
        return (out - np.log(np.exp(out).sum(axis=-1, keepdims=True))).astype(np.float32)
    return np.log(np.clip(out, LOG_EPS, 1.0)).astype(np.float32)


SELECTION_METRICS = ("loss", "accuracy")


@dataclass
class Selector:
    """Best-epoch bookkeeping over the hold-out.

    ``metric="loss"``: the lowest hold-out loss wins (with distillation, how closely the model follows the
    float baseline: a smoother signal than the accuracy of a few hundred samples). ``metric="accuracy"``: the
    highest hold-out accuracy wins, ties to the lower loss. Only eligible epochs count; ``patience`` eligible
    epochs without improvement stop training (0: never stop early).
    """

    patience: int = 0
    metric: str = "loss"
    best_epoch: int | None = None
    best: tuple[float, float] | None = None  # (accuracy, loss) of the best epoch
    waited: int = 0
    history: list[dict[str, Any]] = field(default_factory=list)

    def _better(self, accuracy: float, loss: float) -> bool:
        if self.best is None:
            return True
        best_acc, best_loss = self.best
        if self.metric == "loss":
            return loss < best_loss
        return accuracy > best_acc or (accuracy == best_acc and loss < best_loss)

    def update(self, epoch: int, accuracy: float, loss: float, eligible: bool) -> tuple[bool, bool]:
        """Record an epoch; return (is the new best, stop now)."""
        row = {"epoch": epoch, "val_accuracy": round(float(accuracy), 3), "val_loss": round(float(loss), 5),
               "eligible": bool(eligible)}
        self.history.append(row)
        if not eligible:
            return False, False
        improved = self._better(accuracy, loss)
        if improved:
            self.best, self.best_epoch, self.waited = (accuracy, loss), epoch, 0
        else:
            self.waited += 1
        return improved, bool(self.patience) and self.waited >= self.patience


# --------------------------------------------------------------------------- Keras pieces


def distillation_loss(tf, *, temperature: float, label_weight: float, from_logits: bool, distill: bool = True,
                      probabilities: int = 0):
    """A Keras loss over packed targets ``[label, teacher log-probs ...]`` (label -1: no label), or, with
    ``probabilities`` set to the class count, ``[target probabilities ..., teacher log-probs ...]``.

    Per sample: ``w * CE + (1 - w) * T^2 * KL(teacher_T || student_T)``, CE against the label or the target
    probabilities; with ``distill`` false only the cross-entropy of labelled samples counts. Averaged over the
    batch (unlabelled samples count as zero cross-entropy).
    """
    t = float(temperature)
    w = float(label_weight) if distill else 1.0
    first = int(probabilities) or 1  # where the teacher's columns start

    def loss(y_true, y_pred):
        y_true = tf.cast(y_true, tf.float32)
        y_pred = tf.cast(y_pred, tf.float32)
        if from_logits:
            student = tf.nn.log_softmax(y_pred, axis=-1)
        else:
            student = tf.math.log(tf.clip_by_value(y_pred, LOG_EPS, 1.0))
        if probabilities:
            total = w * -tf.reduce_sum(y_true[:, :first] * student, axis=-1)
        else:
            label = tf.cast(y_true[:, 0], tf.int32)
            labelled = tf.cast(label >= 0, tf.float32)
            picked = tf.gather(student, tf.maximum(label, 0), axis=-1, batch_dims=1)
            total = w * labelled * -picked
        if distill and w < 1.0:
            teacher = tf.nn.log_softmax(y_true[:, first:] / t, axis=-1)
            student_t = tf.nn.log_softmax(student / t, axis=-1)
            kl = tf.reduce_sum(tf.exp(teacher) * (teacher - student_t), axis=-1)
            total = total + (1.0 - w) * t * t * kl
        return tf.reduce_mean(total)

    loss.__name__ = "distillation_loss" if distill else "labelled_crossentropy"
    return loss


def schedule_object(keras, tf, *, base: float, total_steps: int, schedule: str, warmup_steps: int):
    """A Keras ``LearningRateSchedule`` that computes :func:`learning_rate_at` in the graph."""

    class WarmupCosine(keras.optimizers.schedules.LearningRateSchedule):
        def __call__(self, step):
            s = tf.cast(step, tf.float32)
            warm = float(max(0, warmup_steps))
            lr_warm = base * (s + 1.0) / max(1.0, warm)
            if schedule == "constant":
                lr_main = tf.constant(base, tf.float32)
            else:
                span = float(max(1, total_steps - warmup_steps))
                progress = tf.clip_by_value((s - warm) / span, 0.0, 1.0)
                lr_main = base * 0.5 * (1.0 + tf.cos(math.pi * progress))
            return tf.where(s < warm, lr_warm, lr_main)

        def get_config(self):
            return {"base": base, "total_steps": total_steps, "schedule": schedule, "warmup_steps": warmup_steps}

    return WarmupCosine()


def batch_norm_layers(model) -> list:
    """The BatchNormalization layers of ``model``, unwrapped from TFMOT wrappers."""
    from edgedeploy.keras.model import inner

    return [inner(layer) for layer in model.layers
            if inner(layer).__class__.__name__ in ("BatchNormalization", "SyncBatchNormalization")]


def set_batch_norm_frozen(model, frozen: bool) -> int:
    """Freeze (inference mode: moving statistics used and kept) or unfreeze the BN layers; returns how many.

    In a float model a frozen BN layer also keeps its scale and offset. In a QAT model TFMOT's
    ``QuantizeWrapperV2`` lists the wrapped layer's trainable weights as its own, so there the statistics are
    frozen but scale and offset still train (see :func:`batch_norm_wrapped`).
    """
    layers = batch_norm_layers(model)
    for layer in layers:
        layer.trainable = not frozen
    return len(layers)


def batch_norm_wrapped(model) -> bool:
    """Whether the BN layers sit inside TFMOT quantize wrappers (QAT models)."""
    from edgedeploy.keras.model import inner

    return any(inner(layer) is not layer for layer in model.layers
               if inner(layer).__class__.__name__ in ("BatchNormalization", "SyncBatchNormalization"))


def validation_callback(keras, *, x_val: np.ndarray, y_val: np.ndarray, t_val: np.ndarray | None,
                        loss_fn: Callable, selector: Selector, eligible: Callable[[int], bool],
                        restore_best: bool, batch_size: int = 256, on_epoch: Callable | None = None,
                        score: Callable[[np.ndarray], float] | None = None):
    """Scores the model on the hold-out after each epoch, keeps the best eligible epoch's weights in memory,
    stops training when ``selector`` says so and restores the best weights when training ends (``score``: the
    hold-out accuracy from the outputs, by default the top-1 accuracy of class labels ``y_val``)."""

    class Validate(keras.callbacks.Callback):
        def __init__(self):
            super().__init__()
            self.best_weights = None
            self.stopped_early = False

        def on_epoch_end(self, epoch, logs=None):
            out = self.model.predict(x_val, batch_size=batch_size, verbose=0)
            if score is None:
                accuracy = float(np.mean(np.argmax(out, axis=-1) == y_val)) * 100.0
                packed = pack_targets(y_val, t_val, out.shape[-1])
            else:
                accuracy, packed = score(out), None
            loss = float(loss_fn(packed, out))
            ok = eligible(epoch + 1)
            best, stop = selector.update(epoch + 1, accuracy, loss, ok)
            if best and restore_best:
                self.best_weights = [w.copy() for w in self.model.get_weights()]
            if on_epoch is not None:
                on_epoch(epoch + 1, logs or {}, selector.history[-1])
            if stop:
                self.stopped_early = True
                self.model.stop_training = True

        def restore(self):
            if restore_best and self.best_weights is not None:
                self.model.set_weights(self.best_weights)

    return Validate()


def pack_targets(labels: np.ndarray, teacher: np.ndarray | None, num_classes: int) -> np.ndarray:
    """Targets for :func:`distillation_loss`: column 0 the label (-1: none), then the teacher's log-probs."""
    labels = np.asarray(labels, dtype=np.float32).reshape(-1, 1)
    if teacher is None:
        teacher = np.zeros((len(labels), num_classes), np.float32)
    return np.concatenate([labels, np.asarray(teacher, np.float32)], axis=1)
