"""What every data source gives: samples with their split, labels and origin, written as one ``.npz``.

A class folder of images or WAV files, arrays in memory, a ``tf.data`` pipeline or an ``.npz`` run through a
preprocessing function all end as a :class:`Samples`, written by :func:`write_npz` in the ``x``/``y``/``split``
layout of :mod:`edgedeploy.config.data` (with ``labels``, ``files`` and, when given apart, ``x_calibration``). Every
stage (fine-tuning, calibration, evaluation, golden vectors) then reads that one file, so each sees the same
features.
"""

from __future__ import annotations

import io
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import InvalidInputError
from edgedeploy.core.files import atomic_write_bytes

FIT, EVAL = 0, 1


@dataclass
class Samples:
    x: np.ndarray  # float32, one row per sample
    y: np.ndarray | None  # class indices (int64) or target values; None: the model reconstructs its input
    split: np.ndarray  # 0 fine-tune/calibrate, 1 evaluate (int8)
    labels: list[str] | None = None  # class names in index order
    files: list[str] | None = None  # where each sample comes from (relative path), when it has a file
    x_calibration: np.ndarray | None = None  # calibration samples given apart from the fine-tune split
    info: dict[str, Any] = field(default_factory=dict)  # what the manifest records about the source

    def check(self, where: str) -> None:
        """Lengths agree, both splits have samples and every feature is a finite number."""
        n = len(self.x)
        for name, a in (("samples", self.x), ("calibration samples", self.x_calibration)):
            if a is not None and (not np.issubdtype(np.asarray(a).dtype, np.number) or np.iscomplexobj(a)):
                raise InvalidInputError(f"{where}: the {name} hold {np.asarray(a).dtype} values, not real numbers",
                                        "give float32 (or integer) arrays")
        if self.split.shape != (n,) or (self.y is not None and len(self.y) != n):
            raise InvalidInputError(f"{where}: {n} samples but {len(self.split)} split values"
                                    + ("" if self.y is None else f" and {len(self.y)} targets"),
                                    "give one target per sample")
        for value, name in ((FIT, "fine-tune"), (EVAL, "evaluation")):
            if not np.any(self.split == value):
                raise InvalidInputError(f"{where}: the {name} split is empty",
                                        "give samples to both splits (or a smaller evaluation fraction)")
        for name, a in (("samples", self.x), ("calibration samples", self.x_calibration)):
            if a is not None and not np.isfinite(a).all():
                raise InvalidInputError(f"{where}: the {name} hold NaN or infinite values",
                                        "replace or drop those samples (or fix the preprocessing function)")


def npz_arrays(samples: Samples) -> dict[str, np.ndarray]:
    """The arrays :func:`write_npz` writes for ``samples``, as the stages read them back."""
    arrays: dict[str, Any] = {"x": np.ascontiguousarray(samples.x, dtype=np.float32),
                              "split": samples.split.astype(np.int8)}
    if samples.y is not None:
        arrays["y"] = np.asarray(samples.y)
    if samples.labels is not None:
        arrays["labels"] = np.asarray(samples.labels, dtype=str)
    if samples.files is not None:
        arrays["files"] = np.asarray(samples.files, dtype=str)
    if samples.x_calibration is not None:
        arrays["x_calibration"] = np.ascontiguousarray(samples.x_calibration, dtype=np.float32)
    return arrays


def write_npz(samples: Samples, path: Path) -> Path:
    """``samples`` as an ``.npz`` at ``path`` (written atomically; the same samples give the same bytes, so a
    re-run reuses the stages that read it)."""
    buf = io.BytesIO()
    arrays: dict[str, Any] = npz_arrays(samples)  # (a mapping of arrays; Any, as savez's allow_pickle shares **)
    np.savez(buf, **arrays)
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_bytes(path, buf.getvalue())
    return path


def stratified_split(y: np.ndarray, fraction: float, seed: int) -> np.ndarray:
    """0/1 per sample: a seeded choice of ``fraction`` of each class for evaluation (at least one sample of a
    class with two or more, never all of them)."""
    split = np.zeros(len(y), dtype=np.int8)
    rng = np.random.default_rng(seed)
    for cls in np.unique(y):
        idx = np.flatnonzero(y == cls)
        if len(idx) < 2:
            continue
        n_eval = min(len(idx) - 1, max(1, int(round(fraction * len(idx)))))
        split[np.sort(rng.choice(idx, n_eval, replace=False))] = EVAL
    return split
