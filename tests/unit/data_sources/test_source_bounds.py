"""Sources that would mislead or never end: links that loop back into a data folder are skipped with a warning,
complex values are refused wherever they enter, a calibration generator is read up to the recipe's
data.max_samples (calibration then takes a seeded random choice of them), and a folder is checked against the model before anything is written, naming the folder."""

from __future__ import annotations

import itertools
import logging
import os
import struct
import wave
from pathlib import Path

import numpy as np
import pytest

from edgedeploy.config.data import load_dataset
from edgedeploy.data_sources import DATA_FILE, DataOptions, gather_data, prepare_data
from edgedeploy.data_sources import memory
from edgedeploy.data_sources.folders import list_folder
from edgedeploy.data_sources.memory import calibration_samples, from_memory
from edgedeploy.errors import InvalidInputError


def clip(path: Path, seed: int, rate: int = 8000, seconds: float = 0.1) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with wave.open(str(path), "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(rate)
        w.writeframes((np.random.default_rng(seed).normal(0, 3000, int(rate * seconds))).astype("<i2").tobytes())


def classes(root: Path, names: tuple[str, ...], n: int = 3) -> None:
    for c in names:
        for i in range(n):
            clip(root / c / f"{i}.wav", hash((c, i)) % 1000)


LOOPS = [
    ("top-level loop -> .", "loop", ".", ["a", "b"]),
    ("loop to the folder above", "up", "..", ["a", "b"]),
    ("loop by absolute path", "again", "ROOT", ["a", "b"]),
]


@pytest.mark.parametrize("name, target, labels", [c[1:] for c in LOOPS], ids=[c[0] for c in LOOPS])
def test_a_link_that_loops_back_is_skipped_with_a_warning(tmp_path, caplog, name, target, labels):
    root = tmp_path / "clips"
    classes(root, ("a", "b"))
    os.symlink(str(root) if target == "ROOT" else target, root / name)
    with caplog.at_level(logging.WARNING, logger="edgedeploy"):
        listing = list_folder(root, 0.34, 0)
    assert listing.labels == labels and len(listing.files) == 6  # never a class holding every other class's files
    assert listing.links_skipped == [name] and listing.describe()["links_skipped"] == [name]
    warned = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warned) == 1 and f"skipped {name}, a link back to the data folder" in warned[0]


def test_links_inside_train_and_test_and_links_elsewhere(tmp_path):
    """A loop under train/ is skipped too; a linked class folder that leads outside is a class like any other."""
    root = tmp_path / "clips"
    classes(root / "train", ("a", "b"))
    classes(root / "test", ("a", "b"), n=1)
    classes(tmp_path / "elsewhere", ("c",))
    os.symlink("..", root / "train" / "loop")
    os.symlink(tmp_path / "elsewhere" / "c", root / "train" / "c")
    os.symlink(".", root / "b_inside")  # at the top, beside train/ and test/
    (root / "train" / "a" / "nested").symlink_to("..")  # inside a class: never walked
    listing = list_folder(root, 0.2, 0)
    assert listing.labels == ["a", "b", "c"] and listing.links_skipped == ["b_inside", "train/loop"]
    assert sum(1 for f in listing.files if f.startswith("train/c/")) == 3
    assert len(listing.files) == 9 + 2


def test_a_folder_is_checked_against_the_model_before_it_is_written_and_the_error_names_it(tmp_path):
    root = tmp_path / "one"
    classes(root, ("only",), n=4)
    prepared = gather_data(root, [800], DataOptions(sample_rate=8000, clip_seconds=0.1))
    with pytest.raises(InvalidInputError) as err:
        load_dataset(Path(prepared.where), (800,), 3, arrays=prepared.arrays(), sha256="")
    assert err.value.one_line() == (f"{root}: 1 class folder (only) but the model has 3 outputs. "
                                    "give one class folder per output of the model")
    assert not (tmp_path / "one" / DATA_FILE).exists() and sorted(p.name for p in tmp_path.iterdir()) == ["one"]
    ok = load_dataset(Path(prepared.where), (800,), 1, arrays=prepared.arrays(), sha256="")
    assert ok.labels == ["only"] and len(ok.x_fit) + len(ok.x_eval) == 4
    path, record = prepared.write(tmp_path / "run")  # what the stages read is what was checked
    again = load_dataset(path, (800,), 1)
    assert np.array_equal(again.x_fit, ok.x_fit) and record["written"] == DATA_FILE.as_posix()


