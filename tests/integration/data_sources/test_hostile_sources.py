"""Hostile or mistaken data sources through the real command line and the Python API: a data folder that does not
fit the model, a WAV header that would ask for gigabytes, a link that loops back into the folder, complex
features, and tf.data datasets or calibration generators that never end."""

from __future__ import annotations

import itertools
import json
import os
import struct
import wave
from pathlib import Path

import numpy as np
import pytest

from helpers import one_error_line, run_in_process


def _clip(path: Path, seed: int, rate: int = 8000) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with wave.open(str(path), "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(rate)
        w.writeframes(np.random.default_rng(seed).normal(0, 3000, rate // 10).astype("<i2").tobytes())


def _header(path: Path, rate: int, declared: int | None = None) -> None:
    """A WAV file whose header says ``rate`` Hz (and ``declared`` bytes of samples), with 800 bytes of samples."""
    data = bytes(800)
    fmt = struct.pack("<HHIIHH", 1, 1, rate, (rate * 2) & 0xFFFFFFFF, 2, 16)
    body = b"WAVE" + b"fmt " + struct.pack("<I", 16) + fmt + b"data" + struct.pack("<I", declared or 800) + data
    path.write_bytes(b"RIFF" + struct.pack("<I", len(body)) + body)


@pytest.fixture(scope="module")
def model3(tmp_path_factory) -> Path:
    from edgedeploy.keras import tfenv

    keras = tfenv.load().keras
    path = tmp_path_factory.mktemp("model") / "m3.h5"
    keras.Sequential([keras.layers.Input((800,)), keras.layers.Dense(3, activation="softmax")]).save(path)
    return path


def _one_class(root: Path) -> None:
    for i in range(4):
        _clip(root / "only" / f"{i}.wav", i)


def _two_classes_and_a_loop(root: Path) -> None:
    for c in ("a", "b"):
        for i in range(3):
            _clip(root / c / f"{i}.wav", i)
    os.symlink(".", root / "loop")


def _bad_header(rate: int, declared: int | None = None):
    def make(root: Path) -> None:
        for c in ("a", "b", "c"):
            for i in range(2):
                _clip(root / c / f"{i}.wav", i)
        _header(root / "b" / "1.wav", rate, declared)
    return make


def _complex_front_end(root: Path) -> None:
    _bad_header(8000)(root)  # a header that is sound
    (root.parent / "fe_complex.py").write_text("import numpy as np\n\ndef spectrum(x):\n"
                                               "    return np.fft.fft(x)[:800]\n")


FOLDERS = [  # (what, make the folder, extra arguments, words of the line after "error: ")
    ("one class for a three-class model", _one_class, [],
     "{root}: 1 class folder (only) but the model has 3 outputs. give one class folder per output of the model"),
    ("a loop link is not a class", _two_classes_and_a_loop, [],
     "{root}: 2 class folders (a, b) but the model has 3 outputs"),
    ("a WAV header of 1 Hz", _bad_header(1), [], "{root}/b/1.wav: the header's sample rate is 1 Hz, outside "
                                                 "1,000-384,000 Hz"),
    ("a WAV header of 4,294,967,291 Hz", _bad_header(4_294_967_291), [], "sample rate is 4,294,967,291 Hz"),
    ("a WAV header of 0 Hz", _bad_header(0), [], "{root}/b/1.wav: the header's sample rate is 0 Hz"),
    ("a data chunk longer than the file", _bad_header(8000, 2**31), [],
     "{root}/b/1.wav: the data chunk declares 2,147,483,648 bytes of samples but 800 follow it"),
    ("complex features from a front end", _complex_front_end, ["--preprocess", "{fe}:spectrum"],
     "preprocess '{fe}:spectrum' returned complex64 values for {root}/a/0.wav, not real numbers"),
]


@pytest.mark.parametrize("make, extra, words", [c[1:] for c in FOLDERS], ids=[c[0] for c in FOLDERS])
def test_a_data_folder_the_model_cannot_use_is_one_line_naming_it_and_nothing_is_written(tmp_path, model3, make,
                                                                                        extra, words):
    root = tmp_path / "clips"
    root.mkdir()
    make(root)
    fe = tmp_path / "fe_complex.py"
    recipe = tmp_path / "r.toml"
    recipe.write_text("[data]\nsample_rate = 8000\nclip_seconds = 0.1\n")
    out = tmp_path / "out"
    # in this process, which has TensorFlow loaded already (the console script's handling of user code is
    # test_preprocess_cli.py's)
    proc = run_in_process("optimize", model3, "--data", root, "-o", out, "--leaves", "ptq", "--recipe", recipe,
               *[a.format(fe=fe) for a in extra])
    assert proc.returncode == 3, proc.stderr
    line = one_error_line(proc)
    assert words.format(root=root, fe=fe) in line, line
    assert not out.exists()  # not even the run folder: the folder was refused before anything was written
    if make is _two_classes_and_a_loop:
        assert "skipped loop, a link back to the data folder" in proc.stderr


def _tiny_model(tmp_path: Path) -> Path:
    from edgedeploy.keras import tfenv

    keras = tfenv.load().keras
    keras.utils.set_random_seed(0)
    path = tmp_path / "m2.h5"
    keras.Sequential([keras.layers.Input((3,)), keras.layers.Dense(2, activation="softmax")]).save(path)
    return path


def test_endless_datasets_and_calibration_generators_are_read_up_to_the_recipes_limits(tmp_path):
    """A dataset of unknown length that never ends stops at data.max_samples and so does an endless calibration
    generator; the manifest says so, the written samples hold that many, and the leaf was calibrated on a seeded
    random choice of calibration_samples of them."""
    import edgedeploy
    from edgedeploy.keras import tfenv

    tf = tfenv.load().tf
    rng = np.random.default_rng(0)

    def endless():
        for i in itertools.count():
            yield rng.normal(size=3).astype("float32"), np.int64(i % 2)

    data = tf.data.Dataset.from_generator(endless, output_signature=(tf.TensorSpec((3,), tf.float32),
                                                                     tf.TensorSpec((), tf.int64)))
    assert int(data.cardinality()) == int(tf.data.UNKNOWN_CARDINALITY)

    def representative():
        while True:
            yield [rng.normal(size=(1, 3)).astype("float32")]

    run = edgedeploy.optimize(_tiny_model(tmp_path), data, tmp_path / "run", leaves=["ptq"], max_samples=40,
                              calibration_samples=16, calibration=representative)
    source = json.loads((run.run_dir / "manifest.json").read_text())["info"]["optimize"]["data_source"]
    assert source["read"] == {"samples": 40, "length": "unknown", "limit": 40, "limit_from": "data.max_samples",
                              "stopped_at": "data.max_samples"}
    assert source["calibration_read"] == {"samples": 40, "length": "unknown", "limit": 40,
                                          "limit_from": "data.max_samples", "stopped_at": "data.max_samples"}
    with np.load(run.run_dir / "inputs" / "data.npz") as d:
        assert len(d["x"]) == 40 and len(d["x_calibration"]) == 40
    calibrated_on = run.leaves["ptq"].details["calibration"]
    assert calibrated_on == "16 random samples of the given calibration samples (seed 0)", calibrated_on


def test_datasets_that_cannot_be_read_to_their_end_are_refused_before_anything_is_written(tmp_path):
    import edgedeploy
    from edgedeploy.errors import InvalidInputError
    from edgedeploy.keras import tfenv

    tf = tfenv.load().tf
    model = _tiny_model(tmp_path)
    x, y = np.ones((60, 3), "float32"), np.arange(60) % 2
    known = tf.data.Dataset.from_tensor_slices((x, y))
    cases = [
        (dict(data=known, max_samples=40), "the given dataset holds more than 40 samples (data.max_samples). "
                                           "raise data.max_samples, or take a part of it (.take(N))"),
        (dict(data=known.batch(8), max_samples=40), "the given dataset holds more than 40 samples"),
        (dict(data=known.repeat()), "the given dataset repeats forever"),
        (dict(data=(x, y), calibration=known.repeat()), "the calibration dataset repeats forever"),
        (dict(data=(x.astype("complex64"), y)), "the given samples hold complex64 values, not real numbers"),
    ]
    for i, (kwargs, words) in enumerate(cases):
        out = tmp_path / f"out{i}"
        with pytest.raises(InvalidInputError) as err:
            edgedeploy.optimize(model, kwargs.pop("data"), out, leaves=["ptq"], **kwargs)
        assert words in err.value.one_line(), err.value.one_line()
        assert not out.exists()
    # a calibration dataset of known length beyond data.max_samples is read that far, not refused
    run = edgedeploy.optimize(model, (x, y), tmp_path / "ok", leaves=["ptq"], calibration_samples=8,
                              max_samples=50, calibration=known.map(lambda a, b: a))
    with np.load(run.run_dir / "inputs" / "data.npz") as d:
        assert len(d["x_calibration"]) == 50


def _png_of_zeros(path: Path, width: int, height: int) -> None:
    """A real PNG of ``width`` x ``height`` black RGB pixels: a few hundred KB that decode to gigabytes."""
    import zlib

    # The zlib stream of the rows: one block of `rows` zero rows deflated once, ended by a full flush (which resets
    # the compressor, so each further block of the same rows deflates to the same bytes), repeated; then the last
    # (empty) block and the Adler-32 of the pixels, which for zeros is 1 + (length mod 65521) << 16.
    rows = 400
    assert height % rows == 0
    row = bytes(1 + 3 * width)  # filter byte 0, then the pixels
    packer = zlib.compressobj(9, zlib.DEFLATED, -15)
    block = packer.compress(row * rows) + packer.flush(zlib.Z_FULL_FLUSH)
    adler = ((len(row) * height % 65521) << 16) | 1
    idat = b"\x78\xda" + block * (height // rows) + packer.flush() + struct.pack(">I", adler)

    def chunk(kind: bytes, body: bytes) -> bytes:
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))

    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0))
                     + chunk(b"IDAT", idat) + chunk(b"IEND", b""))


