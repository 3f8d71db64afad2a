"""The public fine-tuning loop every trained node of the tree runs (:func:`fine_tune`), and what it trains on.

Distillation, the learning-rate schedule, frozen batch norm and best-epoch selection on a hold-out follow the
recipe; their pure parts are in :mod:`edgedeploy.optimize.finetune.loop`.
"""

from __future__ import annotations

import logging
import math
import sys
from dataclasses import dataclass, field, replace
from typing import Any, Callable

import numpy as np

from edgedeploy.core.steptime import timed
from edgedeploy.config.data import Dataset
from edgedeploy.errors import InvalidInputError
from edgedeploy.config.recipe import Recipe
from edgedeploy.config.task import Task


log = logging.getLogger("edgedeploy")


def in_notebook() -> bool:
    """Whether this runs in a Jupyter kernel, where rich draws its progress bars as a widget (ipywidgets)."""
    if "ipykernel" not in sys.modules:
        return False
    from rich.console import Console

    return Console().is_jupyter


class Progress:
    """A rich progress bar for Keras training (shown when stderr is a terminal, and in a Jupyter notebook)."""

    def __init__(self, keras, title: str, epochs: int, steps: int, accuracy: str = "accuracy") -> None:
        self.keras, self.title, self.epochs, self.steps = keras, title, epochs, steps
        self.accuracy = accuracy  # the key of the accuracy in Keras's logs

    def callback(self):
        keras: Any = self.keras
        title, total, accuracy = self.title, self.epochs * self.steps, self.accuracy
        enabled = (sys.stderr.isatty() or in_notebook()) and log.getEffectiveLevel() <= logging.WARNING

        class CB(keras.callbacks.Callback):
            def on_train_begin(self, logs=None):
                self.bar = None
                if enabled:
                    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

                    self.bar = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                                        TimeRemainingColumn(), transient=True)
                    self.bar.start()
                    self.task = self.bar.add_task(title, total=total)

            def on_train_batch_end(self, batch, logs=None):
                if self.bar is not None:
                    self.bar.advance(self.task)

            def on_epoch_end(self, epoch, logs=None):
                logs = logs or {}
                log.info("%s epoch %d: loss %.4f accuracy %.4f", title, epoch + 1, logs.get("loss", math.nan),
                         logs.get(accuracy, math.nan))

            def on_train_end(self, logs=None):
                if self.bar is not None:
                    self.bar.stop()

        return CB()


@dataclass
class TrainingSet:
    """What one stage trains and selects on: the fine-tune split less a stratified hold-out."""

    x: np.ndarray
    y: np.ndarray  # integer labels (-1: unlabelled)
    teacher: np.ndarray | None  # the float baseline's log-probabilities, or None without distillation
    x_val: np.ndarray
    y_val: np.ndarray
    teacher_val: np.ndarray | None
    notes: list[str] = field(default_factory=list)
    p: np.ndarray | None = None  # probability targets (y: their arg max), trained on as they are
    p_val: np.ndarray | None = None
    # a model with several outputs: each other output's task and training set (the same rows, its targets)
    others: list[tuple[Task, "TrainingSet"]] = field(default_factory=list)

    @property
    def distill(self) -> bool:
        return self.teacher is not None

    def steps_per_epoch(self, batch_size: int) -> int:
        return max(1, math.ceil(len(self.x) / batch_size))


def mirror(images: np.ndarray) -> np.ndarray:
    """Images (batch, height, width, channels) mirrored left to right: the ``thin_augment = "hflip"`` samples, and
    what the float model's ``data.mirrored_targets`` are computed on."""
    return images[:, :, ::-1, :]


