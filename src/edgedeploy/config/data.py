"""Real data for fine-tuning, calibration and evaluation, from an ``.npz`` file.

Two layouts are understood:
- ``x``, ``y`` and ``split`` (0 = fine-tune/calibrate, 1 = evaluate), optionally ``labels``;
- ``x_train``, ``y_train``, ``x_test``, ``y_test``, optionally ``classes`` or ``labels``.

``y`` holds class labels (or one-hot rows, or probability rows: fine-tuning learns the probabilities, accuracy
is scored against their arg max) for a classifier, float targets shaped like the model's output for a
regression model; without ``y`` (``x`` and ``split``, or ``x_train`` and ``x_test`` only) the model reconstructs
its input. ``y_anomaly`` (one 0/1 value per sample of ``x``, or per evaluation sample) marks anomalous samples
for the ROC AUC of the reconstruction error (see :mod:`edgedeploy.config.task`).

Fine-tune samples without a label carry the label ``-1`` (in ``y`` where ``split == 0``, or in ``y_train``):
distillation learns the float model's outputs on them, the hold-out and the plain recipe skip them, and
they calibrate int8 conversion like any other sample. Every evaluation sample needs a label.

A model with several outputs takes one target array per output, named after the output layer: ``y_<name>``
(``y_train_<name>`` and ``y_test_<name>`` in the train/test layout), ``y`` (``y_train``, ``y_test``) standing for
the first output's; each output's targets are read as a single output's are (:func:`output_arrays`). A file of
inputs only gives no output targets (every output then reconstructs the input).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from edgedeploy.errors import InvalidInputError
from edgedeploy.core.files import sha256_file
from edgedeploy.core.npz import check_finite, npz_members, read_npz

FIT, EVAL = 0, 1
UNLABELLED = -1


@dataclass
class Dataset:
    path: Path
    layout: str
    x_fit: np.ndarray
    y_fit: np.ndarray
    x_eval: np.ndarray
    y_eval: np.ndarray
    labels: list[str] | None
    sha256: str
    reshaped_from: tuple[int, ...] | None = None
    # the float model's log-probabilities (classifiers) or outputs on x_fit (set by optimize when it distils)
    soft_targets: np.ndarray | None = None
    # the same on each fine-tune image mirrored left to right (set by optimize for thin_augment = "hflip")
    mirrored_targets: np.ndarray | None = None
    kind: str = "classification"  # edgedeploy.config.task: classification, regression or reconstruction
    task: Any = None  # the edgedeploy.config.task.Task it is scored for (set by optimize)
    anomaly: np.ndarray | None = None  # 0/1 per evaluation sample (anomalous = 1), when the file has them
    eval_set: str | None = None  # which evaluation samples (sources and class names), whatever their features
    # probability targets of the fine-tune samples (rows summing to 1, not all one-hot): fine-tuning learns
    # these; y_fit holds their arg max (hold-out strata, accuracy)
    p_fit: np.ndarray | None = None
    # calibration samples given apart from the fine-tune split (the file's ``x_calibration``, see
    # edgedeploy.data_sources.memory); None: calibrate on fine-tune samples
    x_calibration: np.ndarray | None = None
    # a model with several outputs: this data set holds the first output's targets, ``others`` each other output's
    # name and its data set (the same samples, that output's targets, task and teacher outputs)
    others: list[tuple[str, "Dataset"]] = field(default_factory=list)

    @property
    def labelled(self) -> bool:
        """Class labels (with -1 for unlabelled samples), rather than target values."""
        return self.kind == "classification"

    def calibration(self, n: int, seed: int = 0) -> tuple[np.ndarray, str]:
        """``n`` fine-tune samples for int8 calibration, and where they come from.

        A seeded random choice, not the first ``n``: data sets are often stored sorted by class, and ranges
        calibrated on a few classes clip the others. All of the split when it has ``n`` or fewer samples.
        """
        if self.x_calibration is not None:
            if n >= len(self.x_calibration):
                return self.x_calibration, f"all {len(self.x_calibration)} given calibration samples (x_calibration)"
            idx = np.sort(np.random.default_rng(seed).choice(len(self.x_calibration), n, replace=False))
            return self.x_calibration[idx], f"{n} random samples of the given calibration samples (seed {seed})"
        if n >= len(self.x_fit):
            return self.x_fit, f"all {len(self.x_fit)} samples of the fine-tune split ({self.describe()['fit_split']})"
        idx = np.sort(np.random.default_rng(seed).choice(len(self.x_fit), n, replace=False))
        return self.x_fit[idx], (f"{n} random samples of the fine-tune split ({self.describe()['fit_split']}, "
                                 f"seed {seed})")

    def describe(self) -> dict[str, Any]:
        return {
            "path": str(self.path.resolve()),
            "sha256": self.sha256,
            "layout": self.layout,
            "fit_split": "split == 0" if self.layout == "x/y/split" else "x_train",
            "eval_split": "split == 1" if self.layout == "x/y/split" else "x_test",
            "n_fit": int(len(self.x_fit)),
            "n_fit_unlabelled": int(np.sum(self.y_fit < 0)) if self.labelled else 0,
            "n_eval": int(len(self.x_eval)),
            "eval_set": self.eval_set,
            "labels": self.labels,
            "input_shape": list(self.x_fit.shape[1:]),
            "reshaped_from": list(self.reshaped_from) if self.reshaped_from else None,
            **({"task": self.kind, "targets": "the inputs" if self.kind == "reconstruction" else "y (values)",
                "anomaly_labels": None if self.anomaly is None else int(np.sum(self.anomaly))}
               if not self.labelled else {}),
        }


def _fail(path: Path, what: str, hint: str) -> InvalidInputError:
    return InvalidInputError(f"{path}: {what}", hint)


def _real(path: Path, key: str, a: np.ndarray) -> None:
    """Complex targets are refused: float32 would keep their real part and drop the rest without a word."""
    if np.iscomplexobj(a):
        raise _fail(path, f"'{key}' holds {a.dtype} values, not real numbers", "store real targets")


def read_data_file(path: Path | str) -> dict[str, Any]:
    """Every array of the data file ``path`` (a checked ``.npz``), read once for :func:`read_targets` and
    :func:`load_dataset`."""
    path = Path(path)
    if not path.exists():
        raise InvalidInputError(f"data file {path} does not exist", "pass --data FILE.npz")
    return read_npz(path, "data file", "data")


def read_targets(path: Path | str, arrays: dict[str, Any] | None = None) -> tuple[np.ndarray | None, bool]:
    """The fine-tune targets of ``path`` as stored (None when the file has none), to decide the task, and whether
    the file has anomaly labels. ``arrays``: the file's arrays already read (:func:`read_data_file`)."""
    path = Path(path)
    if arrays is None:
        if not path.exists():
            raise InvalidInputError(f"data file {path} does not exist", "pass --data FILE.npz")
        members = set(npz_members(path))
        arrays = read_npz(path, "data file", "data", keys=("y", "split", "y_train", "y_test"))
    else:
        members = set(arrays)
        arrays = {k: arrays[k] for k in ("y", "split", "y_train", "y_test") if k in arrays}
    for key, a in arrays.items():  # the targets decide the task: NaN there must not pass for regression
        _real(path, key, a)
        check_finite(path, key, a)
    anomaly = any(k in members for k in ANOMALY_KEYS)
    if "y" in arrays and "split" in arrays:
        y, split = arrays["y"], arrays["split"]
        if y.ndim == 0 or split.ndim == 0:
            raise _fail(path, "'y' or 'split' is a single value, not an array of samples", "store one entry per sample")
        return (y[split == FIT] if split.shape == (len(y),) else y), anomaly
    if "y_train" in arrays:
        return arrays["y_train"], anomaly
    if "y" in arrays:  # targets without the split that says which samples evaluate: not "no targets"
        raise _fail(path, "has 'y' but no 'split' (which samples fine-tune and which evaluate)", _HINT_LAYOUT)
    return None, anomaly


