"""Data held in memory (the Python API): arrays, a ``tf.data.Dataset``, and a calibration generator.

- ``(x, y)``: one set of arrays; a seeded stratified choice of each class is held out for evaluation (a random
  one for target values);
- ``((x_train, y_train), (x_test, y_test))`` (Keras' ``load_data()`` shape) or a pair of datasets: the
  fine-tune and evaluation splits as given;
- a dict with the arrays of an ``.npz`` layout (:mod:`edgedeploy.config.data`);
- a finite ``tf.data.Dataset`` of ``(x, y)`` elements (or ``x`` alone, for a model that reconstructs its input),
  batched or not;
- ``calibration``: a ``representative_dataset``-style function (each item a list with one input array, as
  ``tf.lite.TFLiteConverter`` takes), or any iterable of input arrays, calibrating int8 ranges instead of the
  fine-tune split.
"""

from __future__ import annotations

from typing import Any, Callable, Iterable, Mapping, Sequence

import numpy as np

from ..errors import InvalidInputError, UsageError
from .samples import EVAL, FIT, Samples, stratified_split

MAX_SAMPLES = 10_000_000  # a dataset that yields more is taken for an endless one


def is_tf_dataset(obj: Any) -> bool:
    """A ``tf.data.Dataset`` (checked without importing TensorFlow)."""
    return any(c.__module__.startswith("tensorflow") and c.__name__ in ("DatasetV2", "DatasetV1")
               for c in type(obj).__mro__)


def _dataset_arrays(ds: Any, rank: int, batched: bool | None, what: str) -> tuple[np.ndarray, np.ndarray | None]:
    """Every element of a finite dataset as numpy arrays ``(x, y)`` (``y`` None for ``x``-only elements)."""
    from edgedeploy.keras import tfenv

    tf = tfenv.load().tf
    card = int(ds.cardinality())
    if card == int(tf.data.INFINITE_CARDINALITY):
        raise InvalidInputError(f"the {what} dataset repeats forever", "drop .repeat() or add .take(N)")
    xs: list[np.ndarray] = []
    ys: list[np.ndarray] = []
    has_y = None
    count = 0
    for element in ds.as_numpy_iterator():
        pair = isinstance(element, tuple) and len(element) in (2, 3)  # (x, y) or (x, y, sample_weight)
        x, y = (element[0], element[1]) if pair else (element, None)
        if isinstance(x, (dict, tuple, list)):
            raise UsageError(f"the {what} dataset yields {type(x).__name__} inputs",
                             "yield (x, y) with one input array (the model has one input)")
        x = np.asarray(x)
        if batched is None:
            batched = x.ndim == rank + 1
        has_y = y is not None if has_y is None else has_y
        xs.append(x if batched else x[None])
        if y is not None:
            y = np.asarray(y)
            ys.append(y if batched else y[None])
        count += len(xs[-1])
        if count > MAX_SAMPLES:
            raise InvalidInputError(f"the {what} dataset yields more than {MAX_SAMPLES:,} samples",
                                    "take a finite part of it (.take(N))")
    if not xs:
        raise InvalidInputError(f"the {what} dataset is empty", "give a dataset with samples")
    return np.concatenate(xs), (np.concatenate(ys) if has_y else None)


def _strata(y: np.ndarray | None) -> np.ndarray | None:
    """Class per sample for a stratified split, or None for target values."""
    if y is None:
        return None
    y = np.asarray(y)
    if y.ndim == 1 and np.issubdtype(y.dtype, np.integer):
        return y
    if y.ndim == 2 and y.shape[1] > 1:
        return y.argmax(axis=1)
    return None


def _split(n: int, y: np.ndarray | None, fraction: float, seed: int) -> np.ndarray:
    strata = _strata(y)
    if strata is not None:
        return stratified_split(strata, fraction, seed)
    split = np.zeros(n, dtype=np.int8)
    n_eval = min(n - 1, max(1, int(round(fraction * n))))
    split[np.random.default_rng(seed).choice(n, n_eval, replace=False)] = EVAL
    return split


def _arrays(obj: Any, rank: int, batched: bool | None, what: str) -> tuple[np.ndarray, np.ndarray | None]:
    if is_tf_dataset(obj):
        return _dataset_arrays(obj, rank, batched, what)
    if isinstance(obj, tuple) and len(obj) == 2:
        return np.asarray(obj[0]), (None if obj[1] is None else np.asarray(obj[1]))
    raise UsageError(f"the {what} data is a {type(obj).__name__}", "give (x, y) arrays or a tf.data.Dataset")