def training_set(data: Dataset, recipe: Recipe, mirrored: bool = False) -> TrainingSet:
    """Split the fine-tune samples into training and hold-out (seeded; stratified, labelled samples only, for a
    classifier; a seeded random slice for target values). ``mirrored``: each training image is also given
    mirrored left to right, distilled from the float model's outputs on it (``data.mirrored_targets``); the
    hold-out is left as it is."""
    from edgedeploy.optimize.finetune.loop import holdout_split

    teacher = getattr(data, "soft_targets", None) if recipe.distill else None
    notes = []
    if recipe.distill and teacher is None:
        notes.append("distillation requested but no soft targets were computed; trained on labels only")
    labelled = getattr(data, "labelled", True)
    strata = data.y_fit if labelled else np.zeros(len(data.y_fit), np.int64)
    train_idx, val_idx = holdout_split(strata, recipe.validation_fraction, recipe.seed)
    heads = [data, *[other for _, other in getattr(data, "others", ())]]
    if teacher is None:
        labelled_rows = np.all([d.y_fit[train_idx] >= 0 for d in heads if d.labelled], axis=0) \
            if any(d.labelled for d in heads) else np.ones(len(train_idx), bool)
        if not labelled_rows.all():
            notes.append(f"{int(np.sum(~labelled_rows))} unlabelled samples not used (they need distillation)")
            train_idx = train_idx[labelled_rows]
    if len(train_idx) == 0:
        raise InvalidInputError(f"{data.path}: no fine-tune sample is left to train on",
                                "give labelled samples, or turn distillation on for unlabelled ones")
    p = getattr(data, "p_fit", None) if labelled else None
    ts = TrainingSet(
        x=data.x_fit[train_idx], y=data.y_fit[train_idx],
        teacher=None if teacher is None else teacher[train_idx],
        x_val=data.x_fit[val_idx], y_val=data.y_fit[val_idx],
        teacher_val=None if teacher is None else teacher[val_idx], notes=notes,
        p=None if p is None else p[train_idx], p_val=None if p is None else p[val_idx],
        others=[(other.task, _rows(other, recipe, train_idx, val_idx)) for _, other in getattr(data, "others", ())],
    )
    if not mirrored:
        return ts
    if ts.others:
        notes.append(f"thin_augment = {recipe.thin_augment} not applied: the model has several outputs")
        return ts
    mirrored_targets = getattr(data, "mirrored_targets", None)
    if ts.teacher is None or mirrored_targets is None or ts.x.ndim != 4:
        notes.append(f"thin_augment = {recipe.thin_augment} not applied: it needs images (batch, height, width, "
                     "channels) and distillation")
        return ts
    notes.append(f"{recipe.thin_augment}: {len(ts.x)} mirrored images added, distilled from the float model")
    twice = (lambda a: None if a is None else np.concatenate([a, a]))
    return replace(ts, x=np.concatenate([ts.x, mirror(ts.x)]), y=np.concatenate([ts.y, ts.y]), p=twice(ts.p),
                   teacher=np.concatenate([ts.teacher, mirrored_targets[train_idx].astype(ts.teacher.dtype)]))


def _rows(data: Dataset, recipe: Recipe, train_idx: np.ndarray, val_idx: np.ndarray) -> TrainingSet:
    """The training set of another output of the model: its targets (and teacher outputs) on the given rows."""
    teacher = data.soft_targets if recipe.distill else None
    p = data.p_fit if data.labelled else None
    pick = (lambda a, idx: None if a is None else a[idx])
    return TrainingSet(x=data.x_fit[train_idx], y=data.y_fit[train_idx], teacher=pick(teacher, train_idx),
                       x_val=data.x_fit[val_idx], y_val=data.y_fit[val_idx], teacher_val=pick(teacher, val_idx),
                       p=pick(p, train_idx), p_val=pick(p, val_idx))


