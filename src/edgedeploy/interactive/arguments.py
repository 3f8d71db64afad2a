"""The Python API's arguments checked where they arrive: a path that is not one (None, a number, a dict, a model
object where a file is read) is one :class:`edgedeploy.errors.UsageError` naming the argument and what it takes,
never Python's ``TypeError`` from deep inside. Imports nothing heavy: :mod:`edgedeploy.api` imports it.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from edgedeploy.errors import UsageError

MODEL_FILE = "the path of a .h5 or .keras file"
DATA_FILE = "the path of an .npz file or a data folder"


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


def _kind(value: Any) -> str:
    """What a value is, in words: None, an int, a dict."""
    if value is None:
        return "None"
    name = type(value).__name__
    return f"{'an' if name[:1].lower() in 'aeiou' else 'a'} {name}"