def from_memory(data: Any, input_rank: int, *, eval_fraction: float, seed: int, batched: bool | None = None,
                labels: Sequence[str] | None = None) -> Samples:
    """``data`` (see the module docstring) as :class:`Samples`; ``input_rank`` is the model input's rank without
    the batch axis (to tell a batched dataset from an unbatched one when ``batched`` is None)."""
    if isinstance(data, Mapping):
        return _from_layout(data, labels)
    pair_of_sets = (isinstance(data, tuple) and len(data) == 2
                    and all(is_tf_dataset(d) or (isinstance(d, tuple) and len(d) == 2) for d in data))
    if pair_of_sets:
        (x_fit, y_fit), (x_eval, y_eval) = (_arrays(d, input_rank, batched, w)
                                            for d, w in zip(data, ("fine-tune", "evaluation")))
        if (y_fit is None) != (y_eval is None):
            raise UsageError("the fine-tune and evaluation data differ: one has targets, the other none",
                             "give targets to both, or to neither")
        x = np.concatenate([x_fit, x_eval]) if x_fit.shape[1:] == x_eval.shape[1:] else None
        if x is None:
            raise InvalidInputError(f"fine-tune samples are {list(x_fit.shape[1:])}, evaluation samples "
                                    f"{list(x_eval.shape[1:])}", "give samples of one shape")
        y = None if y_fit is None else np.concatenate([y_fit, y_eval])
        split = np.concatenate([np.full(len(x_fit), FIT, np.int8), np.full(len(x_eval), EVAL, np.int8)])
        how = "given as two sets (fine-tune, evaluation)"
    else:
        x, y = _arrays(data, input_rank, batched, "given")
        if y is not None and len(y) != len(x):
            raise InvalidInputError(f"{len(x)} samples but {len(y)} targets", "give one target per sample")
        split = _split(len(x), y, eval_fraction, seed)
        how = (f"a seeded {'stratified ' if _strata(y) is not None else ''}choice of {eval_fraction:g}"
               f"{' of each class' if _strata(y) is not None else ''} (seed {seed})")
    source = "tf.data" if is_tf_dataset(data) or (pair_of_sets and is_tf_dataset(data[0])) else "arrays"
    return Samples(np.asarray(x, np.float32) if np.issubdtype(np.asarray(x).dtype, np.number) else np.asarray(x),
                   y, split, list(labels) if labels is not None else None,
                   info={"source": source, "split_from": how, "n": int(len(x))})


def _from_layout(data: Mapping[str, Any], labels: Sequence[str] | None) -> Samples:
    """A dict with the arrays of an ``.npz`` layout."""
    keys = set(data)
    if {"x", "split"} <= keys:
        x, split = np.asarray(data["x"]), np.asarray(data["split"]).astype(np.int8)
        y = None if data.get("y") is None else np.asarray(data["y"])
    elif {"x_train", "x_test"} <= keys:
        x_fit, x_eval = np.asarray(data["x_train"]), np.asarray(data["x_test"])
        x = np.concatenate([x_fit, x_eval])
        y = (None if data.get("y_train") is None or data.get("y_test") is None
             else np.concatenate([np.asarray(data["y_train"]), np.asarray(data["y_test"])]))
        split = np.concatenate([np.full(len(x_fit), FIT, np.int8), np.full(len(x_eval), EVAL, np.int8)])
    else:
        raise UsageError(f"the data dict has keys {sorted(map(str, keys))}",
                         "give x, y, split (0 fine-tune, 1 evaluate) or x_train, y_train, x_test, y_test")
    names = labels if labels is not None else data.get("labels", data.get("classes"))
    return Samples(x, y, split, None if names is None else [str(v) for v in names],
                   info={"source": "arrays", "split_from": "the dict's split", "n": int(len(x))})


def calibration_samples(source: Callable[[], Iterable[Any]] | Iterable[Any], rank: int) -> np.ndarray:
    """The samples of a ``representative_dataset``-style function or iterable, as one float32 array."""
    items = source() if callable(source) else source
    if is_tf_dataset(items):
        x, _ = _dataset_arrays(items, rank, None, "calibration")
        return x.astype(np.float32)
    rows: list[np.ndarray] = []
    for item in items:
        if isinstance(item, (list, tuple)):
            if len(item) != 1:
                raise UsageError(f"the calibration data yields {len(item)} inputs",
                                 "yield [x] (one input array) per item")
            item = item[0]
        a = np.asarray(item, dtype=np.float32)
        rows.extend(a if a.ndim == rank + 1 else a[None])
        if len(rows) > MAX_SAMPLES:
            raise InvalidInputError(f"the calibration data yields more than {MAX_SAMPLES:,} samples",
                                    "yield a finite number of samples")
    if not rows:
        raise InvalidInputError("the calibration data yields no samples", "yield [x] for each calibration sample")
    return np.stack(rows)
