"""WAV headers are bounded before any sample is decoded: rates outside the documented range, channel counts, sample
widths and declared lengths that disagree with the file are one line naming the file and the field, and nothing is
written; a header whose decoding would pass the memory limits is refused from its declared sizes."""

from __future__ import annotations

import math
import struct
import time
import wave
from pathlib import Path

import numpy as np
import pytest

from edgedeploy.data_sources import DATA_FILE, DataOptions, prepare_data
from edgedeploy.data_sources.audio import DECODED_LIMIT, decode_wavs
from edgedeploy.data_sources.wav_header import MEMORY_LIMIT, RATE_RANGE, read_header
from edgedeploy.errors import InvalidInputError


def wav_bytes(rate: int = 8000, channels: int = 1, bits: int = 16, tag: int = 1, frames: int = 400,
              data: bytes | None = None, declared: int | None = None, block_align: int | None = None,
              byte_rate: int | None = None, sig: bytes = b"RIFF", before: bytes = b"", fmt_first: bool = True) -> bytes:
    """A WAV file written field by field, so that any field can say what a damaged or hostile file says."""
    width = (bits + 7) // 8 or 1
    block = block_align if block_align is not None else max(1, channels) * width
    if data is None:
        data = np.random.default_rng(0).integers(0, 256, frames * block, dtype=np.uint8).tobytes()
    rate_bytes = byte_rate if byte_rate is not None else rate * block
    fmt = struct.pack("<HHIIHH", tag, channels, rate, rate_bytes & 0xFFFFFFFF, block, bits)
    fmt_chunk = b"fmt " + struct.pack("<I", len(fmt)) + fmt
    data_chunk = b"data" + struct.pack("<I", len(data) if declared is None else declared) + data
    body = b"WAVE" + before + (fmt_chunk + data_chunk if fmt_first else data_chunk + fmt_chunk)
    return sig + struct.pack("<I", len(body)) + body


def good_wav(path: Path, rate: int, seconds: float, seed: int, channels: int = 1) -> np.ndarray:
    n = int(rate * seconds)
    pcm = (np.random.default_rng(seed).normal(0, 0.2, (n, channels)) * 32767).clip(-32768, 32767).astype("<i2")
    path.parent.mkdir(parents=True, exist_ok=True)
    with wave.open(str(path), "wb") as w:
        w.setnchannels(channels)
        w.setsampwidth(2)
        w.setframerate(rate)
        w.writeframes(pcm.tobytes())
    return pcm


def folder_with(tmp_path: Path, bad: bytes) -> tuple[Path, Path]:
    """A two-class folder of good clips with ``bad`` as one of them; the bad file's path."""
    root = tmp_path / "clips"
    for c in ("no", "yes"):
        for i in range(3):
            good_wav(root / c / f"{i}.wav", 8000, 0.2, i)
    target = root / "yes" / "1.wav"
    target.write_bytes(bad)
    return root, target