_TARGET_KEYS = ("y", "y_train", "y_test")


def output_arrays(path: Path | str, arrays: dict[str, Any], outputs: list[str]) -> list[dict[str, Any]]:
    """The file's arrays as each of a model's several ``outputs`` (their layer names, in order) reads them: that
    output's targets under ``y`` (``y_train``, ``y_test``), from ``y_<name>`` (``y_train_<name>``,
    ``y_test_<name>``), the plain keys standing for the first output's. A file of inputs only is the same for
    every output; a file that gives targets for some outputs but not all stops, naming the missing key."""
    path = Path(path)

    def given(name: str, first: bool) -> dict[str, Any]:
        found = {base: arrays[f"{base}_{name}"] for base in _TARGET_KEYS if f"{base}_{name}" in arrays}
        if first and not found:
            found = {base: arrays[base] for base in _TARGET_KEYS if base in arrays}
        return found

    per_output = [given(name, i == 0) for i, name in enumerate(outputs)]
    if not any(per_output):
        return [arrays for _ in outputs]  # inputs only: every output reconstructs its input
    views = []
    for i, (name, found) in enumerate(zip(outputs, per_output)):
        if not found:
            keys = [f"y_{name}"] if "x" in arrays else [f"y_train_{name}", f"y_test_{name}"]
            raise _fail(path, f"has no targets for the model's output '{name}' (no {' or '.join(map(repr, keys))})",
                        f"add {' and '.join(keys)}: one target per sample for that output"
                        + (" ('y' is the first output's)" if i else ""))
        view = {k: v for k, v in arrays.items() if k not in _TARGET_KEYS}
        view.update(found)
        views.append(view)
    return views