@timed("fine_tune")
def fine_tune(env, model, data: Dataset, recipe: Recipe, kind: str, loss: Task, title: str, callbacks=(), *,
              train_set: TrainingSet | None = None, eligible_from: int = 1, record: dict | None = None,
              mirrored: bool = False) -> dict:
    """Fine-tune ``model`` in place for one stage; returns (and fills ``record`` with) what was done.

    Distillation, the learning-rate schedule, frozen batch norm and best-epoch selection on the hold-out
    follow the recipe (see :mod:`edgedeploy.optimize.finetune.loop`). ``eligible_from`` is the first epoch (1-based) the
    hold-out may select, e.g. the one where pruning reaches its target. ``mirrored``: see :func:`training_set`.
    """
    from edgedeploy.optimize.finetune.loop import Selector, learning_rate_at, schedule_object

    keras, tf = env.keras, env.tf
    settings = recipe.stage(kind)
    report: dict[str, Any] = record if record is not None else {}
    if settings.epochs == 0:
        report.update(epochs=0)
        return report
    ts = train_set or training_set(data, recipe, mirrored)
    classifier = getattr(loss, "classifier", True)
    steps = ts.steps_per_epoch(recipe.batch_size)
    total = steps * settings.epochs
    warmup = int(round(total * recipe.warmup_fraction))
    if recipe.lr_schedule == "constant" and warmup == 0:
        lr: Any = settings.learning_rate
    else:
        lr = schedule_object(keras, tf, base=settings.learning_rate, total_steps=total, schedule=recipe.lr_schedule,
                             warmup_steps=warmup)
    objective = _objectives(env, model, ts, recipe, loss)
    freeze_at = recipe.freeze_batch_norm_after if recipe.freeze_batch_norm else None
    if freeze_at is not None and freeze_at >= settings.epochs:
        freeze_at = None
    eligible_from = max(eligible_from, 1)
    curve: list[dict[str, Any]] = []
    selection_metric = recipe.selection_metric if classifier else "loss"
    if selection_metric != recipe.selection_metric:
        ts.notes.append(f"hold-out selection by loss: a {loss.kind} model has no accuracy to select on")
    selector = Selector(patience=recipe.patience if recipe.validation_fraction > 0 else 0, metric=selection_metric)
    validate = None
    if recipe.validation_fraction > 0 and len(ts.x_val):
        validate = _validation(
            keras, ts, objective, selector, recipe, title, curve, classifier=classifier,
            lr_at=lambda epoch: learning_rate_at(epoch * steps - 1, total, settings.learning_rate,
                                                 recipe.lr_schedule, warmup),
            # an epoch counts once the technique is fully in place and batch norm is as it will stay
            eligible=lambda e: e >= eligible_from and (freeze_at is None or e > freeze_at))
    progress = Progress(keras, title, settings.epochs, steps, objective.accuracy).callback()
    frozen = _fit(model, ts, objective, keras.optimizers.Adam(lr), [*callbacks, *([validate] if validate else []),
                  progress], recipe.batch_size, settings.epochs, freeze_at, validate, curve, classifier)
    report.update({
        "epochs": settings.epochs,
        "epochs_run": len(selector.history) if validate is not None else settings.epochs,
        "train_samples": int(len(ts.x)),
        "unlabelled_samples": int(np.sum(ts.y < 0)) if classifier else 0,
        "validation_samples": int(len(ts.x_val)),
        "steps_per_epoch": steps,
        "batch_size": recipe.batch_size,
        "optimizer": "Adam",
        "learning_rate": {"peak": settings.learning_rate, "schedule": recipe.lr_schedule,
                          "warmup_steps": warmup, "total_steps": total},
        "distillation": _distillation_summary(recipe, loss, classifier) if ts.distill else None,
        "batch_norm": _batch_norm_summary(model, freeze_at, frozen),
        "selection": None if validate is None else _selection_summary(
            validate, selector, recipe, ts, loss, classifier, selection_metric,
            max(eligible_from, (freeze_at or 0) + 1)),
        "curve": curve,
        "notes": ts.notes,
        **({"targets": "probability rows: cross-entropy on the probabilities, accuracy against their arg max"}
           if ts.p is not None else {}),
        **({"outputs": {"loss": "the sum of every output's loss", "each": [
            {"output": task.output, "loss": task.loss, "distilled": part.distill}
            for task, part in [(loss, ts), *ts.others]]}}
           if ts.others else {}),
    })
    return report


EVERY_ROW = slice(None)  # the rows of the hold-out a loss is taken over, by default


def hold_out_losses(env, model, ts: TrainingSet, recipe: Recipe, loss: Task) -> np.ndarray:
    """Per hold-out sample of ``ts``, the loss :func:`fine_tune`'s hold-out scores (its mean is the hold-out loss)
    of ``model``'s outputs: two models compared sample by sample on the same hold-out."""
    objective = _objectives(env, model, ts, recipe, loss)
    out = model.predict(ts.x_val, batch_size=256, verbose=0)
    out = out if ts.others else np.asarray(out)
    return np.array([objective.val_loss(out, slice(i, i + 1)) for i in range(len(ts.x_val))])


