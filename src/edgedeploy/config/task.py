"""What the model is trained and scored for: its task, its loss and its metrics, from the model and the data.

The loss comes from ``--loss`` / the recipe's ``loss`` when given, else from the model's compile config, else
from the data: integer labels -> sparse categorical cross-entropy; one-hot rows -> categorical cross-entropy
(trained as their class indices); probability rows (not one-hot) -> categorical cross-entropy on the
probabilities themselves, accuracy scored against their arg max; float targets shaped like the model's output ->
mean squared error; no targets at all -> reconstruction (the targets are the inputs, mean squared error).
Targets that contradict the model stop before anything trains, naming the array, its shape and dtype, the
model's output shape and the fix.

Each metric knows its unit and whether higher is better. Classifiers are scored by accuracy (and top-5
accuracy with more than five classes); regression and reconstruction by MSE, MAE and PSNR, and, when the
evaluation split carries 0/1 normal/anomalous labels, by the ROC AUC of each sample's reconstruction error
(the MLPerf Tiny anomaly-detection score). Pure NumPy: importing this module does not import TensorFlow.

A model with several outputs gets one task per output, each decided from that output alone and its own targets
(:func:`decide`); the first output's is the task the tree is judged by, and carries the others.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

from edgedeploy.core.user_code import ended_by, reraise_interrupt, tried_to_end, user_code
from edgedeploy.errors import InvalidInputError, UsageError

CLASSIFICATION, REGRESSION, RECONSTRUCTION = "classification", "regression", "reconstruction"
# Keras built-in losses by the names the recipe and --loss take (their aliases map to these).
CLASSIFICATION_LOSSES = ("sparse_categorical_crossentropy", "categorical_crossentropy", "binary_crossentropy",
                         "categorical_focal_crossentropy", "binary_focal_crossentropy", "kl_divergence",
                         "categorical_hinge", "hinge", "squared_hinge")
REGRESSION_LOSSES = ("mean_squared_error", "mean_absolute_error", "mean_absolute_percentage_error",
                     "mean_squared_logarithmic_error", "huber", "log_cosh", "cosine_similarity", "poisson")
ALIASES = {"mse": "mean_squared_error", "mae": "mean_absolute_error", "mape": "mean_absolute_percentage_error",
           "msle": "mean_squared_logarithmic_error", "kld": "kl_divergence", "kullback_leibler_divergence":
           "kl_divergence", "logcosh": "log_cosh", "huber_loss": "huber"}


def loss_name(name: str) -> str:
    """A Keras loss identifier in its snake_case form (``MeanSquaredError``, ``mse`` -> ``mean_squared_error``)."""
    text = str(name).strip()
    snake = "".join("_" + c.lower() if c.isupper() else c for c in text).lstrip("_")
    snake = snake.replace("cross_entropy", "crossentropy").replace("k_l_", "kl_").replace("k_l", "kl")
    return ALIASES.get(snake, snake)


def check_loss_name(name: str, source: str) -> str:
    known = CLASSIFICATION_LOSSES + REGRESSION_LOSSES
    canonical = loss_name(name)
    if canonical not in known:
        raise UsageError(f"{source}: loss '{name}' is not a Keras built-in loss edgedeploy can fine-tune with",
                         f"allowed values: {', '.join(known)} (and mse, mae, huber_loss ...)")
    return canonical


# ------------------------------------------------------------------ metrics


@dataclass(frozen=True)
class MetricSpec:
    name: str
    title: str
    unit: str
    higher_is_better: bool
    fn: Callable[[np.ndarray, np.ndarray], float]  # (targets, outputs) -> value; AUC gets (anomaly, outputs, x)


def _flat(a: np.ndarray) -> np.ndarray:
    a = np.asarray(a, np.float64)
    return a.reshape(len(a), -1)


def accuracy(y: np.ndarray, out: np.ndarray) -> float:
    return float(np.mean(np.argmax(_flat(out), axis=-1) == np.asarray(y))) * 100.0


def top5_accuracy(y: np.ndarray, out: np.ndarray) -> float:
    top = np.argsort(-_flat(out), axis=-1)[:, :5]
    return float(np.mean(np.any(top == np.asarray(y)[:, None], axis=1))) * 100.0


def per_sample_mse(y: np.ndarray, out: np.ndarray) -> np.ndarray:
    return np.mean((_flat(out) - _flat(y)) ** 2, axis=1)


def mse(y: np.ndarray, out: np.ndarray) -> float:
    return float(np.mean(per_sample_mse(y, out)))


def mae(y: np.ndarray, out: np.ndarray) -> float:
    return float(np.mean(np.abs(_flat(out) - _flat(y))))


def psnr(y: np.ndarray, out: np.ndarray) -> float:
    """Peak signal-to-noise ratio in dB, the peak being the range of the targets."""
    y = _flat(y)
    peak = float(np.max(y) - np.min(y)) or 1.0
    err = mse(y, out)
    return float("inf") if err == 0 else float(10.0 * np.log10(peak * peak / err))


def roc_auc(labels: np.ndarray, scores: np.ndarray) -> float:
    """Area under the ROC curve (%) of ``scores`` separating labels 1 from 0 (ties count one half)."""
    labels = np.asarray(labels).astype(bool)
    scores = np.asarray(scores, np.float64)
    pos, neg = scores[labels], scores[~labels]
    if len(pos) == 0 or len(neg) == 0:
        return float("nan")
    order = np.argsort(scores, kind="mergesort")
    ranks = np.empty(len(scores), np.float64)
    sorted_scores = scores[order]
    i = 0
    while i < len(scores):  # average ranks of ties
        j = i
        while j + 1 < len(scores) and sorted_scores[j + 1] == sorted_scores[i]:
            j += 1
        ranks[order[i:j + 1]] = (i + j) / 2.0 + 1.0
        i = j + 1
    auc = (ranks[labels].sum() - len(pos) * (len(pos) + 1) / 2.0) / (len(pos) * len(neg))
    return float(auc) * 100.0


METRICS: dict[str, MetricSpec] = {m.name: m for m in (
    MetricSpec("accuracy", "accuracy", "%", True, accuracy),
    MetricSpec("top5_accuracy", "top-5 accuracy", "%", True, top5_accuracy),
    MetricSpec("mse", "MSE", "", False, mse),
    MetricSpec("mae", "MAE", "", False, mae),
    MetricSpec("psnr", "PSNR", "dB", True, psnr),
    MetricSpec("auc", "ROC AUC of the reconstruction error", "%", True, lambda y, out: float("nan")),
)}


# ------------------------------------------------------------------ the task


@dataclass
class Task:
    loss: str  # a Keras built-in loss (snake_case)
    from_logits: bool
    source: str  # where the loss came from, in words
    kind: str = CLASSIFICATION  # classification, regression or reconstruction
    metric: str = "accuracy"  # the primary metric (the report's and the requirements')
    metrics: tuple[str, ...] = ("accuracy",)  # every metric scored on the evaluation split
    user_metric: str | None = None  # module:function, loaded only when asked for
    notes: list[str] = field(default_factory=list)
    # a model with several outputs: this task is its first output's (the score the tree judges), ``output`` that
    # output's name and ``outputs`` every other output's name and task, each trained and scored on its own targets
    output: str | None = None
    outputs: tuple[tuple[str, "Task"], ...] = ()

    @property
    def name(self) -> str:
        return self.loss

    @property
    def classifier(self) -> bool:
        return self.kind == CLASSIFICATION

    @property
    def spec(self) -> MetricSpec:
        return METRICS[self.metric] if self.metric in METRICS else user_spec(self.user_metric or self.metric)

    def build(self, keras, probabilities: bool = False):
        """The Keras loss to fine-tune with. Classifiers train on class indices, so cross-entropy in its sparse
        form; on probability targets (``probabilities``), categorical cross-entropy on the probabilities."""
        if self.classifier and probabilities:
            return keras.losses.CategoricalCrossentropy(from_logits=self.from_logits)
        if self.classifier:
            return keras.losses.SparseCategoricalCrossentropy(from_logits=self.from_logits)
        return keras.losses.get(self.loss)

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.loss, "from_logits": self.from_logits, "source": self.source}

    def describe(self) -> dict[str, Any]:
        spec = self.spec
        return {"kind": self.kind, "loss": self.loss, "metric": self.metric, "metrics": list(self.metrics),
                "unit": spec.unit, "higher_is_better": spec.higher_is_better, "user_metric": self.user_metric,
                "notes": list(self.notes),
                **({"output": self.output, "outputs": [{"output": name, **task.describe()}
                                                       for name, task in self.outputs]} if self.outputs else {})}

    def heads(self) -> list[tuple[str | None, "Task"]]:
        """Every output's name and task, the first output's first (one entry, named None, for one output)."""
        return [(self.output, self), *self.outputs]


def user_spec(ref: str) -> MetricSpec:
    """A user metric ``module:function`` (``function(targets, outputs) -> float``; higher is better unless the
    function has ``higher_is_better = False``). Imported only when the recipe or --metric names it. Its import and
    each call run as the user's code (:func:`~edgedeploy.core.user_code.user_code`): what it prints goes to stderr,
    and whatever it raises, ``SystemExit`` and a ``KeyboardInterrupt`` of its own included, is one UsageError
    naming it."""
    module, _, name = ref.partition(":")
    if not module or not name:
        raise UsageError(f"metric '{ref}' is not module:function", "e.g. --metric mypkg.metrics:snr")
    with user_code() as signalled:
        try:
            fn = getattr(importlib.import_module(module), name)
        except (ImportError, AttributeError) as exc:
            raise UsageError(f"metric '{ref}' cannot be loaded ({exc})", "put the module on PYTHONPATH") from None
        except BaseException as exc:  # the user's own code: one line naming it
            reraise_interrupt(exc, signalled)
            raise UsageError(f"metric '{ref}' cannot be loaded ({ended_by(exc)})",
                             "fix the module: loading it must define the function, not print, exit or raise") from None
    if not callable(fn):
        raise UsageError(f"metric '{ref}' is not a function", "name a function(targets, outputs) -> float")

    def measure(y, out) -> float:
        with user_code() as signalled:
            try:
                value = fn(y, out)
            except BaseException as exc:  # the user's own code: its failure is one line naming it
                reraise_interrupt(exc, signalled)
                if tried_to_end(exc):
                    raise UsageError(f"metric '{ref}' tried to end the command ({ended_by(exc)})",
                                     "a metric returns a number; it must not call sys.exit() or raise SystemExit "
                                     "or KeyboardInterrupt") from None
                raise UsageError(f"metric '{ref}' failed ({ended_by(exc)})",
                                 "fix the function: it takes (targets, outputs) and returns a number") from None
        try:
            return float(value)
        except (TypeError, ValueError) as exc:
            raise UsageError(f"metric '{ref}' returned {type(value).__name__}, not a number ({exc})",
                             "fix the function: it takes (targets, outputs) and returns a number") from None

    return MetricSpec(ref, name, str(getattr(fn, "unit", "")), bool(getattr(fn, "higher_is_better", True)), measure)


def _output_activation(model) -> str:
    return _layer_activation(model.layers[-1])


def _layer_activation(layer) -> str:
    while hasattr(layer, "layer") and hasattr(layer.layer, "weights"):  # the layer inside TFMOT's wrappers
        layer = layer.layer
    act = getattr(layer, "activation", None)
    return getattr(act, "__name__", "") or ""


def _config_loss(training_config: dict | None, output: str | None = None, index: int = 0
                 ) -> tuple[str | None, bool | None]:
    """The loss compiled into the model for its output ``output`` (number ``index``): a model compiled with one
    loss per output (a list, or a dict by output name) gives each output its own."""
    if not training_config or not training_config.get("loss"):
        return None, None
    loss = training_config["loss"]
    if isinstance(loss, list):
        loss = loss[index] if index < len(loss) else None
    elif isinstance(loss, dict) and not ("class_name" in loss or "config" in loss):
        loss = loss.get(output) if output is not None else next(iter(loss.values()), None)
    if not loss:
        return None, None
    if isinstance(loss, str):
        return loss, None
    name = loss.get("class_name") or loss.get("config", {}).get("name", "")
    cfg = loss.get("config", {}) or {}
    return str(name), bool(cfg.get("from_logits", False))


def _is_integer_labels(y: np.ndarray) -> bool:
    if np.issubdtype(y.dtype, np.integer) and (y.ndim == 1 or (y.ndim == 2 and y.shape[1] == 1)):
        return True
    return False


def _is_distribution(y: np.ndarray, units: int) -> bool:
    if y.ndim != 2 or y.shape[1] != units or units < 2:
        return False
    y = np.asarray(y, np.float64)
    return bool(np.all(y >= 0) and np.allclose(y.sum(axis=1), 1.0, atol=1e-3))


def _heads(model) -> list[tuple[str | None, tuple, str]]:
    """Each output of ``model``: its name (None for a model with one output), its shape without the batch axis
    and its activation."""
    if not isinstance(model.output_shape, list):
        return [(None, tuple(model.output_shape[1:]), _output_activation(model))]
    names = list(getattr(model, "output_names", None) or [f"output_{i}" for i in range(len(model.output_shape))])
    return [(name, tuple(shape[1:]), _layer_activation(model.get_layer(name)))
            for name, shape in zip(names, model.output_shape)]


def target_key(output: str | None, first: bool) -> str:
    """The data file's key of an output's targets (``y_<output name>``; ``y`` for the first output)."""
    return "y" if first or output is None else f"y_{output}"


def decide(model, training_config: dict | None, data_path, targets: Any, *,
           loss: str | None = None, metric: str | None = None, has_anomaly: bool = False) -> Task:
    """The task of ``model`` on data whose fine-tune targets are ``targets`` (None: the file has none).

    A model with several outputs takes one target array (or None) per output in ``targets``: each output's task
    is decided as for a model with that output alone (``loss`` and ``metric`` are the first output's, the score
    the tree judges); the first output's task is returned, carrying the others in ``outputs``."""
    heads = _heads(model)
    in_shape = tuple(model.input_shape[1:])
    if len(heads) == 1:
        return _decide_one(heads[0], in_shape, training_config, data_path, targets, loss=loss, metric=metric,
                           has_anomaly=has_anomaly)
    tasks = [_decide_one(head, in_shape, training_config, data_path, y, index=i, loss=loss if i == 0 else None,
                         metric=metric if i == 0 else None, has_anomaly=has_anomaly)
             for i, (head, y) in enumerate(zip(heads, targets))]
    first = tasks[0]
    first.output = heads[0][0]
    for (name, _, _), task in zip(heads[1:], tasks[1:]):
        task.output = name
    first.outputs = tuple((str(name), task) for (name, _, _), task in zip(heads[1:], tasks[1:]))
    return first


