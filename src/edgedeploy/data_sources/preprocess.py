"""The user's preprocessing function (a feature front end such as MFCC), loaded only when asked for.

``--preprocess module:function`` (or the recipe key ``data.preprocess``) names it: ``package.module:function`` is
imported from the Python path, ``path/to/file.py:function`` is read from that file. It is code, so nothing is
imported unless the user names it. It takes one sample (an image as float32 ``[H, W, C]`` with values 0-255, a
clip as a float32 waveform in [-1, 1] at the recipe's sample rate, or a row of an ``.npz``) and returns that
sample's features. :func:`apply` runs it over every sample once, before fine-tuning, calibration, evaluation and
golden vectors read them, so all of them see the same features. The manifest records the reference and the
sha256 of the source that ran.

While the user's code runs (its module loading, each call), what it prints goes to stderr, so stdout carries
only what the command prints (``--json``'s document); and whatever it raises, ``SystemExit`` and a
``KeyboardInterrupt`` of its own included, is one :class:`~edgedeploy.errors.UsageError` naming the function and
the sample. A ``KeyboardInterrupt`` from a signal (Ctrl-C, SIGTERM) while it runs stays an interrupt.
"""

from __future__ import annotations

import hashlib
import importlib
import inspect
import types
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np

from ..errors import InvalidInputError, UsageError
from edgedeploy.core.files import read_input_bytes, short
from edgedeploy.core.user_code import ended_by, reraise_interrupt, tried_to_end, user_code

SOURCE_LIMIT = 16 << 20


@dataclass(frozen=True)
class Preprocess:
    fn: Callable[[np.ndarray], Any]
    ref: str  # as the user named it
    source: str | None  # the file its code came from
    sha256: str  # of that file's bytes (or of the function's source text, for a function given in Python)

    def record(self) -> dict[str, Any]:
        return {"ref": self.ref, "source": self.source, "sha256": self.sha256}


def load_preprocess(ref: str | Callable[[np.ndarray], Any]) -> Preprocess:
    """The function ``ref`` names (``module:function`` or ``file.py:function``), or a Python callable as given."""
    if callable(ref):
        return _from_callable(ref)
    module_name, _, name = str(ref).rpartition(":")
    if not module_name or not name:
        raise UsageError(f"preprocess '{ref}' is not module:function", "e.g. --preprocess frontend:mfcc or "
                         "--preprocess path/to/frontend.py:mfcc")
    if module_name.endswith(".py"):
        path = Path(module_name)
        code = read_input_bytes(path, "preprocessing module", SOURCE_LIMIT)
        module = types.ModuleType(f"edgedeploy_preprocess_{hashlib.sha256(code).hexdigest()[:12]}")
        module.__file__ = str(path.resolve())
        with user_code() as signalled:
            try:
                exec(compile(code, str(path), "exec"), module.__dict__)  # noqa: S102 - the user asked for this code
            except BaseException as exc:  # the user's own code: one line naming it
                reraise_interrupt(exc, signalled)
                raise UsageError(f"preprocess '{ref}' cannot be loaded ({ended_by(exc)})", _LOAD_HINT) from None
        source, digest = str(path.resolve()), hashlib.sha256(code).hexdigest()
    else:
        with user_code() as signalled:
            try:
                module = importlib.import_module(module_name)
            except ImportError as exc:
                raise UsageError(f"preprocess '{ref}' cannot be loaded ({exc})",
                                 "put the module on PYTHONPATH, or name its file: path/to/module.py:function"
                                 ) from None
            except BaseException as exc:
                reraise_interrupt(exc, signalled)
                raise UsageError(f"preprocess '{ref}' cannot be loaded ({ended_by(exc)})", _LOAD_HINT) from None
        file = getattr(module, "__file__", None)
        if not file:
            raise UsageError(f"preprocess '{ref}': module {module_name} has no source file to record",
                             "name a module with a .py file")
        source, digest = str(Path(file).resolve()), hashlib.sha256(read_input_bytes(file, "preprocessing module",
                                                                                     SOURCE_LIMIT)).hexdigest()
    fn = getattr(module, name, None)
    if not callable(fn):
        raise UsageError(f"preprocess '{ref}': {module_name} has no function {name}",
                         "name a function(sample) -> features")
    return Preprocess(fn, str(ref), source, digest)