def load_dataset(path: Path | str, input_shape: tuple[int, ...], num_classes: int, kind: str = "classification",
                 arrays: dict[str, Any] | None = None, sha256: str | None = None) -> Dataset:
    """Load and check ``path`` against a model's input shape (without batch) and class count (``kind``:
    classification; regression and reconstruction take target values, see :mod:`edgedeploy.config.task`).
    ``arrays``: the file's arrays already read (:func:`read_data_file`), or samples not yet written, with ``path``
    the folder or file they came from (what errors name) and ``sha256`` given (set it, and ``path``, once the
    samples are written)."""
    path = Path(path)
    arrays = _read_samples(path, arrays)
    x_fit, y_fit, x_eval, y_eval, layout, eval_files = _splits(path, arrays)
    sample_shape = tuple(x_fit.shape[1:])
    reshaped_from = _reshaped_from(path, sample_shape, input_shape)
    if reshaped_from is not None:
        x_fit = x_fit.reshape((len(x_fit), *input_shape))
        x_eval = x_eval.reshape((len(x_eval), *input_shape))
    x_calibration = _calibration_samples(path, arrays.get("x_calibration"), input_shape, sample_shape)
    anomaly = _anomaly(path, arrays, len(x_eval), layout)
    y_fit, y_eval, p_fit = _targets(path, kind, num_classes, (x_fit, y_fit), (x_eval, y_eval))
    names = _class_names(path, arrays, num_classes) if kind == "classification" else None
    return Dataset(
        path=path,
        layout=layout,
        x_fit=np.ascontiguousarray(x_fit, dtype=np.float32),
        y_fit=y_fit,
        x_eval=np.ascontiguousarray(x_eval, dtype=np.float32),
        y_eval=y_eval,
        labels=names,
        sha256=sha256_file(path) if sha256 is None else sha256,
        reshaped_from=reshaped_from,
        kind=kind,
        anomaly=anomaly,
        eval_set=_eval_set(eval_files, y_eval, names) if kind == "classification" else None,
        p_fit=p_fit,
        x_calibration=x_calibration,
    )


