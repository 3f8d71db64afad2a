"""WAV files decoded with SciPy (``scipy.io.wavfile``), mixed to mono and resampled with a polyphase filter
(``scipy.signal.resample_poly``) to the recipe's sample rate, then cut or zero-padded at the end to the clip
length: float32 waveforms in [-1, 1], one row per file."""

from __future__ import annotations

import io
import math
from pathlib import Path
from typing import Sequence

import numpy as np

from ..errors import InvalidInputError
from edgedeploy.core.files import read_input_bytes, sha256_bytes, short
from .images import SAMPLE_LIMIT


def to_float(data: np.ndarray) -> np.ndarray:
    """PCM samples as float32 in [-1, 1] (8-bit WAV is unsigned, the others signed)."""
    if data.dtype == np.uint8:
        return (data.astype(np.float32) - 128.0) / 128.0
    if np.issubdtype(data.dtype, np.integer):
        return data.astype(np.float32) / float(2 ** (8 * data.dtype.itemsize - 1))
    return data.astype(np.float32)


def decode_wavs(root: Path, files: Sequence[str], sample_rate: int, clip_seconds: float
                ) -> tuple[np.ndarray, list[str], list[int]]:
    """``[N, sample_rate * clip_seconds]`` float32 waveforms, each file's sha256 and its own sample rate."""
    from scipy.io import wavfile
    from scipy.signal import resample_poly

    length = int(round(sample_rate * clip_seconds))
    out = np.zeros((len(files), length), dtype=np.float32)
    digests, rates = [], []
    for i, rel in enumerate(files):
        path = root / rel
        data = read_input_bytes(path, "WAV file", SAMPLE_LIMIT)
        try:
            rate, pcm = wavfile.read(io.BytesIO(data))
        except Exception as exc:  # scipy raises ValueError for most damage, struct and EOF errors for the rest
            raise InvalidInputError(f"{short(str(path))}: cannot be decoded as a WAV file ({type(exc).__name__}: "
                                    f"{short(str(exc), 100)})", "replace or remove the file") from None
        wave = to_float(pcm)
        if wave.ndim == 2:
            wave = wave.mean(axis=1)
        if wave.size == 0 or rate <= 0:
            raise InvalidInputError(f"{short(str(path))}: the WAV file holds no samples", "replace or remove the file")
        if rate != sample_rate:
            g = math.gcd(int(rate), int(sample_rate))
            wave = resample_poly(wave, sample_rate // g, int(rate) // g).astype(np.float32)
        n = min(length, len(wave))
        out[i, :n] = wave[:n]
        digests.append(sha256_bytes(data))
        rates.append(int(rate))
    return out, digests, rates
