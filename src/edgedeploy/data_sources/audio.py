"""WAV files decoded with SciPy (``scipy.io.wavfile``), mixed to mono and resampled with a polyphase filter
(``scipy.signal.resample_poly``) to the recipe's sample rate, then cut or zero-padded at the end to the clip
length: float32 waveforms in [-1, 1], one row per file. Headers are bounded first (:mod:`.wav_header`)."""

from __future__ import annotations

import functools
import io
from pathlib import Path
from typing import Sequence

import numpy as np

from ..errors import InvalidInputError
from edgedeploy.core.files import read_input_bytes, sha256_bytes, short
from .images import SAMPLE_LIMIT
from .wav_header import check_memory, frames_needed, read_header, resampling


def to_float(data: np.ndarray) -> np.ndarray:
    """PCM samples as float32 in [-1, 1] (8-bit WAV is unsigned, the others signed)."""
    if data.dtype == np.uint8:
        return (data.astype(np.float32) - 128.0) / 128.0
    if np.issubdtype(data.dtype, np.integer):
        return data.astype(np.float32) / float(2 ** (8 * data.dtype.itemsize - 1))
    return data.astype(np.float32)


DECODED_LIMIT = 4 << 30  # bytes: every clip of a folder at the recipe's rate and length, as float32
# resampling filter taps designed for one folder, over its distinct rate ratios: ten of the largest (a rate such as
# 383,999 Hz to 16 kHz, 7.7 million taps, takes one to four seconds to design)
FILTER_TAPS_LIMIT = 10 * (20 * 384_000 + 1)


def check_decoded_size(root: Path, n_files: int, sample_rate: int, clip_seconds: float) -> int:
    """The clip length in samples; a folder whose clips would pass :data:`DECODED_LIMIT` is refused before any
    file is read."""
    length = int(round(sample_rate * clip_seconds))
    need = n_files * length * 4
    if need > DECODED_LIMIT:
        raise InvalidInputError(f"data folder {short(str(root))}: {n_files:,} clips of {length:,} samples "
                                f"(data.sample_rate {sample_rate:,} x data.clip_seconds {clip_seconds:g}) take "
                                f"{need / 2**30:,.1f} GiB as float32, over the limit of {DECODED_LIMIT / 2**30:g} GiB",
                                "lower data.clip_seconds or data.sample_rate, or give fewer files")
    return length


@functools.lru_cache(maxsize=4)
def _lowpass(up: int, down: int) -> np.ndarray:
    """The filter ``resample_poly`` designs for ``up``/``down`` (its default Kaiser window, in the float32 of
    the waveform), designed once per ratio: a rate such as 383,999 Hz takes 7.7 million taps."""
    from scipy.signal import firwin

    top = max(up, down)
    return np.asarray(firwin(2 * 10 * top + 1, 1.0 / top, window=("kaiser", 5.0)), dtype=np.float32)


def decode_wavs(root: Path, files: Sequence[str], sample_rate: int, clip_seconds: float
                ) -> tuple[np.ndarray, list[str], list[int]]:
    """``[N, sample_rate * clip_seconds]`` float32 waveforms, each file's sha256 and its own sample rate. Each
    header is checked and its memory estimated (:mod:`.wav_header`) before the file's samples are decoded; only
    the frames the clip depends on are converted and resampled."""
    from scipy.io import wavfile
    from scipy.signal import resample_poly

    length = check_decoded_size(root, len(files), sample_rate, clip_seconds)
    out = np.zeros((len(files), length), dtype=np.float32)
    digests, rates = [], []
    ratios: set[tuple[int, int]] = set()
    taps = 0
    for i, rel in enumerate(files):
        path = root / rel
        data = read_input_bytes(path, "WAV file", SAMPLE_LIMIT)
        header = read_header(data, str(path))
        check_memory(header, len(data), sample_rate, length, str(path))
        try:
            rate, pcm = wavfile.read(io.BytesIO(data))
        except Exception as exc:  # scipy raises ValueError for most damage, struct and EOF errors for the rest
            raise InvalidInputError(f"{short(str(path))}: cannot be decoded as a WAV file ({type(exc).__name__}: "
                                    f"{short(str(exc), 100)})", "replace or remove the file") from None
        used = frames_needed(header, sample_rate, length)
        wave = to_float(pcm[:used])
        if wave.ndim == 2:
            wave = wave.mean(axis=1)
        if wave.size == 0:
            raise InvalidInputError(f"{short(str(path))}: the WAV file holds no samples", "replace or remove the file")
        up, down = resampling(header.rate, sample_rate)
        if up != down and (up, down) not in ratios:
            taps += 20 * max(up, down) + 1
            if taps > FILTER_TAPS_LIMIT:
                raise InvalidInputError(f"{short(str(path))}: its sample rate, {header.rate:,} Hz, makes "
                                        f"{len(ratios) + 1} rates in the folder whose filters to resample them to "
                                        f"{sample_rate:,} Hz take {taps:,} taps in all, over the limit of "
                                        f"{FILTER_TAPS_LIMIT:,}",
                                        "re-save the files at data.sample_rate, or at common rates (8, 16, 22.05, "
                                        "44.1, 48 kHz)")
            ratios.add((up, down))
        if up != down:
            wave = resample_poly(wave, up, down, window=_lowpass(up, down)).astype(np.float32)
        n = min(length, len(wave))
        out[i, :n] = wave[:n]
        digests.append(sha256_bytes(data))
        rates.append(int(rate))
    return out, digests, rates