def _decide_one(head: tuple[str | None, tuple, str], in_shape: tuple, training_config: dict | None, data_path,
                targets: np.ndarray | None, *, index: int = 0, loss: str | None = None, metric: str | None = None,
                has_anomaly: bool = False) -> Task:
    """The task of one output ``head`` (name, shape, activation) on its fine-tune targets."""
    output, out_shape, act = head
    units = int(out_shape[-1]) if out_shape else 1
    name, source, from_logits = _given_loss(loss, training_config, output, index)
    where = f"{data_path}" if output is None else f"{data_path} (output '{output}')"
    if targets is None:
        name, source, kind = _reconstruction(name, source, where, in_shape, out_shape)
    else:
        name, source, kind = _supervised(name, source, where, np.asarray(targets), out_shape,
                                         target_key(output, index == 0))
    if from_logits is None:
        from_logits = act not in ("softmax", "sigmoid")
    from_logits = bool(from_logits) and kind == CLASSIFICATION  # (only cross-entropy reads it)
    metrics: tuple[str, ...]
    allowed: tuple[str, ...]
    if kind == CLASSIFICATION:
        metrics, primary = ("accuracy",), "accuracy"
        allowed = ("accuracy", "top5_accuracy") if units > 5 else ("accuracy",)
    else:
        metrics = ("mse", "mae", "psnr") + (("auc",) if has_anomaly and kind == RECONSTRUCTION else ())
        primary, allowed = "mse", metrics
    if kind == CLASSIFICATION and source.startswith("model compile config") and name != "sparse_categorical_crossentropy":
        source = f"{source[:-1]}; integer labels, so its sparse form)"
    elif kind == CLASSIFICATION and source.startswith("inferred"):
        source += " and " + ("a softmax output" if act == "softmax" else "a logits output")
    task = Task(name, bool(from_logits), source, kind, primary, metrics)
    if metric:
        _score_by(task, metric, allowed)
    return task