@dataclass
class _Objective:
    """What a stage fits the model to: the Keras loss and the targets it reads, the metrics Keras shows, and the
    hold-out loss of the model's outputs on the hold-out."""

    loss: Any  # a list, one per output, for a model with several outputs (y and metrics likewise)
    y: Any
    metrics: list[Any]
    val_loss: Callable[..., float]  # (outputs, rows=every row): the hold-out loss of those rows
    accuracy: str = "accuracy"  # the key of the (first output's) accuracy in Keras's logs


def _units(model, index: int) -> int:
    shape = model.output_shape[index] if isinstance(model.output_shape, list) else model.output_shape
    return int(shape[-1])


def _objectives(env, model, ts: TrainingSet, recipe: Recipe, loss: Task) -> _Objective:
    """The objective of every output of ``model``: for several outputs, the sum of each output's loss on its own
    targets (each distilled from the float model's outputs when the recipe distils), the hold-out loss likewise."""
    first = _objective(env, ts, recipe, loss, _units(model, 0), getattr(loss, "classifier", True))
    if not ts.others:
        return first
    parts = [first, *[_objective(env, other, recipe, task, _units(model, i + 1), task.classifier)
                      for i, (task, other) in enumerate(ts.others)]]
    return _Objective([p.loss for p in parts], [p.y for p in parts], [p.metrics for p in parts],
                      lambda out, rows=EVERY_ROW: float(sum(p.val_loss(o, rows) for p, o in zip(parts, out))),
                      f"{model.output_names[0]}_accuracy")  # (Keras names it after the output layer)


def _objective(env, ts: TrainingSet, recipe: Recipe, loss: Task, num_classes: int, classifier: bool) -> _Objective:
    """The objective for the targets at hand: distillation (of values, of probability rows or of labels) or
    plain training (on probability rows, or on the labels or values)."""
    from edgedeploy.optimize.finetune.loop import distillation_loss, pack_targets

    keras, tf = env.keras, env.tf
    if ts.distill and not classifier:
        # the float model's outputs as soft targets, packed after the targets on the last axis
        train_loss = value_distillation_loss(tf, loss.build(keras), recipe.distill_label_weight)
        val = np.concatenate([ts.y_val, ts.teacher_val], axis=-1)
        return _Objective(train_loss, np.concatenate([ts.y, ts.teacher], axis=-1), [],
                          lambda out, rows=EVERY_ROW: float(train_loss(val[rows], out[rows])))
    if ts.distill and ts.p is not None:
        # probability targets: cross-entropy on the probabilities beside the teacher, packed [p, teacher]
        train_loss = distillation_loss(tf, temperature=recipe.distill_temperature,
                                       label_weight=recipe.distill_label_weight, from_logits=loss.from_logits,
                                       probabilities=num_classes)

        def accuracy(y_true, y_pred):  # against the arg max of the target probabilities
            hit = tf.equal(tf.argmax(y_pred, axis=-1), tf.argmax(y_true[:, :num_classes], axis=-1))
            return tf.reduce_mean(tf.cast(hit, tf.float32))

        val = np.concatenate([ts.p_val, ts.teacher_val], axis=-1).astype(np.float32)
        return _Objective(train_loss, np.concatenate([ts.p, ts.teacher], axis=-1).astype(np.float32), [accuracy],
                          lambda out, rows=EVERY_ROW: float(train_loss(val[rows], out[rows])))
    if ts.distill:
        train_loss = distillation_loss(tf, temperature=recipe.distill_temperature,
                                       label_weight=recipe.distill_label_weight, from_logits=loss.from_logits)

        def accuracy(y_true, y_pred):
            label = tf.cast(y_true[:, 0], tf.int64)
            mask = tf.cast(label >= 0, tf.float32)
            hit = tf.cast(tf.equal(tf.argmax(y_pred, axis=-1), label), tf.float32)
            return tf.reduce_sum(hit * mask) / tf.maximum(tf.reduce_sum(mask), 1.0)

        val = pack_targets(ts.y_val, ts.teacher_val, num_classes)
        return _Objective(train_loss, pack_targets(ts.y, ts.teacher, num_classes), [accuracy],
                          lambda out, rows=EVERY_ROW: float(train_loss(val[rows], out[rows])))
    if ts.p is not None:  # probability targets: categorical cross-entropy on the probabilities themselves
        train_loss = loss.build(keras, probabilities=True)
        p_val = ts.p_val
        assert p_val is not None  # (split with ts.p)
        # (the metric is categorical: the arg max of the probabilities)
        return _Objective(train_loss, ts.p, ["accuracy"],
                          lambda out, rows=EVERY_ROW: float(train_loss(p_val[rows], out[rows])))
    train_loss = loss.build(keras)
    return _Objective(train_loss, ts.y, ["accuracy"] if classifier else [],
                      lambda out, rows=EVERY_ROW: float(train_loss(ts.y_val[rows], out[rows])))