def _read_samples(path: Path, arrays: dict[str, Any] | None = None) -> dict[str, Any]:
    """The file's arrays, once each array of samples, targets and labels is known to be real and finite."""
    if arrays is None:  # a regular file within the size limit, of .npy arrays only (edgedeploy.core.npz)
        arrays = read_data_file(path)
    for key in ("x", "y", "split", "x_train", "y_train", "x_test", "y_test"):
        if key in arrays and arrays[key].ndim == 0:
            raise _fail(path, f"'{key}' is a single value, not an array of samples", "store one entry per sample")
    for key in ("x", "x_train", "x_test", "x_calibration"):
        a = arrays.get(key)
        if a is not None and (not (np.issubdtype(a.dtype, np.number) or a.dtype == bool)
                              or np.issubdtype(a.dtype, np.complexfloating)):
            raise _fail(path, f"'{key}' holds {a.dtype} values, not real numbers", "store the samples as float32")
    for key in ("y", "y_train", "y_test", *ANOMALY_KEYS):
        if key in arrays:
            _real(path, key, arrays[key])
    for key in ("x", "y", "x_train", "y_train", "x_test", "y_test", *ANOMALY_KEYS):  # samples, targets, labels
        if key in arrays:
            check_finite(path, key, arrays[key])
    return arrays


_HINT_LAYOUT = "provide x, y and split (0 = fine-tune, 1 = evaluate), or x_train, y_train, x_test, y_test"


def _splits(path: Path, arrays: dict[str, Any]) -> tuple[Any, Any, Any, Any, str, Any]:
    """``x_fit, y_fit, x_eval, y_eval`` (``y`` None without targets), the layout and the evaluation samples'
    source files (None when the file does not name them)."""
    keys = set(arrays)
    if {"x", "split"} <= keys and "y" not in keys:
        arrays["y"] = None  # no targets: reconstruction
    if {"x_train", "x_test"} <= keys and not ({"y_train", "y_test"} & keys):
        arrays["y_train"] = arrays["y_test"] = None
        keys |= {"y_train", "y_test"}
    eval_files = None
    if {"x", "split"} <= keys and arrays.get("y", 0) is None:
        split = arrays["split"]
        if split.shape != (len(arrays["x"]),):
            raise _fail(path, "x and split have different lengths", "give one split value per sample")
        x_fit, x_eval, y_fit, y_eval = arrays["x"][split == FIT], arrays["x"][split == EVAL], None, None
        layout = "x/y/split"
    elif {"x", "y", "split"} <= keys:
        x_fit, y_fit, x_eval, y_eval, eval_files = _split_by_column(path, arrays)
        layout = "x/y/split"
    elif {"x_train", "y_train", "x_test", "y_test"} <= keys:
        x_fit, y_fit, x_eval, y_eval = arrays["x_train"], arrays["y_train"], arrays["x_test"], arrays["y_test"]
        layout = "train/test"
        if y_fit is not None and (len(x_fit) != len(y_fit) or len(x_eval) != len(y_eval)):
            raise _fail(path, "x and y of a split have different lengths", "give one label per sample")
    else:
        raise _fail(path, f"has arrays {sorted(keys)}, not a layout edgedeploy reads", _HINT_LAYOUT)
    if len(x_fit) == 0:
        raise _fail(path, "the fine-tune split is empty", "put samples with split == 0 (or x_train) in the file")
    if len(x_eval) == 0:
        raise _fail(path, "the evaluation split is empty", "put samples with split == 1 (or x_test) in the file")
    return x_fit, y_fit, x_eval, y_eval, layout, eval_files


