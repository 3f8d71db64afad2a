"""The one module that imports TensorFlow, tf_keras and TFMOT.

TFMOT works only with Keras 2 (``tf_keras``); ``TF_USE_LEGACY_KERAS=1`` must be
set before TensorFlow is first imported, or ``tf.keras`` stays Keras 3 and
TFMOT rejects the model. Everything else gets TensorFlow from here.
"""

from __future__ import annotations

import collections
import contextlib
import importlib.abc
import logging
import os
import sys
import warnings
from functools import lru_cache
from importlib.metadata import PackageNotFoundError, version
from types import SimpleNamespace

from edgedeploy.errors import InvalidInputError, ToolMissingError

EXPECTED = {"tensorflow": "2.21.0", "tf-keras": "2.21.0", "tensorflow-model-optimization": "0.8.1"}


@lru_cache(maxsize=1)
def load() -> SimpleNamespace:
    """Import TF, tf_keras and TFMOT once, configured for Keras 2, and check their versions."""
    if "tensorflow" in sys.modules and os.environ.get("TF_USE_LEGACY_KERAS") != "1":
        import tensorflow as tf_already

        if not tf_already.keras.__version__.startswith("2."):
            raise InvalidInputError(
                "TensorFlow was imported before edgedeploy with Keras 3 as tf.keras",
                "set TF_USE_LEGACY_KERAS=1 before importing TensorFlow, or import edgedeploy first",
            )
    os.environ["TF_USE_LEGACY_KERAS"] = "1"
    collect_less_often()  # before the import: importing TensorFlow allocates many of the long-lived objects
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    warnings.filterwarnings("ignore", category=DeprecationWarning, module="tensorflow_model_optimization")
    warnings.filterwarnings("ignore", message=".*saving your model as an HDF5 file.*")
    try:
        with quiet_native_stderr():
            import tensorflow as tf
            import tf_keras

            with keras3_probe_fails_fast():
                import tensorflow_model_optimization as tfmot
    except ImportError as exc:
        raise ToolMissingError(
            f"TensorFlow stack is not installed ({exc.name})",
            "pip install tensorflow==2.21.0 tf-keras==2.21.0 tensorflow-model-optimization==0.8.1",
        ) from exc
    tf.get_logger().setLevel("ERROR")
    return SimpleNamespace(tf=tf, keras=tf_keras, tfmot=tfmot, versions=versions())


# Importing TensorFlow and building, tracing and converting Keras models allocate millions of objects that live
# on, which Python's default collector (a young-generation pass every 700 allocations) rescans again and again.
# Higher thresholds save processor time for some more peak memory, with the same results (docs/python-api.md).
GC_THRESHOLD = (50_000, 20, 20)


def collect_less_often() -> None:
    """Raise the cyclic garbage collector's thresholds to :data:`GC_THRESHOLD` for the TensorFlow work of this
    process; a process that switched the collector off or set higher thresholds keeps its own."""
    import gc

    if gc.isenabled() and gc.get_threshold()[0] < GC_THRESHOLD[0]:
        gc.set_threshold(*GC_THRESHOLD)


class _NoKeras3(importlib.abc.MetaPathFinder):
    """Reports the Keras 3 package (``keras``) as missing."""

    def find_spec(self, name, path=None, target=None):
        if name == "keras":
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None


@contextlib.contextmanager
def keras3_probe_fails_fast():
    """While TFMOT imports, make its probe for Keras 2.13's ``keras.src.engine`` fail at once.

    TFMOT 0.8.1 (``sparsity/keras/prune_registry.py``) tries ``from keras.src.engine import base_layer``. With
    Keras 3 installed beside tf_keras (TensorFlow 2.21 requires it), that imports all of Keras 3, matplotlib
    included, only to fail, and TFMOT falls back to no base layer. Reported missing, ``keras`` fails the same
    way without being imported: the same fallback, and :func:`load` takes less time (docs/results/startup.md).
    A process that imported Keras 3 already keeps it; TFMOT's probe then fails as it always did."""
    if "keras" in sys.modules:
        yield
        return
    finder = _NoKeras3()
    sys.meta_path.insert(0, finder)
    try:
        yield
    finally:
        sys.meta_path.remove(finder)


@contextlib.contextmanager
def quiet_native_stderr():
    """Hide the C++ start-up chatter TensorFlow writes straight to fd 2 (absl, CUDA probing) while importing.

    Python exceptions still propagate; ``-vv`` (debug logging) or ``EDGEDEPLOY_TF_LOGS=1`` shows everything.
    """
    if os.environ.get("EDGEDEPLOY_TF_LOGS") == "1" or logging.getLogger("edgedeploy").isEnabledFor(logging.DEBUG):
        yield
        return
    sys.stderr.flush()
    saved = os.dup(2)
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 2)
    try:
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(devnull)


XNNPACK_NOTICE = b"INFO: Created TensorFlow Lite XNNPACK delegate for CPU."


@contextlib.contextmanager
def without_xnnpack_notice():
    """Drop the one line TFLite writes straight to fd 2 the first time it applies its XNNPACK delegate; whatever
    else reaches fd 2 meanwhile (a real error) is passed on when the block ends. ``-vv`` or
    ``EDGEDEPLOY_TF_LOGS=1`` keeps the line."""
    if os.environ.get("EDGEDEPLOY_TF_LOGS") == "1" or logging.getLogger("edgedeploy").isEnabledFor(logging.DEBUG):
        yield
        return
    import tempfile

    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as caught:
        os.dup2(caught.fileno(), 2)
        try:
            yield
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            caught.seek(0)
            rest = b"".join(line for line in caught.read().splitlines(keepends=True)
                            if line.rstrip(b"\r\n") != XNNPACK_NOTICE)
            while rest:
                rest = rest[os.write(2, rest):]


def versions() -> dict[str, str]:
    found = {}
    for name in EXPECTED:
        try:
            found[name] = version(name)
        except PackageNotFoundError:
            found[name] = "missing"
    return found


def restart_layer_names() -> None:
    """Count Keras's automatic layer names (``conv2d``, ``conv2d_1``, ...) from the start again."""
    load().keras.backend.reset_uids()


@contextlib.contextmanager
def caller_layer_names():
    """Put the process's counts of Keras's automatic layer names back as they were when the block ends.

    Stages count names from the start (:func:`restart_layer_names`); a tree run in a user's Python session (the API,
    a notebook) would otherwise leave the session's next ``Dense()`` named like one it already has. tf_keras keeps
    the counts in ``tf_keras.src.backend``; without them (another tf_keras) the block changes nothing.
    """
    backend = sys.modules.get("tf_keras.src.backend")
    uids, observed = getattr(backend, "PER_GRAPH_OBJECT_NAME_UIDS", None), getattr(backend, "OBSERVED_NAMES", None)
    if uids is None or observed is None:
        yield
        return
    saved = {graph: dict(counts) for graph, counts in uids.items()}
    seen = set(observed)
    try:
        yield
    finally:
        uids.clear()
        for graph, counts in saved.items():
            uids[graph] = collections.defaultdict(int, counts)
        observed.clear()
        observed.update(seen)


def set_seed(seed: int) -> None:
    """Seed Python, NumPy and TensorFlow, and ask TF for deterministic kernels."""
    import random

    import numpy as np

    env = load()
    random.seed(seed)
    np.random.seed(seed)
    env.tf.random.set_seed(seed)
    env.keras.utils.set_random_seed(seed)
    try:
        env.tf.config.experimental.enable_op_determinism()
    except Exception:  # not available on every build; results are then seeded but not bit-exact
        pass