def _validation(keras, ts: TrainingSet, objective: _Objective, selector, recipe: Recipe, title: str,
                curve: list[dict[str, Any]], *, classifier: bool, lr_at: Callable[[int], float],
                eligible: Callable[[int], bool]):
    """The Keras callback that scores each epoch on the hold-out, adds its row to ``curve`` and keeps the best."""
    from edgedeploy.optimize.finetune.loop import validation_callback

    def on_epoch(epoch: int, logs: dict, row: dict) -> None:
        row.update(loss=round(float(logs.get("loss", math.nan)), 5),
                   **({"accuracy": round(100 * float(logs.get(objective.accuracy, math.nan)), 3)}
                      if classifier else {}),
                   learning_rate=float(f"{lr_at(epoch):.3g}"))
        curve.append(row)
        if not classifier:
            row.pop("val_accuracy", None)
        log.info("%s epoch %d: val accuracy %s val loss %.4f%s", title, epoch, row.get("val_accuracy", "-"),
                 row["val_loss"], "" if row["eligible"] else " (not selectable yet)")

    score = None if classifier else (lambda out: math.nan)
    if ts.others:  # several outputs: the hold-out accuracy is the first output's
        score = ((lambda out: float(np.mean(np.argmax(out[0], axis=-1) == ts.y_val)) * 100.0) if classifier
                 else (lambda out: math.nan))
    return validation_callback(
        keras, x_val=ts.x_val, y_val=ts.y_val, t_val=ts.teacher_val, loss_fn=lambda _p, out: objective.val_loss(out),
        selector=selector, restore_best=recipe.restore_best, on_epoch=on_epoch, score=score, eligible=eligible)


def _fit(model, ts: TrainingSet, objective: _Objective, optimizer, callbacks: list, batch_size: int, epochs: int,
         freeze_at: int | None, validate, curve: list[dict[str, Any]], classifier: bool) -> int:
    """Train for ``epochs`` (in two parts when batch norm freezes after ``freeze_at``), restore the best epoch
    when validating, else record each epoch in ``curve``; the number of batch-norm layers that were frozen."""
    from edgedeploy.optimize.finetune.loop import set_batch_norm_frozen

    frozen = 0
    try:
        segments = [(0, epochs)] if not freeze_at else [(0, freeze_at), (freeze_at, epochs)]
        if freeze_at == 0:
            frozen = set_batch_norm_frozen(model, True)
        for i, (first, last) in enumerate(segments):
            if i == 1:
                frozen = set_batch_norm_frozen(model, True)
            model.compile(optimizer=optimizer, loss=objective.loss, metrics=objective.metrics)
            _build_step_variables(model, optimizer, objective.y)
            history = model.fit(ts.x, objective.y, batch_size=batch_size, initial_epoch=first, epochs=last,
                                shuffle=True, verbose=0, callbacks=callbacks)
            if validate is None:
                accuracies = history.history.get(objective.accuracy,
                                                 [math.nan] * len(history.history.get("loss", [])))
                for j, (l_, a_) in enumerate(zip(history.history.get("loss", []), accuracies)):
                    curve.append({"epoch": first + j + 1, "loss": round(float(l_), 5),
                                  **({"accuracy": round(100 * float(a_), 3)} if classifier else {})})
            if model.stop_training:
                break
        if validate is not None:
            validate.restore()
    finally:
        if frozen:
            set_batch_norm_frozen(model, False)
    return frozen