def _split_by_column(path: Path, arrays: dict[str, Any]) -> tuple[Any, Any, Any, Any, Any]:
    """The ``x``, ``y``, ``split`` layout: its two splits, and the evaluation samples' ``files`` if given."""
    split = arrays["split"]
    if split.shape != (len(arrays["x"]),) or len(arrays["y"]) != len(arrays["x"]):
        raise _fail(path, "x, y and split have different lengths", "give one split value and one label per sample")
    unknown = sorted(set(np.unique(split).tolist()) - {FIT, EVAL})
    if unknown:
        raise _fail(path, f"split has values {unknown}; allowed values: 0 (fine-tune), 1 (evaluate)", _HINT_LAYOUT)
    x_fit, y_fit = arrays["x"][split == FIT], arrays["y"][split == FIT]
    x_eval, y_eval = arrays["x"][split == EVAL], arrays["y"][split == EVAL]
    files = arrays.get("files")
    eval_files = files[split == EVAL] if files is not None and getattr(files, "shape", None) == split.shape else None
    return x_fit, y_fit, x_eval, y_eval, eval_files


def _reshaped_from(path: Path, sample_shape: tuple[int, ...], input_shape: tuple[int, ...]
                   ) -> tuple[int, ...] | None:
    """``sample_shape`` when the samples take the model's input shape by adding or dropping size-1 axes, None when
    they already have it; any other shape is refused."""
    if sample_shape == tuple(input_shape):
        return None
    squeeze = lambda s: tuple(d for d in s if d != 1)  # noqa: E731
    if squeeze(sample_shape) == squeeze(tuple(input_shape)):
        return sample_shape
    raise _fail(
        path,
        f"samples have shape {list(sample_shape)} but the model's input is {list(input_shape)}",
        "give data shaped like the model input (without the batch axis)",
    )


def _calibration_samples(path: Path, x_calibration: Any, input_shape: tuple[int, ...],
                         sample_shape: tuple[int, ...]) -> np.ndarray | None:
    """The file's ``x_calibration`` as float32 samples of the model's input shape (None when absent)."""
    if x_calibration is None:
        return None
    if x_calibration.ndim < 1 or len(x_calibration) == 0 or not np.issubdtype(x_calibration.dtype, np.number) \
            or not np.isfinite(x_calibration).all():
        raise _fail(path, "'x_calibration' is not an array of finite samples", "store float32 samples")
    if tuple(x_calibration.shape[1:]) != tuple(input_shape):
        if x_calibration.shape[1:] != sample_shape:
            raise _fail(path, f"'x_calibration' samples have shape {list(x_calibration.shape[1:])}, the other "
                        f"samples {list(sample_shape)}", "give calibration samples shaped like the others")
        x_calibration = x_calibration.reshape((len(x_calibration), *input_shape))
    return np.ascontiguousarray(x_calibration, dtype=np.float32)


def _targets(path: Path, kind: str, num_classes: int, fit: tuple[Any, Any], evaluation: tuple[Any, Any]
             ) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """``y_fit``, ``y_eval`` and the fine-tune probability rows (None unless given) for the task ``kind``, from
    the ``(x, y)`` pairs of each split."""
    (x_fit, y_fit), (x_eval, y_eval) = fit, evaluation
    if kind == "classification":
        if y_fit is None or y_eval is None:
            raise _fail(path, "holds inputs only (no y, or no y_train and y_test), so no class labels",
                        "add the class labels: y, or y_train and y_test")
        p_fit = probability_rows(y_fit, num_classes)
        y_fit = _labels(path, y_fit, num_classes, "fine-tune", unlabelled_ok=True)
        return y_fit, _labels(path, y_eval, num_classes, "evaluation"), p_fit
    if y_fit is None or kind == "reconstruction":
        # reconstruction: the targets are the inputs
        return np.ascontiguousarray(x_fit, dtype=np.float32), np.ascontiguousarray(x_eval, dtype=np.float32), None
    return _value_rows(y_fit), _value_rows(y_eval), None


def _value_rows(y: np.ndarray) -> np.ndarray:
    """Regression targets as float32, one row per sample."""
    return np.asarray(y, np.float32).reshape((len(y), -1)) if y.ndim == 1 else np.asarray(y, np.float32)