def _given_loss(loss: str | None, training_config: dict | None, output: str | None = None, index: int = 0
                ) -> tuple[str | None, str, bool | None]:
    """The loss asked for (``--loss`` / recipe) or compiled into the model, where it comes from and its
    ``from_logits`` (None: decided by the output activation); no name when neither gives one."""
    if loss:
        return check_loss_name(loss, "--loss / recipe loss"), "asked for (recipe or --loss)", None
    cfg_name, from_logits = _config_loss(training_config, output, index)
    if not cfg_name:
        return None, "", from_logits
    name = loss_name(cfg_name)
    if name not in CLASSIFICATION_LOSSES + REGRESSION_LOSSES:
        raise InvalidInputError(f"the model's compile config names the loss '{cfg_name}', which edgedeploy "
                                "cannot rebuild", "pass --loss NAME with a Keras built-in loss")
    return name, f"model compile config ({cfg_name})", from_logits


def _reconstruction(name: str | None, source: str, where: str, in_shape: tuple, out_shape: tuple
                    ) -> tuple[str, str, str]:
    """Data without targets: the model reconstructs its input, so its output must be shaped like it."""
    if name is None:
        name, source = "mean_squared_error", "inferred: no targets in the data, so reconstruction (targets = inputs)"
    if name in CLASSIFICATION_LOSSES:
        raise InvalidInputError(f"{where}: the data has no targets (x only) but the loss is {name}",
                                "add class labels (y or y_train/y_test), or pass --loss mean_squared_error")
    if in_shape != out_shape:
        raise InvalidInputError(f"{where}: the data has no targets, so the model would reconstruct its input, but "
                                f"its output shape {list(out_shape)} differs from its input {list(in_shape)}",
                                "add targets shaped like the model's output (y or y_train/y_test)")
    return name, source, RECONSTRUCTION