HOSTILE = [
    ("rate 1 Hz", dict(rate=1), "sample rate is 1 Hz, outside 1,000-384,000 Hz"),
    ("rate 0", dict(rate=0), "sample rate is 0 Hz, outside"),
    ("rate 2**32-5", dict(rate=4_294_967_291), "sample rate is 4,294,967,291 Hz, outside"),
    ("rate just below", dict(rate=999), "sample rate is 999 Hz"),
    ("rate just above", dict(rate=384_001), "sample rate is 384,001 Hz"),
    ("no channels", dict(channels=0, block_align=2), "channel count is 0, outside 1-64"),
    ("65 channels", dict(channels=65), "channel count is 65, outside 1-64"),
    ("0 bits", dict(bits=0, block_align=2), "bits per sample is 0, not 1-64"),
    ("72 bits", dict(bits=72, block_align=9), "bits per sample is 72, not 1-64"),
    ("16-bit float", dict(tag=3), "bits per sample is 16, not 32 or 64 (float)"),
    ("block align of 3 for two channels", dict(channels=2, block_align=3), "block align is 3 bytes"),
    ("block align too small", dict(bits=24, block_align=2), "block align is 2 bytes"),
    ("byte rate", dict(byte_rate=12345), "byte rate is 12,345, not sample rate x block align (16,000)"),
    ("data chunk longer than the file", dict(declared=2**31), "data chunk declares 2,147,483,648 bytes of samples "
                                                               "but 800 follow it"),
    ("data of half a frame", dict(data=b"\x00" * 801), "801 bytes are not a whole number of 2-byte frames"),
    ("no samples", dict(data=b""), "holds no samples"),
    ("data before fmt", dict(fmt_first=False), "cannot be decoded as a WAV file (the data chunk comes before"),
    ("chunk past the end", dict(before=b"LIST" + struct.pack("<I", 10**6) + b"abcd"),
     "cannot be decoded as a WAV file (its 'LIST' chunk declares 1,000,000 bytes but 836 follow it"),
    ("not RIFF", dict(sig=b"JUNK"), "cannot be decoded as a WAV file (no RIFF/WAVE header)"),
]


@pytest.mark.parametrize("kwargs, words", [c[1:] for c in HOSTILE], ids=[c[0] for c in HOSTILE])
def test_a_hostile_header_is_one_line_naming_the_file_and_field_and_nothing_is_written(tmp_path, kwargs, words):
    root, bad = folder_with(tmp_path, wav_bytes(**kwargs))
    out = tmp_path / "run"
    started = time.perf_counter()
    with pytest.raises(InvalidInputError) as err:
        prepare_data(root, [1600], out, DataOptions(sample_rate=8000, clip_seconds=0.2))
    line = err.value.one_line()
    assert line.startswith(f"{bad}: ") and words in line and "\n" not in line, line
    assert not out.exists()
    assert time.perf_counter() - started < 10  # refused from the header, not after resampling


def test_rf64_and_big_endian_headers_are_read_as_scipy_reads_them():
    riff = wav_bytes(rate=16000, frames=10)
    h = read_header(riff, "a.wav")
    assert (h.rate, h.channels, h.bits, h.block_align, h.data_size, h.frames) == (16000, 1, 16, 2, 20, 10)
    fmt = struct.pack(">HHIIHH", 1, 2, 22050, 22050 * 4, 4, 16)
    rifx = b"RIFX" + struct.pack(">I", 40) + b"WAVE" + b"fmt " + struct.pack(">I", 16) + fmt + b"data" + \
        struct.pack(">I", 8) + bytes(8)
    assert read_header(rifx, "b.wav").rate == 22050 and read_header(rifx, "b.wav").frames == 2
    ds64 = b"ds64" + struct.pack("<IQQQI", 28, 0, 6, 3, 0)
    rf64 = b"RF64" + struct.pack("<I", 0xFFFFFFFF) + b"WAVE" + ds64 + riff[12:36] + b"data" + \
        struct.pack("<I", 0xFFFFFFFF) + bytes(6)
    assert read_header(rf64, "c.wav").data_size == 6