def _fft(sample):
    return np.fft.rfft(sample)[:3]


COMPLEX = [
    ("samples in arrays", lambda tmp: from_memory((np.ones((8, 3), np.complex64), np.arange(8) % 2), 1,
                                                  eval_fraction=0.25, seed=0), "given samples hold complex64"),
    ("targets in arrays", lambda tmp: from_memory((np.ones((8, 3)), np.ones(8) + 1j), 1, eval_fraction=0.25, seed=0),
     "given targets hold complex128"),
    ("a calibration generator", lambda tmp: calibration_samples(lambda: iter([[np.ones((1, 3)) * 1j]]), 1, 10),
     "calibration samples hold complex128"),
    ("a preprocessing function", lambda tmp: prepare_data(_npz(tmp, x=np.ones((8, 6), np.float32)), [3], tmp / "run",
                                                          DataOptions(preprocess=_fft)),
     "returned complex64 values for given sample 0, not real numbers"),
    ("x in an npz", lambda tmp: load_dataset(_npz(tmp, x=np.ones((8, 3), np.complex64)), (3,), 2),
     "'x' holds complex64 values"),
    ("y in an npz", lambda tmp: load_dataset(_npz(tmp, y=np.ones(8, np.complex128)), (3,), 1, kind="regression"),
     "'y' holds complex128 values"),
    ("x_calibration in an npz", lambda tmp: load_dataset(_npz(tmp, x_calibration=np.ones((2, 3), np.complex64)),
                                                         (3,), 2), "'x_calibration' holds complex64 values"),
]


def _npz(tmp: Path, **arrays) -> Path:
    base = {"x": np.ones((8, 3), np.float32), "y": np.arange(8) % 2, "split": np.array([0, 0, 0, 1] * 2)}
    path = tmp / "d.npz"
    np.savez(path, **{**base, **arrays})
    return path


@pytest.mark.parametrize("make, words", [c[1:] for c in COMPLEX], ids=[c[0] for c in COMPLEX])
def test_complex_values_are_refused_in_one_line_never_cut_to_their_real_part(tmp_path, make, words):
    with pytest.raises(InvalidInputError) as err:
        make(tmp_path)
    line = err.value.one_line()
    assert words in line and "\n" not in line, line
    assert not (tmp_path / "run").exists()


STREAMS = [  # (items the generator yields, rows per item, the limit, rows read, stopped)
    ("endless", None, 1, 50, 50, "data.max_samples"),
    ("shorter than the limit", 7, 1, 50, 7, None),
    ("exactly the limit", 50, 1, 50, 50, None),
    ("one past the limit", 51, 1, 50, 50, "data.max_samples"),
    ("endless batches of four", None, 4, 10, 10, "data.max_samples"),
]