def _supervised(name: str | None, source: str, where: str, y: np.ndarray, out_shape: tuple, key: str = "y"
                ) -> tuple[str, str, str]:
    """Data with targets ``y`` (the file's ``key``): the loss (inferred from ``y`` when none is given) and the task
    it makes, once ``y`` is known to fit both the loss and the model's output."""
    units = int(out_shape[-1]) if out_shape else 1
    desc = f"targets {key} ({list(y.shape)} {y.dtype})"
    if name is None:
        name, source = _inferred_loss(y, units, out_shape, f"{where}: {desc}")
    if name in CLASSIFICATION_LOSSES:
        if not (_is_integer_labels(y) or _is_distribution(y, units)
                or (y.ndim == 2 and y.shape[1] == units and np.all((y == 0) | (y == 1)))):
            raise InvalidInputError(
                f"{where}: {desc} are not class labels, but the loss is {name} and the model's output is "
                f"{list(out_shape)}", "give integer class indices or one-hot rows, or pass --loss "
                "mean_squared_error to train on them as values")
        if units < 2:
            raise InvalidInputError(
                f"{where}: {desc} are class labels but the model has one output unit {list(out_shape)}; "
                "edgedeploy fine-tunes and scores classifiers with one output per class",
                "give the model two outputs (softmax), or pass --loss mean_squared_error to treat it as regression")
        return name, source, CLASSIFICATION
    if not (tuple(y.shape[1:]) == out_shape or (y.ndim == 1 and out_shape == (1,))):
        raise InvalidInputError(
            f"{where}: {desc} do not have the model's output shape {list(out_shape)} (loss {name})",
            "give one target per sample shaped like the model's output, or drop y to reconstruct the input")
    return name, source, REGRESSION