# 383,999 Hz takes the path 16,001 Hz takes (a rate coprime with 16 kHz: no common factor shrinks the filter) with
# 24 times its filter, whose 7.7 million taps take seconds to design (here twice): it runs with the `slow` tests
@pytest.mark.parametrize("rate", [8000, 11025, 16001, 22050, 44100, pytest.param(383_999, marks=pytest.mark.slow)])
def test_in_range_rates_decode_to_what_resample_poly_gives_on_the_whole_file(tmp_path, rate):
    """Only the frames a clip depends on are resampled; the clip equals, bit for bit, the start of the whole
    file resampled (the filter designed once per rate ratio, as resample_poly designs it)."""
    from scipy.signal import resample_poly

    pcm = good_wav(tmp_path / "a" / "x.wav", rate, 0.6, rate, channels=2)
    x, _, rates = decode_wavs(tmp_path, ["a/x.wav"], 16000, 0.25)
    wave_ = (pcm.astype(np.float32) / 32768.0).mean(axis=1)
    g = math.gcd(rate, 16000)
    whole = resample_poly(wave_, 16000 // g, rate // g).astype(np.float32)
    assert rates == [rate] and x.shape == (1, 4000)
    assert np.array_equal(x[0], whole[:4000])


def test_a_folder_whose_clips_pass_the_decoded_limit_is_refused_before_any_file_is_read(tmp_path):
    root, _ = folder_with(tmp_path, wav_bytes())
    out = tmp_path / "run"
    with pytest.raises(InvalidInputError) as err:  # 6 clips of 384,000 x 3,600 samples: 33 GB as float32
        prepare_data(root, [384_000 * 3600], out, DataOptions(sample_rate=384_000, clip_seconds=3600))
    line = err.value.one_line()
    assert f"data folder {root}: 6 clips of 1,382,400,000 samples" in line and "data.clip_seconds" in line
    assert f"over the limit of {DECODED_LIMIT / 2**30:g} GiB" in line and not out.exists()


def test_a_file_whose_resampling_would_pass_the_memory_limit_is_refused_from_its_header(tmp_path):
    """A 1,000 Hz file of 2,000 s upsampled to 384 kHz: a 768-million-sample clip, refused before decoding."""
    root = tmp_path / "clips"
    (root / "a").mkdir(parents=True)
    big = root / "a" / "long.wav"
    big.write_bytes(wav_bytes(rate=1000, bits=8, frames=2_000_000))
    good_wav(root / "a" / "short.wav", 8000, 0.1, 0)
    with pytest.raises(InvalidInputError) as err:
        decode_wavs(root, ["a/long.wav"], 384_000, 2000)
    line = err.value.one_line()
    assert line.startswith(f"{big}: decoding it would take about ") and "1,000 Hz, 1 channel" in line
    assert f"over the limit of {MEMORY_LIMIT / 2**20:,.0f} MiB per file" in line


def test_the_rate_range_is_the_recipes_sample_rate_range():
    from edgedeploy.config.recipe import RECIPE_KEYS

    key = next(k for k in RECIPE_KEYS if k.path == "data.sample_rate")
    assert RATE_RANGE == (key.minimum, key.maximum)


def test_the_written_file_is_absent_until_every_header_passes(tmp_path):
    root, _ = folder_with(tmp_path, wav_bytes(rate=1))
    out = tmp_path / "run"
    out.mkdir()
    with pytest.raises(InvalidInputError):
        prepare_data(root, [1600], out, DataOptions(sample_rate=8000, clip_seconds=0.2))
    assert not (out / DATA_FILE).exists() and list(out.iterdir()) == []


def test_a_folder_of_many_odd_rates_is_refused_when_their_filters_pass_the_limit(tmp_path, monkeypatch):
    """Each rate prime to the recipe's designs a filter of 20 x max(up, down) + 1 taps; the folder's total is
    bounded (here at 700,000 taps, so that the test designs small filters)."""
    from edgedeploy.data_sources import audio

    monkeypatch.setattr(audio, "FILTER_TAPS_LIMIT", 700_000)
    files = []
    for i, rate in enumerate((16_001, 16_001, 8_000, 16_003, 16_007)):
        good_wav(tmp_path / "a" / f"{i}.wav", rate, 0.05, i)
        files.append(f"a/{i}.wav")
    x, _, rates = decode_wavs(tmp_path, files[:4], 16000, 0.05)  # 320,021 + 41 + 320,061 taps: a rate seen before
    assert rates == [16_001, 16_001, 8_000, 16_003]
    with pytest.raises(InvalidInputError) as err:
        decode_wavs(tmp_path, files, 16000, 0.05)
    assert err.value.one_line().startswith(f"{tmp_path / 'a' / '4.wav'}: its sample rate, 16,007 Hz, makes 4 rates "
                                           "in the folder whose filters to resample them to 16,000 Hz take 960,264 "
                                           "taps in all, over the limit of 700,000")
