"""Class folders through the whole pipeline: JPEG images give the same int8 accuracy as the same pixels in an
``.npz``; WAV clips spoken by a speech synthesizer go through a user MFCC front end (``--preprocess``) and the
exported golden vectors are that front end's output."""

from __future__ import annotations

import hashlib
import json
import shutil
import wave
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from edgedeploy.cli.app import app

CIFAR = "ic/cifar10_jpeg_subset.npz"


def cli(*args) -> str:
    result = CliRunner().invoke(app, [str(a) for a in args])
    assert result.exit_code == 0, result.output
    return result.output


def _cifar_slice(shared_data: Path, per_class_fit: int, per_class_eval: int, seed: int, out: Path):
    """A seeded slice of the CIFAR-10 subset (without the real data, seeded images) and a small seeded model of its
    input, saved in ``out``: the comparison is of two readers of the same pixels, which any model that computes on
    them shows, not of what the model scores. The seeded images are flat 16 x 16 blocks of random colour: JPEG keeps
    such blocks (its 4:2:0 units) within a few levels, as it keeps photographs, where pixel-wise noise would lose tens
    of levels."""
    from edgedeploy.keras import tfenv

    if (shared_data / CIFAR).is_file():
        with np.load(shared_data / CIFAR) as d:
            arrays = {k: d[k] for k in ("x_train", "y_train", "x_test", "y_test", "classes")}
    else:
        rng = np.random.default_rng(seed)

        def blocks(n: int) -> np.ndarray:
            coarse = rng.integers(0, 256, (n, 2, 2, 3), dtype=np.uint8)
            return np.repeat(np.repeat(coarse, 16, axis=1), 16, axis=2)

        arrays = {"x_train": blocks(500), "y_train": np.arange(500) % 10,
                  "x_test": blocks(200), "y_test": np.arange(200) % 10,
                  "classes": np.array([f"class{i}" for i in range(10)])}
    keras = tfenv.load().keras
    keras.utils.set_random_seed(seed)
    net = keras.Sequential([keras.layers.Input((32, 32, 3)), keras.layers.Rescaling(1 / 255.0),
                            keras.layers.Conv2D(8, 3, strides=2, activation="relu"), keras.layers.Flatten(),
                            keras.layers.Dense(10, activation="softmax")])
    model = out / "small_cifar.h5"
    net.save(model)
    rng = np.random.default_rng(seed)
    picked = {}
    for split, n in (("train", per_class_fit), ("test", per_class_eval)):
        y = np.asarray(arrays[f"y_{split}"]).reshape(-1)
        idx = np.concatenate([np.sort(rng.choice(np.flatnonzero(y == c), n, replace=False)) for c in range(10)])
        picked[split] = (arrays[f"x_{split}"][idx], y[idx])
    return picked, [str(c) for c in arrays["classes"]], model


def test_jpeg_class_folders_give_the_same_ptq_accuracy_as_the_same_images_in_an_npz(shared_data, tmp_path):
    from PIL import Image

    import edgedeploy

    picked, classes, model = _cifar_slice(shared_data, 12, 8, seed=7, out=tmp_path)
    assert classes == sorted(classes)  # folder names sort in class-index order, so the labels agree
    folder = tmp_path / "cifar"
    decoded: dict[str, tuple[list[np.ndarray], list[int]]] = {}
    for split, (x, y) in picked.items():
        xs, ys = [], []
        for i, (img, label) in enumerate(zip(x, y)):
            path = folder / split / classes[label] / f"{i:04d}.jpg"
            path.parent.mkdir(parents=True, exist_ok=True)
            Image.fromarray(img).save(path, quality=95)
        # the same files read back by another decoder, in the folder's order (sorted class, then file name)
        for c in classes:
            for path in sorted((folder / split / c).iterdir()):
                xs.append(np.asarray(Image.open(path).convert("RGB")))
                ys.append(classes.index(c))
        decoded[split] = (xs, ys)
        # JPEG at quality 95 keeps the pixels within a few levels of the .npz's (files are named by their index)
        originals = np.concatenate([x[y == c] for c in range(len(classes))]).astype(float)
        assert np.mean(np.abs(np.stack(xs).astype(float) - originals)) < 3
    npz = tmp_path / "same_images.npz"
    np.savez(npz, x_train=np.stack(decoded["train"][0]), y_train=np.array(decoded["train"][1]),
             x_test=np.stack(decoded["test"][0]), y_test=np.array(decoded["test"][1]), classes=np.array(classes))

    from_folder = edgedeploy.optimize(model, folder, tmp_path / "run_folder", leaves=["ptq"], calibration_samples=60)
    from_npz = edgedeploy.optimize(model, npz, tmp_path / "run_npz", leaves=["ptq"], calibration_samples=60)
    a, b = from_folder.leaves["ptq"], from_npz.leaves["ptq"]
    print(f"ptq int8 accuracy: folder {a.metric('int8_accuracy')}%, npz {b.metric('int8_accuracy')}% "
          f"(float {a.metric('float_accuracy')}% / {b.metric('float_accuracy')}%), {len(decoded['test'][1])} images")
    assert a.metric("int8_accuracy") == b.metric("int8_accuracy")
    assert a.metric("float_accuracy") == b.metric("float_accuracy")
    assert a.details["calibration"].split(" (")[0] == b.details["calibration"].split(" (")[0]
    with np.load(tmp_path / "run_folder" / "inputs" / "data.npz") as got:
        assert np.array_equal(got["x"][got["split"] == 1], np.stack(decoded["test"][0]).astype(np.float32))
        # and the labels each image's folder gives, in both splits
        for split, part in ((0, "train"), (1, "test")):
            assert np.array_equal(got["y"][got["split"] == split], decoded[part][1]), part
    manifest = json.loads((tmp_path / "run_folder" / "manifest.json").read_text())
    source = manifest["info"]["optimize"]["data_source"]
    assert source["labels"] == classes and source["kind"] == "image"
    assert len(source["files"]) == 200 and source["files"][0]["file"] == f"train/{classes[0]}/0000.jpg"
    assert "train/" in source["split_from"]


