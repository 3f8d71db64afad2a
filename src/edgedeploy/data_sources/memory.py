"""Data held in memory (the Python API): arrays, a ``tf.data.Dataset``, and a calibration generator.

- ``(x, y)``: one set of arrays; a seeded stratified choice of each class is held out for evaluation (a random
  one for target values);
- ``((x_train, y_train), (x_test, y_test))`` (Keras' ``load_data()`` shape) or a pair of datasets: the
  fine-tune and evaluation splits as given;
- a dict with the arrays of an ``.npz`` layout (:mod:`edgedeploy.config.data`);
- a ``tf.data.Dataset`` of ``(x, y)`` elements (or ``x`` alone, for a model that reconstructs its input),
  batched or not, read up to the recipe's ``data.max_samples`` (and :data:`STREAM_MEMORY_LIMIT`): one of unknown
  length stops there, one of known length beyond it is refused, and so is one TensorFlow knows never ends;
- ``calibration``: a ``representative_dataset``-style function (each item a list with one input array, as
  ``tf.lite.TFLiteConverter`` takes), or any iterable of input arrays, calibrating int8 ranges instead of the
  fine-tune split: its first ``calibration_samples`` (the recipe's) are read, and no more.
"""

from __future__ import annotations

import logging
from typing import Any, Callable, Iterable, Mapping, Sequence, Sized

import numpy as np

from ..errors import InvalidInputError, UsageError
from .samples import EVAL, FIT, Samples, stratified_split

MAX_SAMPLES = 1_000_000  # the recipe's data.max_samples default: most samples read from one dataset
STREAM_MEMORY_LIMIT = 4 << 30  # bytes of samples read from one dataset or calibration source

log = logging.getLogger("edgedeploy")


def is_tf_dataset(obj: Any) -> bool:
    """A ``tf.data.Dataset`` (checked without importing TensorFlow)."""
    return any(c.__module__.startswith("tensorflow") and c.__name__ in ("DatasetV2", "DatasetV1")
               for c in type(obj).__mro__)