@pytest.mark.parametrize("items, batch, limit, read, stopped", [c[1:] for c in STREAMS], ids=[c[0] for c in STREAMS])
def test_a_calibration_generator_is_read_up_to_max_samples(caplog, items, batch, limit, read, stopped):
    pulled = []

    def representative():
        for i in itertools.count() if items is None else range(items):
            pulled.append(i)
            yield [np.full((batch, 3), i, np.float32)]

    with caplog.at_level(logging.WARNING, logger="edgedeploy"):
        x, record = calibration_samples(representative, 1, limit)
    assert x.shape == (read, 3) and x[0, 0] == 0
    assert record == {"samples": read, "length": "unknown", "limit": limit, "limit_from": "data.max_samples",
                      "stopped_at": stopped}
    assert len(pulled) <= -(-limit // batch) + 1  # at most one item past the limit is pulled
    assert any("read up to" in r.getMessage() for r in caplog.records) == (stopped is not None)


def test_calibration_takes_a_seeded_random_choice_of_what_was_read_not_the_first_samples(tmp_path):
    """A generator sorted by class: the samples read are all kept, and calibration_samples of them are chosen
    at random (seeded), from every class, not the first ones."""
    def sorted_by_class():
        for c in range(4):
            for _ in range(25):
                yield [np.full((1, 3), c, np.float32)]

    x_cal, record = calibration_samples(sorted_by_class, 1)
    assert x_cal.shape == (100, 3) and record["samples"] == 100 and record["stopped_at"] is None
    x = np.random.default_rng(0).normal(size=(20, 3)).astype(np.float32)
    path = tmp_path / "d.npz"
    np.savez(path, x=x, y=np.arange(20) % 2, split=np.array([0, 0, 0, 1] * 5, np.int8), x_calibration=x_cal)
    ds = load_dataset(path, (3,), 2)
    chosen, how = ds.calibration(20, seed=3)
    assert len(chosen) == 20 and set(chosen[:, 0]) == {0, 1, 2, 3}, chosen[:, 0]
    assert how == "20 random samples of the given calibration samples (seed 3)"
    assert not np.array_equal(chosen, x_cal[:20])
    again, _ = ds.calibration(20, seed=3)
    other, _ = ds.calibration(20, seed=4)
    assert np.array_equal(chosen, again) and not np.array_equal(chosen, other)


def test_a_calibration_stream_stops_at_the_memory_limit(monkeypatch):
    monkeypatch.setattr(memory, "STREAM_MEMORY_LIMIT", 12 * 10)  # ten rows of three float32
    x, record = calibration_samples(lambda: (np.ones(3) for _ in itertools.count()), 1, 1000)
    assert x.shape == (10, 3) and record["stopped_at"].endswith("GiB of samples")


IMAGES = [("PNG", "png", {}), ("GIF", "gif", {}), ("BMP", "bmp", {}), ("baseline JPEG", "jpeg", {}),
          ("progressive JPEG", "jpeg", {"progressive": True}), ("grey PNG", "png", {"mode": "L"})]


@pytest.mark.parametrize("fmt, options", [c[1:] for c in IMAGES], ids=[c[0] for c in IMAGES])
def test_an_images_declared_size_is_read_from_its_header(tmp_path, fmt, options):
    from io import BytesIO

    from PIL import Image

    from edgedeploy.data_sources.image_header import declared_size

    buf = BytesIO()
    Image.new(options.pop("mode", "RGB"), (37, 23), (10, 20, 30) if fmt != "png" else 7).save(buf, fmt, **options)
    assert declared_size(buf.getvalue()) == (37, 23)
    assert declared_size(b"not an image") is None and declared_size(buf.getvalue()[:5]) is None


BOMBS = [  # headers of images too large to decode: the bytes up to the declared size, no pixels
    ("PNG 65535 x 65535", b"\x89PNG\r\n\x1a\n" + struct.pack(">I", 13) + b"IHDR" + struct.pack(">IIBBBBB", 65535,
                                                                                              65535, 8, 2, 0, 0, 0),
     "65,535 x 65,535 pixels"),
    ("GIF 65535 x 2000", b"GIF89a" + struct.pack("<HH", 65535, 2000) + bytes(3), "65,535 x 2,000 pixels"),
    ("BMP top-down", b"BM" + bytes(12) + struct.pack("<Iii", 40, 20000, -20000) + bytes(28), "20,000 x 20,000"),
    ("JPEG", b"\xff\xd8\xff\xe0" + struct.pack(">H", 16) + bytes(14) + b"\xff\xc0" + struct.pack(">HBHH", 17, 8,
                                                                                                 9500, 9500),
     "9,500 x 9,500 pixels"),
]


@pytest.mark.parametrize("data, words", [c[1:] for c in BOMBS], ids=[c[0] for c in BOMBS])
def test_an_image_whose_header_declares_too_many_pixels_is_refused_before_decoding(data, words):
    from edgedeploy.data_sources.image_header import PIXEL_LIMIT, check_image_size

    with pytest.raises(InvalidInputError) as err:
        check_image_size(data, "imgs/cat/1.png")
    assert err.value.one_line().startswith(f"imgs/cat/1.png: the header declares {words}")
    assert f"over the limit of {PIXEL_LIMIT:,} pixels per image" in err.value.one_line()
    check_image_size(data[:3] + b"junk", "small.png")  # no size read: left to the decoder


def test_a_folder_that_cannot_be_listed_is_one_line_naming_it(tmp_path):
    (tmp_path / "file.txt").write_text("not a folder")
    with pytest.raises(InvalidInputError) as err:
        list_folder(tmp_path / "file.txt", 0.2, 0)
    assert err.value.one_line().startswith(f"data folder {tmp_path / 'file.txt'} cannot be listed (Not a directory)")
