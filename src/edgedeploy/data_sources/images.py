"""Images decoded and resized as Keras' ``image_dataset_from_directory`` does it.

``tf.io.decode_image`` (JPEG, PNG, BMP, first frame of a GIF) with the model's channel count (JPEG with the
accurate inverse DCT, see :data:`JPEG_DCT`), then
``tf.image.resize`` with the chosen interpolation, or tf_keras' ``smart_resize`` (centre crop to the target's
aspect ratio first) when ``crop_to_aspect_ratio`` is set: the same two options and the same operations as that
Keras utility, so a model trained on its pipeline sees the same pixels (float32, 0-255). The size an image's header
declares is bounded before it is decoded (:mod:`.image_header`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

import numpy as np

from ..errors import InvalidInputError
from edgedeploy.core.files import read_input_bytes, sha256_bytes, short
from .image_header import check_image_size

INTERPOLATIONS = ("bilinear", "nearest", "bicubic", "area", "lanczos3", "lanczos5", "gaussian", "mitchellcubic")
SAMPLE_LIMIT = 256 << 20  # one image or WAV file
# JPEG's inverse DCT: libjpeg's accurate integer method, as Pillow and libjpeg itself decode by default (TF's
# default, a faster approximation, gives other pixels)
JPEG_DCT = "INTEGER_ACCURATE"


def image_geometry(input_shape: Sequence[int]) -> tuple[tuple[int, int] | None, int]:
    """(height, width) to resize to and the channel count, from a model input ``[H, W, C]`` (C 1, 3 or 4);
    (None, 3) for other inputs (images then keep their size, for a preprocessing function to shape)."""
    shape = tuple(input_shape)
    if len(shape) == 3 and None not in shape and shape[2] in (1, 3, 4):
        return (int(shape[0]), int(shape[1])), int(shape[2])
    return None, 3


def decode_images(root: Path, files: Sequence[str], size: tuple[int, int] | None, channels: int,
                  interpolation: str = "bilinear", crop_to_aspect_ratio: bool = False
                  ) -> tuple[list[np.ndarray], list[str]]:
    """Every file of ``files`` (relative to ``root``) as float32 ``[H, W, C]``, and each file's sha256."""
    from edgedeploy.keras import tfenv

    env = tfenv.load()
    tf = env.tf
    images, digests = [], []
    for rel in files:
        path = root / rel
        data = read_input_bytes(path, "image", SAMPLE_LIMIT)
        check_image_size(data, str(path))
        try:
            if channels in (1, 3) and bool(tf.io.is_jpeg(data)):
                img = tf.io.decode_jpeg(data, channels=channels, dct_method=JPEG_DCT)
            else:
                img = tf.io.decode_image(data, channels=channels, expand_animations=False)
        except Exception as exc:  # TF's decoders raise InvalidArgumentError (and others) with a long message
            why = str(getattr(exc, "message", exc)).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise InvalidInputError(f"{short(str(path))}: cannot be decoded as an image ({short(why, 120)})",
                                    "replace or remove the file") from None
        if size is not None:
            if crop_to_aspect_ratio:
                img = env.keras.preprocessing.image.smart_resize(img, size, interpolation=interpolation)
            else:
                img = tf.image.resize(img, size, method=interpolation)
        images.append(np.asarray(img, dtype=np.float32))
        digests.append(sha256_bytes(data))
    return images, digests