def _inferred_loss(y: np.ndarray, units: int, out_shape: tuple, what: str) -> tuple[str, str]:
    """The loss the targets ``y`` call for when none is asked for, and why (``what`` names them in errors)."""
    if _is_integer_labels(y):
        return "sparse_categorical_crossentropy", "inferred: integer class labels"
    if _is_distribution(y, units):
        return "categorical_crossentropy", (
            "inferred: one-hot or probability rows" if np.all((y == 0) | (y == 1))
            else "inferred: probability rows (fine-tuned on the probabilities)")
    if tuple(y.shape[1:]) == out_shape or (y.ndim == 1 and out_shape == (1,)):
        return "mean_squared_error", "inferred: float targets shaped like the model's output"
    raise InvalidInputError(
        f"{what} fit no task of a model whose output is {list(out_shape)}",
        "give integer class labels, one-hot rows, or float targets shaped like the output (or --loss)")


def _score_by(task: Task, metric: str, allowed: tuple[str, ...]) -> None:
    """Make ``metric`` (a built-in one in ``allowed``, or ``module:function``) the task's primary metric."""
    if ":" in metric:
        user_spec(metric)
        task.user_metric, task.metric = metric, metric
        task.metrics = (*task.metrics, metric)
    elif metric in allowed:
        task.metric = metric
        task.metrics = tuple(dict.fromkeys((*task.metrics, metric)))
    else:
        raise UsageError(f"metric '{metric}' does not apply to a {task.kind} model",
                         f"allowed values: {', '.join(allowed)}, or module:function")


def score(task: Task, outputs: np.ndarray, y: np.ndarray, x: np.ndarray | None = None,
          anomaly: np.ndarray | None = None) -> dict[str, float]:
    """Every metric of ``task`` on the evaluation split (``y``: labels or targets)."""
    out: dict[str, float] = {}
    for name in task.metrics:
        if name == "auc":
            if anomaly is not None:
                out[name] = roc_auc(anomaly, per_sample_mse(y, outputs))
        elif name in METRICS:
            out[name] = METRICS[name].fn(y, outputs)
        else:
            out[name] = user_spec(name).fn(y, outputs)
    return out