class _Reader:
    """Rows of a stream kept up to ``limit`` samples and :data:`STREAM_MEMORY_LIMIT` bytes. A stream of known
    length that passes either is refused (``known``); any other stops there, and :meth:`record` says so."""

    def __init__(self, what: str, limit: int, limit_from: str, known: bool) -> None:
        self.what, self.limit, self.limit_from, self.known = what, int(limit), limit_from, known
        self.count = 0
        self.bytes = 0
        self.stopped: str | None = None

    def take(self, rows: np.ndarray) -> np.ndarray:
        """The part of ``rows`` (one or more samples) to keep: all of it, or what fits under the limits (then
        the stream is left, see :meth:`full`). Bytes are counted as float32, as the samples are kept."""
        room = self.limit - self.count
        per_row = max(rows.dtype.itemsize, 4) * (rows.size // max(1, len(rows)))
        room_bytes = (STREAM_MEMORY_LIMIT - self.bytes) // max(1, per_row)
        if len(rows) > min(room, room_bytes):
            by_count = room <= room_bytes
            if self.known:
                over = (f"more than {self.limit:,} samples ({self.limit_from})" if by_count else
                        f"more than {STREAM_MEMORY_LIMIT / 2**30:g} GiB of samples")
                raise InvalidInputError(f"the {self.what} dataset holds {over}",
                                        f"raise {self.limit_from}, or take a part of it (.take(N))" if by_count
                                        else "take a part of it (.take(N)), or give smaller samples")
            self.stopped = self.limit_from if by_count else f"{STREAM_MEMORY_LIMIT / 2**30:g} GiB of samples"
            rows = rows[:min(room, room_bytes)]
        self.count += len(rows)
        self.bytes += per_row * len(rows)
        return rows

    def full(self) -> bool:
        return self.stopped is not None or self.count >= self.limit

    def more(self) -> None:
        """The stream has a sample past a full reader: refused when its length is known, else noted."""
        if self.known:
            raise InvalidInputError(f"the {self.what} dataset holds more than {self.limit:,} samples "
                                    f"({self.limit_from})", f"raise {self.limit_from}, or take a part of it (.take(N))")
        self.stopped = self.stopped or self.limit_from

    def record(self, length: str) -> dict[str, Any]:
        if self.stopped:
            log.warning("the %s data was read up to %s samples (%s); the rest was not read", self.what,
                        f"{self.count:,}", self.stopped)
        return {"samples": self.count, "length": length, "limit": self.limit, "limit_from": self.limit_from,
                "stopped_at": self.stopped}


def _dataset_arrays(ds: Any, rank: int, batched: bool | None, what: str, limit: int,
                    limit_from: str = "data.max_samples", *, refuse_longer: bool = True
                    ) -> tuple[np.ndarray, np.ndarray | None, dict[str, Any]]:
    """The elements of a finite dataset as numpy arrays ``(x, y)`` (``y`` None for ``x``-only elements), and how
    they were read: up to ``limit`` samples (see :class:`_Reader`; ``refuse_longer`` False: a dataset of known
    length stops there too). A dataset TensorFlow knows to be infinite is refused."""
    from edgedeploy.keras import tfenv

    tf = tfenv.load().tf
    card = int(ds.cardinality())
    if card == int(tf.data.INFINITE_CARDINALITY):
        raise InvalidInputError(f"the {what} dataset repeats forever", "drop .repeat() or add .take(N)")
    known = card != int(tf.data.UNKNOWN_CARDINALITY)
    reader = _Reader(what, limit, limit_from, known and refuse_longer)
    xs: list[np.ndarray] = []
    ys: list[np.ndarray] = []
    has_y = None
    for element in ds.as_numpy_iterator():
        if reader.full():
            reader.more()
            break
        pair = isinstance(element, tuple) and len(element) in (2, 3)  # (x, y) or (x, y, sample_weight)
        x, y = (element[0], element[1]) if pair else (element, None)
        if isinstance(x, (dict, tuple, list)):
            raise UsageError(f"the {what} dataset yields {type(x).__name__} inputs",
                             "yield (x, y) with one input array (the model has one input)")
        x = np.asarray(x)
        if batched is None:
            batched = x.ndim == rank + 1
        has_y = y is not None if has_y is None else has_y
        kept = reader.take(x if batched else x[None])
        xs.append(kept)
        if y is not None:
            y = np.asarray(y)
            ys.append((y if batched else y[None])[:len(kept)])
    if not xs or reader.count == 0:
        raise InvalidInputError(f"the {what} dataset is empty" if not reader.stopped else
                                f"one sample of the {what} dataset is over {reader.stopped}",
                                "give a dataset with samples" if not reader.stopped else "give smaller samples")
    length = f"{card:,} elements" if known else "unknown"
    return np.concatenate(xs), (np.concatenate(ys) if has_y else None), reader.record(length)


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


def _arrays(obj: Any, rank: int, batched: bool | None, what: str, limit: int
            ) -> tuple[np.ndarray, np.ndarray | None, dict[str, Any] | None]:
    if is_tf_dataset(obj):
        return _dataset_arrays(obj, rank, batched, what, limit)
    if isinstance(obj, tuple) and len(obj) == 2:
        return np.asarray(obj[0]), (None if obj[1] is None else np.asarray(obj[1])), None
    name = type(obj).__name__
    raise UsageError(f"the {what} data is {'an' if name[:1].lower() in 'aeiou' else 'a'} {name}, not (x, y) arrays "
                     "or a tf.data.Dataset", "give (x, y) arrays or a tf.data.Dataset")


def from_memory(data: Any, input_rank: int, *, eval_fraction: float, seed: int, batched: bool | None = None,
                labels: Sequence[str] | None = None, max_samples: int = MAX_SAMPLES) -> Samples:
    """``data`` (see the module docstring) as :class:`Samples`; ``input_rank`` is the model input's rank without
    the batch axis (to tell a batched dataset from an unbatched one when ``batched`` is None). A dataset is read
    up to ``max_samples`` (the recipe's ``data.max_samples``); how it was read is in the samples' ``info``."""
    if isinstance(data, Mapping):
        return _from_layout(data, labels)
    pair_of_sets = (isinstance(data, tuple) and len(data) == 2
                    and all(is_tf_dataset(d) or (isinstance(d, tuple) and len(d) == 2) for d in data))
    if pair_of_sets:
        (x_fit, y_fit, read_fit), (x_eval, y_eval, read_eval) = (
            _arrays(d, input_rank, batched, w, max_samples) for d, w in zip(data, ("fine-tune", "evaluation")))
        read = None if read_fit is None and read_eval is None else {"fine-tune": read_fit, "evaluation": read_eval}
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
        x, y, read = _arrays(data, input_rank, batched, "given", max_samples)
        if y is not None and len(y) != len(x):
            raise InvalidInputError(f"{len(x)} samples but {len(y)} targets", "give one target per sample")
        split = _split(len(x), y, eval_fraction, seed)
        how = (f"a seeded {'stratified ' if _strata(y) is not None else ''}choice of {eval_fraction:g}"
               f"{' of each class' if _strata(y) is not None else ''} (seed {seed})")
    source = "tf.data" if is_tf_dataset(data) or (pair_of_sets and is_tf_dataset(data[0])) else "arrays"
    x = np.asarray(x)
    real_numbers(x, "given samples")
    if y is not None:
        real_numbers(np.asarray(y), "given targets")
    return Samples(np.asarray(x, np.float32) if np.issubdtype(x.dtype, np.number) else x,
                   y, split, list(labels) if labels is not None else None,
                   info={"source": source, "split_from": how, "n": int(len(x)), **({"read": read} if read else {})})


def real_numbers(a: np.ndarray, what: str) -> None:
    """Complex values are refused: float32 would keep their real part and drop the rest without a word."""
    if np.iscomplexobj(a):
        raise InvalidInputError(f"the {what} hold {a.dtype} values, not real numbers",
                                "give real values (e.g. np.abs() or the real and imaginary parts as two features)")


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


def calibration_samples(source: Callable[[], Iterable[Any]] | Iterable[Any], rank: int,
                        limit: int = MAX_SAMPLES) -> tuple[np.ndarray, dict[str, Any]]:
    """The samples of a ``representative_dataset``-style function, an iterable or a dataset, as one float32
    array, and how they were read: up to ``limit`` (the recipe's ``data.max_samples``) and
    :data:`STREAM_MEMORY_LIMIT`, so a source that never ends stops there with a warning. All of them are kept:
    the calibration itself takes a seeded random choice of ``calibration_samples`` from them
    (:meth:`edgedeploy.config.data.Dataset.calibration`)."""
    items = source() if callable(source) else source
    if is_tf_dataset(items):
        x, _, read = _dataset_arrays(items, rank, None, "calibration", limit, refuse_longer=False)
        return x.astype(np.float32), read
    reader = _Reader("calibration", limit, "data.max_samples", known=False)
    rows: list[np.ndarray] = []
    for item in items:
        if reader.full():
            reader.more()
            break
        if isinstance(item, (list, tuple)):
            if len(item) != 1:
                raise UsageError(f"the calibration data yields {len(item)} inputs",
                                 "yield [x] (one input array) per item")
            item = item[0]
        a = np.asarray(item)
        real_numbers(a, "calibration samples")
        if not np.issubdtype(a.dtype, np.number) and a.dtype != bool:
            raise UsageError(f"the calibration data yields {a.dtype} values", "yield [x] with a float32 array x")
        a = a.astype(np.float32)
        rows.extend(reader.take(a if a.ndim == rank + 1 else a[None]))
    if not rows:
        raise InvalidInputError("the calibration data yields no samples", "yield [x] for each calibration sample")
    try:
        stacked = np.stack(rows)
    except ValueError:
        raise InvalidInputError(f"the calibration data yields samples of shapes {list(rows[0].shape)} and "
                                f"{next(list(r.shape) for r in rows if r.shape != rows[0].shape)}",
                                "yield samples of one shape") from None
    return stacked, reader.record("unknown" if not isinstance(items, Sized) else f"{len(items):,} items")
