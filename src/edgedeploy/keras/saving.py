"""Saving a Keras model (or its weights) as HDF5 only where the disk has room for it.

HDF5 does not survive a full disk: h5py's writes fail, and the process can end in a segmentation fault while
h5py frees the half-written file, before any error reaches Python. So the room is checked first, against the
weights' bytes plus a margin (:func:`saved_bytes_bound`), and a disk without it is a
:class:`~edgedeploy.errors.DiskFullError` naming the file, before h5py touches the disk.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from edgedeploy.core.nospace import ensure_room

SAVE_MARGIN = 1 << 20  # bytes beyond the weights' own that a save needs free (the model's configuration) ...
WEIGHT_MARGIN = 16 << 10  # ... and per weight array (HDF5's own structure: the DS-CNN's 2 KiB each, eight-fold)


def saved_bytes_bound(model: Any) -> int:
    """An upper bound on the bytes of ``model`` saved as HDF5: its weights' bytes, :data:`WEIGHT_MARGIN` per weight
    array and :data:`SAVE_MARGIN`."""
    total = SAVE_MARGIN
    for w in model.weights:
        total += math.prod(int(d or 1) for d in w.shape) * _itemsize(w.dtype) + WEIGHT_MARGIN
    return total


def _itemsize(dtype: Any) -> int:
    """Bytes per element of a weight's dtype: a TensorFlow ``DType``, or the name Keras 3 gives it."""
    size = getattr(dtype, "size", None)
    if isinstance(size, int):
        return size
    import numpy as np

    try:
        return np.dtype(str(dtype)).itemsize
    except TypeError:
        return 8  # a dtype numpy does not name: counted at the widest


def save_model_h5(model: Any, path: Path) -> None:
    """``model.save(path)`` (HDF5, without the optimizer), once the disk has room for it."""
    ensure_room(path, saved_bytes_bound(model))
    model.save(path, include_optimizer=False)


def save_weights_h5(model: Any, path: Path) -> None:
    """``model.save_weights(path)`` (HDF5), once the disk has room for it."""
    ensure_room(path, saved_bytes_bound(model))
    model.save_weights(path)