def test_an_undecodable_image_is_named_in_one_line(tmp_path):
    import edgedeploy
    from edgedeploy.keras import tfenv
    from edgedeploy.errors import InvalidInputError

    keras = tfenv.load().keras
    net = keras.Sequential([keras.layers.Input((8, 8, 3)), keras.layers.Flatten(), keras.layers.Dense(2)])
    for c in ("a", "b"):
        for i in range(3):
            path = tmp_path / "imgs" / c / f"{i}.png"
            path.parent.mkdir(parents=True, exist_ok=True)
            from PIL import Image

            Image.fromarray(np.full((9, 9, 3), 40 * i, np.uint8)).save(path)
    bad = tmp_path / "imgs" / "b" / "1.png"
    bad.write_bytes(b"\x89PNG\r\n\x1a\n" + b"\x00" * 40)
    with pytest.raises(InvalidInputError) as err:
        edgedeploy.optimize(net, tmp_path / "imgs", tmp_path / "out", leaves=["ptq"])
    assert str(bad) in err.value.one_line() and "cannot be decoded as an image" in err.value.one_line()
    assert not (tmp_path / "out" / "inputs" / "data.npz").exists()


MFCC_FRONT_END = '''
"""An MFCC front end in NumPy: 40 ms windows every 20 ms, 40 mel bands, 10 coefficients (49 x 10 x 1 at 16 kHz)."""
import numpy as np

RATE, FRAME, HOP, FFT, BANDS, COEFFS = 16000, 640, 320, 1024, 40, 10


def _mel(f):
    return 2595.0 * np.log10(1.0 + f / 700.0)


def _filters():
    edges = 700.0 * (10 ** (np.linspace(_mel(20.0), _mel(4000.0), BANDS + 2) / 2595.0) - 1.0)
    bins = np.fft.rfftfreq(FFT, 1.0 / RATE)
    lo, mid, hi = edges[:-2, None], edges[1:-1, None], edges[2:, None]
    return np.maximum(0.0, np.minimum((bins - lo) / (mid - lo), (hi - bins) / (hi - mid)))


def _dct(n, k):
    i = np.arange(n)
    return np.cos(np.pi / n * (i[None, :] + 0.5) * np.arange(k)[:, None])


def mfcc(wave):
    frames = np.lib.stride_tricks.sliding_window_view(wave, FRAME)[::HOP]
    power = np.abs(np.fft.rfft(frames * np.hanning(FRAME), FFT)) ** 2
    logmel = np.log(power @ _filters().T + 1e-6)
    return (logmel @ _dct(BANDS, COEFFS).T)[:, :, None].astype(np.float32)
'''