def _build_step_variables(model, optimizer, y) -> None:
    """Create the optimizer's slots and the compiled loss's and metrics' variables before ``model.fit``.

    Created inside the first training step instead, they make TensorFlow trace that step twice (once creating
    them, once again without): a third of a short fine-tuning's time. They start at the same zeros either way, so
    the training is unchanged. A model without symbolic outputs, or whose outputs have another unknown dimension than
    the batch, is left to build them in its first step."""
    from edgedeploy.keras import tfenv

    tf = tfenv.load().tf
    shapes = [tuple(t.shape)[1:] for t in getattr(model, "outputs", None) or ()]
    if not shapes or any(d is None for shape in shapes for d in shape):
        return
    optimizer.build(model.trainable_variables)
    zeros = [tf.zeros((1, *shape), dtype=t.dtype) for shape, t in zip(shapes, model.outputs)]
    y_pred = zeros[0] if len(zeros) == 1 else zeros
    model.compiled_loss.build(y_pred)
    model.compiled_metrics.build(y_pred, tf.nest.map_structure(lambda a: tf.constant(a[:1]), y))


def _distillation_summary(recipe: Recipe, loss: Task, classifier: bool) -> dict[str, Any]:
    if classifier:
        return {"teacher": "baseline (float)", "temperature": recipe.distill_temperature,
                "label_weight": recipe.distill_label_weight, "on": "log-probabilities"}
    return {"teacher": "baseline (float)", "label_weight": recipe.distill_label_weight,
            "on": f"outputs ({loss.loss} to them beside the targets)"}


def _batch_norm_summary(model, freeze_at: int | None, frozen: int) -> str:
    from edgedeploy.optimize.finetune.loop import batch_norm_wrapped

    return (("statistics frozen from the start" if freeze_at == 0 else
             f"trained for {freeze_at} epochs, then statistics frozen" if freeze_at else
             "trained (batch statistics, moving averages updated)")
            + (f" ({frozen} layers; " + ("scale and offset still trained inside TFMOT's quantize wrappers)"
                                         if batch_norm_wrapped(model) else "scale and offset frozen too)")
               if frozen else ""))


def _selection_summary(validate, selector, recipe: Recipe, ts: TrainingSet, loss: Task, classifier: bool,
                       selection_metric: str, selectable_from: int) -> dict[str, Any]:
    """How the hold-out chose the epoch kept."""
    return {
        "metric": ("hold-out loss" + (" (distillation)" if ts.distill else
                                      " (cross-entropy)" if classifier else f" ({loss.loss})")
                   if selection_metric == "loss" else "hold-out accuracy (ties: lower hold-out loss)"),
        "hold_out": (f"{recipe.validation_fraction:.0%} of the fine-tune split, "
                     f"{'stratified' if classifier else 'random'}, seed {recipe.seed}"),
        "selectable_from_epoch": selectable_from,
        "best_epoch": selector.best_epoch,
        "best_val_accuracy": None if selector.best is None or not classifier else round(selector.best[0], 3),
        "best_val_loss": None if selector.best is None else round(selector.best[1], 5),
        "restored_best": bool(recipe.restore_best and selector.best_epoch is not None),
        "stopped_early": bool(validate.stopped_early),
        "patience": recipe.patience,
    }


def teacher_targets(model, x: np.ndarray, from_logits: bool, classifier: bool = True,
                    heads: list[tuple[bool, bool]] | None = None) -> Any:
    """The float model's log-probabilities (a classifier) or outputs on ``x`` (inference mode): the soft targets
    of distillation. ``heads``: for a model with several outputs, each output's ``(from_logits, classifier)``; the
    soft targets are then a list, one array per output."""
    from edgedeploy.optimize.finetune.loop import log_probs

    out = model.predict(x, batch_size=256, verbose=0)
    if heads is not None:
        return [log_probs(o, fl) if c else np.asarray(o, np.float32) for o, (fl, c) in zip(out, heads)]
    return log_probs(out, from_logits) if classifier else np.asarray(out, np.float32)


def value_distillation_loss(tf, base, label_weight: float):
    """A Keras loss over targets packed as ``[targets, teacher outputs]`` on the last axis:
    ``w * base(targets, out) + (1 - w) * base(teacher, out)`` (regression and reconstruction distillation)."""
    w = float(label_weight)

    def loss(y_true, y_pred):
        y_true = tf.cast(y_true, tf.float32)
        half = tf.shape(y_true)[-1] // 2
        target, teacher = y_true[..., :half], y_true[..., half:]
        return w * tf.reduce_mean(base(target, y_pred)) + (1.0 - w) * tf.reduce_mean(base(teacher, y_pred))

    loss.__name__ = "value_distillation_loss"
    return loss