def _from_callable(fn: Callable[[np.ndarray], Any]) -> Preprocess:
    name = f"{getattr(fn, '__module__', '?')}:{getattr(fn, '__qualname__', type(fn).__name__)}"
    try:
        text = inspect.getsource(fn)
        source = inspect.getsourcefile(fn)
    except (OSError, TypeError):
        text, source = repr(fn), None
    return Preprocess(fn, name, source, hashlib.sha256(text.encode("utf-8")).hexdigest())


def apply(pre: Preprocess, x: Sequence[np.ndarray] | np.ndarray, names: Sequence[str] | None, what: str) -> np.ndarray:
    """``pre`` on each sample of ``x``, stacked as float32; a failing call or an odd result names the sample."""
    out: list[np.ndarray] = []
    shape = None
    with user_code() as signalled:
        for i, sample in enumerate(x):
            where = names[i] if names is not None else f"{what} sample {i}"
            try:
                got = np.asarray(pre.fn(np.asarray(sample, dtype=np.float32)))
            except BaseException as exc:  # the user's own code: its failure is one line naming it and the sample
                reraise_interrupt(exc, signalled)
                ended = tried_to_end(exc)
                raise UsageError(f"preprocess {_named(pre)} {'tried to end the command' if ended else 'failed'} "
                                 f"on {where} ({ended_by(exc)})", _ENDED_HINT if ended else
                                 "fix the function: it takes one sample and returns its features") from None
            got = _checked(pre, _real(pre, got, where), where, shape)
            shape = got.shape
            out.append(got)
    if not out:
        return np.zeros((0,), np.float32)
    return np.stack(out)


def check_fits(pre: Preprocess, x: np.ndarray, input_shape: Sequence[Any]) -> None:
    """Features that cannot take the model's input shape (by adding or dropping size-1 axes) are the function's
    doing: refused naming it, not the data it was given."""
    if len(x) == 0 or any(not isinstance(d, (int, np.integer)) for d in input_shape):
        return
    squeeze = lambda s: tuple(int(d) for d in s if d != 1)  # noqa: E731
    if squeeze(x.shape[1:]) != squeeze(input_shape):
        raise InvalidInputError(f"preprocess {_named(pre)} returned features of shape {list(x.shape[1:])} but the "
                                f"model's input is {[int(d) for d in input_shape]}",
                                "return one sample's features shaped like the model's input (without the batch axis)")


def _real(pre: Preprocess, got: np.ndarray, where: str) -> np.ndarray:
    """One sample's features as float32, refusing complex values (float32 would drop the imaginary part)."""
    if np.iscomplexobj(got):
        raise InvalidInputError(f"preprocess '{pre.ref}' returned {got.dtype} values for {where}, not real "
                                "numbers", "return real features (e.g. np.abs() of a spectrum)")
    if not (np.issubdtype(got.dtype, np.number) or got.dtype == bool):
        raise InvalidInputError(f"preprocess '{pre.ref}' returned {got.dtype} values for {where}, not numbers",
                                "return an array of real features")
    return got.astype(np.float32)


def _checked(pre: Preprocess, got: np.ndarray, where: str, shape: tuple[int, ...] | None) -> np.ndarray:
    """One sample's features: of the shape of the samples before it (``shape``), and finite."""
    if shape is not None and got.shape != shape:
        raise InvalidInputError(f"preprocess '{pre.ref}' returned shape {list(got.shape)} for {where} but "
                                f"{list(shape)} before", "return features of one shape for every sample")
    if not np.isfinite(got).all():
        raise InvalidInputError(f"preprocess '{pre.ref}' returned NaN or infinite values for {where}",
                                "fix the function (e.g. add a small floor before a logarithm)")
    return got


_LOAD_HINT = "fix the module: loading it must define the function, not print, exit or raise"
_ENDED_HINT = ("a preprocessing function returns the sample's features; it must not call sys.exit() or raise "
               "SystemExit or KeyboardInterrupt")


def _named(pre: Preprocess) -> str:
    """The function as the user named it, and for one given in Python its source file."""
    shown = f"'{pre.ref}'"
    if pre.source and not pre.ref.split(":", 1)[0].endswith(".py"):
        shown += f" (in {short(pre.source)})"
    return shown