@pytest.mark.skipif(shutil.which("espeak-ng") is None, reason="espeak-ng is not installed (Debian package espeak-ng)")
def test_spoken_wav_folder_through_a_user_mfcc_front_end_gives_golden_vectors_equal_to_its_output(tmp_path):
    from scipy.signal import resample_poly

    from edgedeploy.keras import tfenv
    from edgedeploy.data_sources.audio import to_float
    from edgedeploy.export.golden_vectors import quantize
    from edgedeploy.core.proc import check, run_command
    from edgedeploy.tflite.reader import read_tflite

    words = ["yes", "no", "up"]
    clips = tmp_path / "speech"
    for w in words:
        for i, (voice, speed, pitch) in enumerate([(v, s, p) for v in ("en", "en-us", "en+f3")
                                                    for s, p in ((140, 40), (175, 60), (200, 80))]):
            (clips / w).mkdir(parents=True, exist_ok=True)
            out = clips / w / f"{voice.replace('+', '_')}_{i}.wav"
            check(run_command(["espeak-ng", "-v", voice, "-s", str(speed), "-p", str(pitch), "-w", out, w],
                              timeout=60), "espeak-ng")
    (tmp_path / "frontend_mfcc.py").write_text(MFCC_FRONT_END)
    keras = tfenv.load().keras
    keras.utils.set_random_seed(3)
    net = keras.Sequential([keras.layers.Input((49, 10, 1)), keras.layers.Conv2D(8, 3, activation="relu"),
                            keras.layers.GlobalAveragePooling2D(), keras.layers.Dense(3, activation="softmax")])
    net.save(tmp_path / "kws.h5")
    run = tmp_path / "run"
    cli("optimize", tmp_path / "kws.h5", "--data", clips, "--preprocess", f"{tmp_path / 'frontend_mfcc.py'}:mfcc",
        "--leaves", "ptq", "-o", run)
    cli("compile", run, "-t", "ethos-u55-128")
    cli("export", run, "--leaf", "ptq", "-t", "ethos-u55-128", "-o", tmp_path / "fw", "--golden", "6")

    manifest = json.loads((run / "manifest.json").read_text())
    source = manifest["info"]["optimize"]["data_source"]
    assert source["labels"] == sorted(words) and source["decoding"]["file_sample_rates"] == [22050]
    assert source["preprocess"]["sha256"] == hashlib.sha256((tmp_path / "frontend_mfcc.py").read_bytes()).hexdigest()
    golden_files = sorted((tmp_path / "fw").rglob("*.npz"))
    assert golden_files, "no golden vectors written"
    with np.load(golden_files[0]) as g, np.load(run / "inputs" / "data.npz") as data:
        files = data["files"][g["row"]].tolist()
        assert len(files) == 6 and set(data["split"][g["row"]].tolist()) == {1}
        tflite = read_tflite(next(run.glob("convert/ptq/*.tflite")))
        t = tflite.inputs[0]
        namespace: dict = {}
        exec(MFCC_FRONT_END, namespace)
        for k, rel in enumerate(files):
            # the clip decoded here apart from edgedeploy: the standard library's wave reader, then the front end
            with wave.open(str(clips / rel), "rb") as w:
                pcm = np.frombuffer(w.readframes(w.getnframes()), dtype="<i2")
                rate = w.getframerate()
            audio = resample_poly(to_float(pcm), 320, 441).astype(np.float32)
            clip = np.zeros(16000, np.float32)
            clip[:min(16000, len(audio))] = audio[:16000]
            features = namespace["mfcc"](clip)
            assert rate == 22050
            assert np.array_equal(g["input_0_float"][k].reshape(features.shape), features), rel
            assert np.array_equal(g["input_0"][k].reshape(features.shape),
                                  quantize(features, t.scale[0], t.zero_point[0], t.dtype)), rel


def test_the_command_line_names_a_class_without_samples_in_one_line(tmp_path):
    from edgedeploy.keras import tfenv

    keras = tfenv.load().keras
    keras.Sequential([keras.layers.Input((800,)), keras.layers.Dense(2, activation="softmax")]).save(tmp_path / "m.h5")
    rate = 8000
    for i in range(3):
        path = tmp_path / "clips" / "go" / f"{i}.wav"
        path.parent.mkdir(parents=True, exist_ok=True)
        with wave.open(str(path), "wb") as w:
            w.setnchannels(1)
            w.setsampwidth(2)
            w.setframerate(rate)
            w.writeframes((np.sin(np.arange(rate // 10) * 0.3 * (i + 1)) * 9000).astype("<i2").tobytes())
    (tmp_path / "clips" / "stop").mkdir()
    result = CliRunner().invoke(app, ["optimize", str(tmp_path / "m.h5"), "--data", str(tmp_path / "clips"),
                                      "-o", str(tmp_path / "out"), "--leaves", "ptq"])
    assert result.exit_code == 3
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "class stop has no samples" in lines[0] and str(tmp_path / "clips") in lines[0]
    assert not (tmp_path / "out" / "inputs").exists()
