"""Where the data comes from, behind one function: :func:`prepare_data`.

An ``.npz`` file in one of the layouts of :mod:`edgedeploy.config.data` is read as it is. Every other source is turned
into one such file in the run folder (``inputs/data.npz``), which every stage then reads:

- a folder with one subfolder per class, of images (:mod:`.images`) or WAV files (:mod:`.audio`), listed and
  split by :mod:`.folders`;
- arrays, a ``tf.data.Dataset`` or a calibration generator from the Python API (:mod:`.memory`);
- any of these (an ``.npz`` too) run through the user's preprocessing function (:mod:`.preprocess`).

The run's manifest records the source: its kind, the labels and where they come from, how the split was made,
every file with its class, split and sha256, and the preprocessing function with the sha256 of its source.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np

from ..errors import InvalidInputError
from edgedeploy.core.files import lock_run_dir, sha256_file, short
from .samples import EVAL, FIT, Samples, npz_arrays, write_npz

DATA_FILE = Path("inputs") / "data.npz"
EVAL_FRACTION = 0.2


@dataclass(frozen=True)
class DataOptions:
    """How a source becomes samples (the recipe's ``[data]`` table)."""

    preprocess: str | Callable[[np.ndarray], Any] | None = None
    eval_fraction: float = EVAL_FRACTION
    seed: int = 0
    sample_rate: int = 16000
    clip_seconds: float = 1.0
    interpolation: str = "bilinear"
    crop_to_aspect_ratio: bool = False

    @classmethod
    def from_recipe(cls, recipe: Any) -> "DataOptions":
        return cls(preprocess=recipe.preprocess or None, eval_fraction=recipe.eval_fraction, seed=recipe.seed,
                   sample_rate=recipe.sample_rate, clip_seconds=recipe.clip_seconds,
                   interpolation=recipe.interpolation, crop_to_aspect_ratio=recipe.crop_to_aspect_ratio)


@dataclass
class Prepared:
    """Samples made from a source, not yet written: the run checks them against the model first, so that a
    refused source leaves nothing behind and the error names the user's folder or file (``where``)."""

    samples: Samples
    where: str

    def arrays(self) -> dict[str, np.ndarray]:
        """The arrays of the ``.npz`` :meth:`write` writes, as the stages read them back."""
        return npz_arrays(self.samples)

    def write(self, out: Path, *, lock: bool = True) -> tuple[Path, dict[str, Any]]:
        """The samples written to the run folder ``out`` (locked first when ``lock``), and what the manifest
        records about their source."""
        samples = self.samples
        target = Path(out) / DATA_FILE
        if lock:
            lock_run_dir(Path(out))
        write_npz(samples, target)
        record = {**samples.info, "written": DATA_FILE.as_posix(), "labels": samples.labels,
                  "n_fine_tune": int(np.sum(samples.split == FIT)),
                  "n_evaluation": int(np.sum(samples.split == EVAL)),
                  **({"n_calibration": int(len(samples.x_calibration))} if samples.x_calibration is not None else {}),
                  "feature_shape": list(samples.x.shape[1:])}
        return target, record


def gather_data(data: Path | str | Samples, input_shape: Sequence[Any], options: DataOptions) -> Prepared | None:
    """The samples of ``data``, checked but not written (None for an ``.npz`` used as it is). ``input_shape`` is
    the model's input without the batch axis."""
    pre = None
    done = isinstance(data, Samples) and "preprocess" in data.info  # applied already (the Python API)
    if options.preprocess is not None and not done:
        from .preprocess import load_preprocess

        pre = load_preprocess(options.preprocess)
    if isinstance(data, Samples):
        samples = data
    else:
        path = Path(data)
        if path.is_dir():
            samples = _from_folder(path, input_shape, options, pre)
            pre = None  # applied while decoding
        elif pre is None:
            return None
        else:
            samples = _from_npz(path)
    if pre is not None:
        from .preprocess import apply, check_fits

        samples.x = apply(pre, samples.x, samples.files, "given")
        check_fits(pre, samples.x, input_shape)
        if samples.x_calibration is not None:
            samples.x_calibration = apply(pre, samples.x_calibration, None, "calibration")
        samples.info["preprocess"] = pre.record()
    # errors name the user's folder or file; samples made from one in Python keep its name in their info
    where = str(data) if not isinstance(data, Samples) else str(data.info.get("folder") or "the given data")
    samples.check(where)
    return Prepared(samples, where)


def prepare_data(data: Path | str | Samples, input_shape: Sequence[Any], out: Path, options: DataOptions, *,
                 lock: bool = True) -> tuple[Path, dict[str, Any] | None]:
    """The ``.npz`` the stages read for ``data``, and what the manifest records about its source (None for an
    ``.npz`` used as it is): :func:`gather_data`, then written to the run folder ``out``, locked (``lock``)
    before the file is written, as every stage of the run locks it."""
    prepared = gather_data(data, input_shape, options)
    if prepared is None:  # an .npz used as it is (samples in memory are always prepared)
        assert not isinstance(data, Samples)
        return Path(data), None
    return prepared.write(out, lock=lock)


def _from_folder(root: Path, input_shape: Sequence[Any], options: DataOptions, pre: Any) -> Samples:
    from .folders import list_folder

    listing = list_folder(root, options.eval_fraction, options.seed)
    info: dict[str, Any] = {"source": "folder", **listing.describe()}
    raw: Sequence[np.ndarray] | np.ndarray  # images of their own shapes, or clips of one length
    if listing.kind == "image":
        from .images import INTERPOLATIONS, JPEG_DCT, decode_images, image_geometry

        if options.interpolation not in INTERPOLATIONS:
            raise InvalidInputError(f"interpolation '{options.interpolation}' is not one of Keras' resize methods",
                                    f"use one of {', '.join(INTERPOLATIONS)}")
        size, channels = image_geometry(input_shape)
        if size is None and pre is None:
            raise InvalidInputError(f"data folder {root} holds images but the model's input is "
                                    f"{list(input_shape)}, not [height, width, channels]",
                                    "give a preprocessing function (--preprocess module:function) that makes the "
                                    "model's input from an image")
        raw, digests = decode_images(root, listing.files, size, channels, options.interpolation,
                                     options.crop_to_aspect_ratio)
        info["decoding"] = {"decoder": "tf.io.decode_image", "jpeg_dct_method": JPEG_DCT, "channels": channels,
                            "resize": None if size is None else {
                                "size": list(size), "interpolation": options.interpolation,
                                "crop_to_aspect_ratio": options.crop_to_aspect_ratio,
                                "by": "tf_keras smart_resize" if options.crop_to_aspect_ratio else "tf.image.resize"}}
    else:
        from .audio import decode_wavs

        raw, digests, rates = decode_wavs(root, listing.files, options.sample_rate, options.clip_seconds)
        info["decoding"] = {"decoder": "scipy.io.wavfile", "sample_rate": options.sample_rate,
                            "clip_seconds": options.clip_seconds, "file_sample_rates": sorted(set(rates)),
                            "resampler": "scipy.signal.resample_poly", "mono": "channels averaged"}
    names = [f"{root / f}" for f in listing.files]
    if pre is not None:
        from .preprocess import apply, check_fits

        x = apply(pre, raw, names, "folder")
        check_fits(pre, x, input_shape)
        info["preprocess"] = pre.record()
    else:
        x = _stack(raw, names)
    info["files"] = [{"file": f, "class": listing.labels[int(c)], "split": "fine-tune" if s == FIT else "evaluation",
                      "sha256": d} for f, c, s, d in zip(listing.files, listing.y, listing.split, digests)]
    return Samples(x, listing.y, listing.split, listing.labels, listing.files, info=info)


def _stack(raw: Sequence[np.ndarray] | np.ndarray, names: Sequence[str]) -> np.ndarray:
    first = np.shape(raw[0])
    for a, name in zip(raw, names):
        if np.shape(a) != first:
            raise InvalidInputError(f"{short(name)} decodes to {list(np.shape(a))}, the first file to {list(first)}",
                                    "give files of one size, or a preprocessing function that makes them so")
    return np.stack(list(raw)).astype(np.float32)


def _from_npz(path: Path) -> Samples:
    """An ``.npz`` (either layout of :mod:`edgedeploy.config.data`) as samples, to run through a preprocessing function."""
    from edgedeploy.core.npz import read_npz
    from .memory import _from_layout

    arrays = read_npz(path, "data file", "data")
    samples = _from_layout(arrays, None)
    if "files" in arrays and len(arrays["files"]) == len(samples.x):
        samples.files = [str(f) for f in arrays["files"].tolist()]
    if "x_calibration" in arrays:
        samples.x_calibration = arrays["x_calibration"]
    samples.info = {"source": "npz", "path": str(path.resolve()), "sha256": sha256_file(path),
                    "split_from": "the file's split"}
    return samples


__all__ = ["DATA_FILE", "DataOptions", "Prepared", "Samples", "gather_data", "prepare_data"]