def test_an_image_that_declares_too_many_pixels_is_refused_before_it_is_decoded(tmp_path):
    from PIL import Image

    from edgedeploy.keras import tfenv

    keras = tfenv.load().keras
    model = tmp_path / "img.h5"
    keras.Sequential([keras.layers.Input((8, 8, 3)), keras.layers.Flatten(),
                      keras.layers.Dense(2, activation="softmax")]).save(model)
    root = tmp_path / "images"
    for c in ("cat", "dog"):
        for i in range(3):
            (root / c).mkdir(parents=True, exist_ok=True)
            Image.new("RGB", (12, 10), (40 * i, 9, 200)).save(root / c / f"{i}.png")
    bomb = root / "dog" / "2.png"
    _png_of_zeros(bomb, 12_000, 12_000)  # 432 MB of pixels, 1.7 GB as float32, in a file of about 400 KB
    assert bomb.stat().st_size < 2 << 20
    out = tmp_path / "out"
    proc = run_in_process("optimize", model, "--data", root, "-o", out, "--leaves", "ptq")
    assert proc.returncode == 3, proc.stderr
    assert one_error_line(proc) == (f"error: {bomb}: the header declares 12,000 x 12,000 pixels, over the limit of "
                                    "89,478,485 pixels per image. shrink the image (the model's input is resized "
                                    "from it anyway)")
    assert not out.exists()


def test_a_folder_given_in_python_with_a_calibration_source_is_named_too(tmp_path, model3):
    import edgedeploy
    from edgedeploy.errors import InvalidInputError

    root = tmp_path / "clips"
    _one_class(root)
    with pytest.raises(InvalidInputError) as err:
        edgedeploy.optimize(model3, root, tmp_path / "out", leaves=["ptq"], sample_rate=8000, clip_seconds=0.1,
                            calibration=[np.zeros(800, "float32")] * 2)
    assert err.value.one_line().startswith(f"{root.resolve()}: 1 class folder (only) but the model has 3 outputs")
    assert not (tmp_path / "out").exists()
