"""The Python API's arguments checked where they arrive: a path that is not one (None, a number, a dict, a model
object where a file is read) is one :class:`edgedeploy.errors.UsageError` naming the argument and what it takes,
never Python's ``TypeError`` from deep inside. Imports nothing heavy: :mod:`edgedeploy.api` imports it.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Mapping

from edgedeploy.errors import UsageError

MODEL_FILE = "the path of a .h5 or .keras file"
DATA_FILE = "the path of an .npz file or a data folder"
DATA = ("(x, y) arrays, ((x_train, y_train), (x_test, y_test)), a dict of .npz arrays, a tf.data.Dataset, "
        "or the path of an .npz file or a data folder")
CALIBRATION = "a representative_dataset-style function, an iterable of input arrays or a tf.data.Dataset"


def as_path(value: Any, what: str, takes: str, hint: str | None = None) -> Path:
    """The argument ``what`` as a path; anything else (None, a number, a dict, a model object where a file is
    read) is a :class:`edgedeploy.errors.UsageError` naming the argument and what it takes, not Python's
    ``TypeError`` from deep inside."""
    if isinstance(value, (str, os.PathLike)):
        try:
            return Path(value)
        except TypeError:  # (a PathLike whose __fspath__ gives neither str nor bytes)
            pass
    raise UsageError(f"{what} is {_kind(value)}, not {takes}", hint or f"pass {takes} as a str or pathlib.Path")


def as_paths(values: Any, what: str, takes: str) -> list[Path]:
    """Paths given as a list (one path alone is taken as a list of one)."""
    if isinstance(values, (str, os.PathLike)):
        return [as_path(values, what, takes)]
    if not isinstance(values, (list, tuple)):
        return [as_path(values, what, f"a list of paths (each {takes})")]  # (raises, naming the argument)
    return [as_path(v, f"{what}[{i}]", takes) for i, v in enumerate(values)]


def target_names(targets: Any) -> list[str]:
    """Target names or files as a list of strings (one alone is a list of one)."""
    if isinstance(targets, (str, os.PathLike)):
        return [os.fspath(targets)]
    if not isinstance(targets, (list, tuple)):
        raise UsageError(f"targets is {_kind(targets)}, not a list of target names or files",
                         'pass e.g. ["ethos-u55-128"]')
    return [os.fspath(as_path(t, f"targets[{i}]", "a target name or file")) for i, t in enumerate(targets)]


def as_text(value: Any, what: str, takes: str, example: str) -> str:
    """The argument ``what`` as a string (a leaf or target name); anything else is a UsageError naming it."""
    if isinstance(value, (str, os.PathLike)):
        return os.fspath(as_path(value, what, takes))
    raise UsageError(f"{what} is {_kind(value)}, not {takes}", f"pass e.g. {example}")


def as_names(values: Any, what: str, example: str) -> list[str]:
    """A list of names (leaves); one name alone is a list of one."""
    if isinstance(values, str):
        return [values]
    if not isinstance(values, (list, tuple)):
        raise UsageError(f"{what} is {_kind(values)}, not a list of names", f"pass e.g. {example}")
    return [as_text(v, f"{what}[{i}]", "a name", example) for i, v in enumerate(values)]


def as_count(value: Any, what: str, takes: str) -> int:
    """The argument ``what`` as a whole number (``bool`` is not one); its range is checked where it is used."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise UsageError(f"{what} is {_kind(value)}, not {takes}", f"pass {takes}")
    return value


def check_data_arguments(data: Any, calibration: Any = None, preprocess: Any = None, labels: Any = None,
                         batched: Any = None) -> None:
    """The data arguments of :func:`edgedeploy.optimize` checked before anything is imported or written: each one
    of another kind is a :class:`edgedeploy.errors.UsageError` naming the argument and what it takes."""
    if isinstance(data, (str, os.PathLike)):
        as_path(data, "data", DATA_FILE)
    elif not (isinstance(data, Mapping) or is_dataset(data) or (isinstance(data, tuple) and len(data) == 2)):
        kind = f"a tuple of {len(data)}" if isinstance(data, tuple) else _kind(data)
        raise UsageError(f"data is {kind}, not {DATA}", "pass e.g. (x, y) numpy arrays or the path of an .npz file")
    if calibration is not None and (isinstance(calibration, (str, bytes, Mapping)) or not (
            callable(calibration) or hasattr(calibration, "__iter__"))):
        raise UsageError(f"calibration is {_kind(calibration)}, not {CALIBRATION}",
                         "pass e.g. a function yielding [x] for each calibration sample")
    if preprocess is not None and not (isinstance(preprocess, str) or callable(preprocess)):
        raise UsageError(f"preprocess is {_kind(preprocess)}, not a function or its module:function name",
                         "pass a function(sample) -> features, or e.g. \"frontend.py:mfcc\"")
    if labels is not None and (isinstance(labels, (str, bytes, Mapping)) or not hasattr(labels, "__iter__")):
        raise UsageError(f"labels is {_kind(labels)}, not a list of class names", 'pass e.g. ["yes", "no"]')
    if batched is not None and not isinstance(batched, bool):
        raise UsageError(f"batched is {_kind(batched)}, not True, False or None",
                         "pass batched=True when the dataset yields batches")


def is_dataset(obj: Any) -> bool:
    """A ``tf.data.Dataset`` (checked without importing TensorFlow)."""
    return any(c.__module__.startswith("tensorflow") and c.__name__ in ("DatasetV2", "DatasetV1")
               for c in type(obj).__mro__)


def _kind(value: Any) -> str:
    """What a value is, in words: None, an int, a dict."""
    if value is None:
        return "None"
    name = type(value).__name__
    return f"{'an' if name[:1].lower() in 'aeiou' else 'a'} {name}"