def _class_names(path: Path, arrays: dict[str, Any], num_classes: int) -> list[str] | None:
    """The class names the file gives (``labels`` or ``classes``), one per output of the model."""
    for key in ("labels", "classes"):
        if key in arrays and arrays[key].ndim == 1:
            names = [str(v) for v in arrays[key].tolist()]
            if len(names) != num_classes:
                given = (f"{len(names)} class folder{'s' if len(names) != 1 else ''} ({_listed(names)})"
                         if path.is_dir() else f"'{key}' names {len(names)} classes")
                raise _fail(path, f"{given} but the model has {num_classes} outputs",
                            "give one class folder per output of the model" if path.is_dir()
                            else "use the data set that matches the model")
            return names
    return None


def _listed(names: list[str], most: int = 5) -> str:
    return ", ".join(names[:most]) + (f", ... ({len(names) - most} more)" if len(names) > most else "")


def _eval_set(files: np.ndarray | None, y_eval: np.ndarray, names: list[str] | None) -> str | None:
    """Which evaluation samples these are, whatever features they are stored as: the sha256 of each sample's
    source (the file's ``files`` array) with its class name, in sorted order. Two data files of the same clips
    through different front ends (and class orders) get the same value; None without ``files`` or names."""
    if files is None or names is None or len(files) != len(y_eval):
        return None
    pairs = sorted(f"{f}\t{names[int(c)]}" for f, c in zip(np.asarray(files).astype(str).tolist(), y_eval.tolist()))
    return hashlib.sha256("\n".join(pairs).encode("utf-8")).hexdigest()


def probability_rows(y: Any, num_classes: int) -> np.ndarray | None:
    """``y`` as float32 when it holds probability targets: one row of ``num_classes`` non-negative values summing
    to 1 per sample, not all of them one-hot (one-hot rows are class labels). None otherwise."""
    if y is None or np.ndim(y) != 2 or np.shape(y)[1] != num_classes or num_classes < 2:
        return None
    y = np.asarray(y)
    if not np.issubdtype(y.dtype, np.floating):
        return None
    if not (np.all(y >= 0) and np.allclose(y.sum(axis=1), 1.0, atol=1e-3)) or np.all((y == 0) | (y == 1)):
        return None
    return np.ascontiguousarray(y, dtype=np.float32)


ANOMALY_KEYS = ("y_anomaly", "anomaly", "y_test_anomaly")


def _anomaly(path: Path, arrays: dict[str, Any], n_eval: int, layout: str) -> np.ndarray | None:
    key = next((k for k in ANOMALY_KEYS if k in arrays), None)
    if key is None:
        return None
    a = np.asarray(arrays[key]).reshape(-1)
    if layout == "x/y/split" and len(a) == len(arrays["split"]):
        a = a[arrays["split"] == EVAL]
    if len(a) != n_eval or not np.all((a == 0) | (a == 1)):
        raise _fail(path, f"'{key}' ({list(np.shape(arrays[key]))} {np.asarray(arrays[key]).dtype}) is not one 0/1 "
                    f"value per evaluation sample ({n_eval})", "give 1 for anomalous and 0 for normal samples")
    return a.astype(np.int64)


def _labels(path: Path, y: np.ndarray, num_classes: int, which: str, unlabelled_ok: bool = False) -> np.ndarray:
    if y.ndim == 2 and y.shape[1] == num_classes:  # one-hot
        y = y.argmax(axis=1)
    if y.ndim != 1 or not np.issubdtype(y.dtype, np.integer):
        raise _fail(path, f"{which} labels must be integer class indices (or one-hot rows), got {y.dtype} {list(y.shape)}",
                    "store class indices 0..C-1")
    labelled = y[y != UNLABELLED] if unlabelled_ok else y
    if unlabelled_ok and len(labelled) == 0:
        return y.astype(np.int64)
    lo, hi = int(labelled.min()), int(labelled.max())
    if lo < 0 or hi >= num_classes:
        raise _fail(path, f"{which} labels range from {lo} to {hi} but the model has {num_classes} classes (0..{num_classes - 1})",
                    "use the data set that matches the model, or fix the labels"
                    + (" (-1 marks an unlabelled fine-tune sample)" if unlabelled_ok else ""))
    return y.astype(np.int64)
