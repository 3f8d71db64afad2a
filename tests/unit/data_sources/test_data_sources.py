"""Data sources without TensorFlow: class folders (listing, labels, splits), WAV decoding and resampling, the
preprocessing function (loaded only when asked for, hashed), in-memory arrays and calibration generators."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
import wave
from pathlib import Path

import numpy as np
import pytest

from edgedeploy.config.data import load_dataset
from edgedeploy.data_sources import DATA_FILE, DataOptions, prepare_data
from edgedeploy.data_sources.audio import decode_wavs
from edgedeploy.data_sources.folders import list_folder
from edgedeploy.data_sources.memory import calibration_samples, from_memory
from edgedeploy.data_sources.preprocess import load_preprocess
from edgedeploy.errors import InvalidInputError, UsageError


def write_wav(path: Path, samples: np.ndarray, rate: int) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with wave.open(str(path), "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(rate)
        w.writeframes(np.asarray(samples, dtype="<i2").tobytes())


def tone(freq: float, rate: int, seconds: float, seed: int) -> np.ndarray:
    t = np.arange(int(rate * seconds)) / rate
    noise = np.random.default_rng(seed).normal(0, 0.01, len(t))
    return (np.clip(0.5 * np.sin(2 * np.pi * freq * t) + noise, -1, 1) * 32767).astype(np.int16)


@pytest.fixture
def wav_folder(tmp_path):
    root = tmp_path / "clips"
    for c, freq in (("up", 440.0), ("down", 220.0)):
        for i in range(5):
            write_wav(root / c / f"{i:02d}.wav", tone(freq + 10 * i, 8000, 0.5 + 0.1 * i, i), 8000)
    (root / "README.txt").write_text("not a sample")
    (root / "up" / ".hidden.wav").write_bytes(b"")
    return root


def test_labels_follow_sorted_folder_names_and_the_split_is_seeded_and_stratified(wav_folder):
    a = list_folder(wav_folder, 0.4, seed=3)
    b = list_folder(wav_folder, 0.4, seed=3)
    assert a.labels == ["down", "up"] and a.kind == "audio"
    assert a.files[0] == "down/00.wav" and a.files[-1] == "up/04.wav"
    assert np.array_equal(a.split, b.split)
    for cls in (0, 1):
        assert int(np.sum((a.y == cls) & (a.split == 1))) == 2  # 0.4 of 5 from each class
    assert a.left_out == 2  # README.txt and the hidden file
    c = list_folder(wav_folder, 0.4, seed=4)
    assert not np.array_equal(a.split, c.split) or not np.array_equal(a.split, list_folder(wav_folder, 0.4, 5).split)


def test_train_and_test_subfolders_are_the_splits(tmp_path):
    for split, n in (("train", 3), ("test", 2)):
        for c in ("b", "a"):
            for i in range(n):
                write_wav(tmp_path / split / c / f"{i}.wav", tone(300, 8000, 0.2, i), 8000)
    got = list_folder(tmp_path, 0.2, 0)
    assert got.labels == ["a", "b"]
    assert got.split.tolist() == [0] * 6 + [1] * 4
    assert got.files[:2] == ["train/a/0.wav", "train/a/1.wav"] and got.files[6] == "test/a/0.wav"
    assert "train/" in got.split_from and "test/" in got.split_from


def test_classes_without_samples_are_named(tmp_path):
    write_wav(tmp_path / "yes" / "0.wav", tone(300, 8000, 0.2, 0), 8000)
    (tmp_path / "no").mkdir()
    (tmp_path / "maybe").mkdir()
    (tmp_path / "maybe" / "notes.txt").write_text("x")
    with pytest.raises(InvalidInputError) as err:
        list_folder(tmp_path, 0.2, 0)
    assert "classes maybe, no have no samples" in err.value.one_line()


def test_an_evaluation_class_missing_from_train_is_named(tmp_path):
    write_wav(tmp_path / "train" / "yes" / "0.wav", tone(300, 8000, 0.2, 0), 8000)
    write_wav(tmp_path / "test" / "yes" / "0.wav", tone(300, 8000, 0.2, 1), 8000)
    write_wav(tmp_path / "test" / "stop" / "0.wav", tone(300, 8000, 0.2, 2), 8000)
    with pytest.raises(InvalidInputError, match="class stop has no samples in"):
        list_folder(tmp_path, 0.2, 0)


def test_images_and_wav_files_in_one_folder_are_refused(tmp_path):
    write_wav(tmp_path / "a" / "0.wav", tone(300, 8000, 0.2, 0), 8000)
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / "0.png").write_bytes(b"\x89PNG")
    with pytest.raises(InvalidInputError, match="both images"):
        list_folder(tmp_path, 0.2, 0)


def test_wav_files_are_resampled_and_cut_or_padded(wav_folder):
    files = ["down/00.wav", "down/04.wav"]
    x, digests, rates = decode_wavs(wav_folder, files, 16000, 0.75)
    assert x.shape == (2, 12000) and x.dtype == np.float32 and rates == [8000, 8000]
    assert np.all(x[0, 8000:] == 0)  # 0.5 s at 16 kHz, then zeros
    assert np.any(x[1, -100:] != 0)  # 0.9 s: cut at 0.75 s
    assert digests[0] == hashlib.sha256((wav_folder / files[0]).read_bytes()).hexdigest()
    # a 220 Hz tone keeps its frequency through the resampler
    spectrum = np.abs(np.fft.rfft(x[0, :8000]))
    assert abs(np.argmax(spectrum) * 16000 / 8000 - 220) <= 2


def test_a_file_that_cannot_be_decoded_is_named_in_one_line(wav_folder):
    bad = wav_folder / "up" / "03.wav"
    bad.write_bytes(b"RIFF\x00\x00\x00\x00WAVEjunk")
    with pytest.raises(InvalidInputError) as err:
        prepare_data(wav_folder, [4000], wav_folder.parent / "out", DataOptions(sample_rate=8000, clip_seconds=0.5))
    line = err.value.one_line()
    assert str(bad) in line and "\n" not in line and "cannot be decoded as a WAV file" in line
    assert not (wav_folder.parent / "out" / DATA_FILE).exists()


def test_a_wav_folder_becomes_one_npz_with_every_file_recorded(wav_folder, tmp_path):
    out = tmp_path / "run"
    path, record = prepare_data(wav_folder, [4000, 1], out, DataOptions(sample_rate=8000, clip_seconds=0.5,
                                                                        eval_fraction=0.4, seed=1))
    assert path == out / DATA_FILE
    ds = load_dataset(path, (4000, 1), 2)
    assert ds.labels == ["down", "up"] and len(ds.x_fit) == 6 and len(ds.x_eval) == 4
    assert record["labels_from"] == "class folder names, sorted"
    assert [f["file"] for f in record["files"]] == sorted(f["file"] for f in record["files"])
    assert {f["split"] for f in record["files"]} == {"fine-tune", "evaluation"}
    assert record["decoding"]["resampler"] == "scipy.signal.resample_poly"
    with np.load(path) as npz:
        assert npz["files"].tolist() == [f["file"] for f in record["files"]]
    json.dumps(record)  # what the manifest stores
    again, _ = prepare_data(wav_folder, [4000, 1], out, DataOptions(sample_rate=8000, clip_seconds=0.5,
                                                                   eval_fraction=0.4, seed=1))
    assert hashlib.sha256(again.read_bytes()).hexdigest() == ds.sha256  # same samples, same bytes: stages reused


FRONT_END = '''
import numpy as np

def energy(wave):
    frames = wave[: len(wave) // 100 * 100].reshape(-1, 100)
    return np.log(np.mean(frames ** 2, axis=1) + 1e-6)[:, None]

def broken(wave):
    raise RuntimeError("no front end here")
'''


def test_the_preprocessing_function_runs_on_every_sample_and_is_recorded_with_its_hash(wav_folder, tmp_path):
    module = tmp_path / "frontend_e.py"
    module.write_text(FRONT_END)
    opts = DataOptions(preprocess=f"{module}:energy", sample_rate=8000, clip_seconds=0.5)
    path, record = prepare_data(wav_folder, [40, 1], tmp_path / "run", opts)
    assert record["preprocess"] == {"ref": f"{module}:energy", "source": str(module.resolve()),
                                    "sha256": hashlib.sha256(module.read_bytes()).hexdigest()}
    x, _, _ = decode_wavs(wav_folder, ["down/00.wav"], 8000, 0.5)
    frames = x[0].reshape(-1, 100)
    with np.load(path) as npz:
        assert npz["x"].shape == (10, 40, 1)
        assert np.array_equal(npz["x"][0], np.log(np.mean(frames ** 2, axis=1) + 1e-6)[:, None].astype(np.float32))
    with pytest.raises(UsageError) as err:
        prepare_data(wav_folder, [40, 1], tmp_path / "run2", DataOptions(preprocess=f"{module}:broken",
                                                                        sample_rate=8000, clip_seconds=0.5))
    assert "no front end here" in err.value.one_line() and "down/00.wav" in err.value.one_line()


def test_preprocessing_code_is_imported_only_when_named(tmp_path):
    """An .npz without --preprocess is used as it is; a module on the path is not imported by loading a recipe."""
    (tmp_path / "fe_probe.py").write_text("def f(x):\n    return x\n")
    code = ("import sys; sys.path.insert(0, sys.argv[1]); from edgedeploy.config.recipe import load_recipe; "
            "r = load_recipe(overrides={'preprocess': 'fe_probe:f'}); assert r.preprocess == 'fe_probe:f'; "
            "assert 'fe_probe' not in sys.modules; "
            "from edgedeploy.data_sources.preprocess import load_preprocess; p = load_preprocess(r.preprocess); "
            "assert 'fe_probe' in sys.modules and p.fn(3) == 3")
    subprocess.run([sys.executable, "-c", code, str(tmp_path)], check=True)
    npz = tmp_path / "d.npz"
    np.savez(npz, x=np.zeros((4, 2), np.float32), y=np.array([0, 1, 0, 1]), split=np.array([0, 0, 1, 1]))
    assert prepare_data(npz, [2], tmp_path / "run", DataOptions()) == (npz, None)


def test_a_preprocessing_reference_that_cannot_be_loaded_is_one_usage_error(tmp_path):
    for ref, words in (("nocolon", "is not module:function"), ("no_such_module_xyz:f", "cannot be loaded"),
                       (f"{tmp_path / 'missing.py'}:f", "does not exist")):
        with pytest.raises((UsageError, InvalidInputError), match=words):
            load_preprocess(ref)


def test_arrays_in_memory_are_split_stratified_and_calibration_generators_are_read():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(40, 3)).astype(np.float32)
    y = np.repeat([0, 1, 2, 3], 10)
    s = from_memory((x, y), 1, eval_fraction=0.2, seed=0)
    assert [int(np.sum((y == c) & (s.split == 1))) for c in range(4)] == [2, 2, 2, 2]
    two = from_memory(((x[:30], y[:30]), (x[30:], y[30:])), 1, eval_fraction=0.2, seed=0)
    assert two.split.tolist() == [0] * 30 + [1] * 10

    def representative():
        for i in range(7):
            yield [x[i:i + 1]]

    cal, read = calibration_samples(representative, 1, 500)
    assert cal.shape == (7, 3) and np.array_equal(cal, x[:7]) and read["stopped_at"] is None
    assert calibration_samples([x[0], x[1]], 1, 500)[0].shape == (2, 3)
    with pytest.raises(UsageError, match="yields 2 inputs"):
        calibration_samples(lambda: iter([[x[0], x[1]]]), 1, 500)
    with pytest.raises(UsageError, match=r"the given data is an int, not \(x, y\) arrays or a tf.data.Dataset"):
        from_memory(5, 1, eval_fraction=0.2, seed=0)


def test_samples_written_with_calibration_are_read_back_for_calibration(tmp_path):
    from edgedeploy.data_sources import Samples

    x = np.arange(60, dtype=np.float32).reshape(20, 3)
    s = Samples(x, np.repeat([0, 1], 10), np.array([0] * 8 + [1] * 2 + [0] * 8 + [1] * 2, np.int8), ["a", "b"],
                x_calibration=x[:5] + 0.5, info={"source": "arrays"})
    path, record = prepare_data(s, [3], tmp_path, DataOptions())
    assert record["n_calibration"] == 5
    ds = load_dataset(path, (3,), 2)
    got, described = ds.calibration(500)
    assert np.array_equal(got, x[:5] + 0.5) and "x_calibration" in described


def test_an_npz_runs_through_a_named_preprocessing_function_with_its_split_and_labels(tmp_path):
    module = tmp_path / "frontend_sq.py"
    module.write_text("import numpy as np\n\ndef square(x):\n    return np.asarray(x) ** 2\n")
    npz = tmp_path / "raw.npz"
    x = np.arange(24, dtype=np.float32).reshape(6, 4)
    np.savez(npz, x_train=x[:4], y_train=np.array([0, 1, 0, 1]), x_test=x[4:], y_test=np.array([1, 0]),
             classes=np.array(["off", "on"]))
    path, record = prepare_data(npz, [4], tmp_path / "run", DataOptions(preprocess=f"{module}:square"))
    assert record["source"] == "npz" and record["preprocess"]["ref"] == f"{module}:square"
    ds = load_dataset(path, (4,), 2)
    assert np.array_equal(ds.x_fit, x[:4] ** 2) and np.array_equal(ds.x_eval, x[4:] ** 2)
    assert ds.labels == ["off", "on"] and ds.y_eval.tolist() == [1, 0]


ENDINGS = '''import os
import signal
import sys


def exits0(x):
    raise SystemExit(0)


def exits3(x):
    sys.exit(3)


def interrupts(x):
    raise KeyboardInterrupt


def generator_exit(x):
    raise GeneratorExit("closed")


def prints(x):
    print("features of", len(x))
    sys.stdout.flush()
    os.write(1, b"written to descriptor 1\\n")
    return x


def signalled(x):
    os.kill(os.getpid(), signal.SIGINT)
    return x
'''


@pytest.mark.parametrize("fn,words", [
    ("exits0", "tried to end the command on raw.npz row 0 (SystemExit: 0). a preprocessing function returns"),
    ("exits3", "tried to end the command on raw.npz row 0 (SystemExit: 3)"),
    ("interrupts", "tried to end the command on raw.npz row 0 (KeyboardInterrupt)"),
    ("generator_exit", "tried to end the command on raw.npz row 0 (GeneratorExit: closed)"),
])
def test_a_preprocessing_function_that_ends_the_process_is_one_usage_error_naming_it(tmp_path, fn, words):
    """SystemExit, a KeyboardInterrupt it raises itself and any other BaseException from the user's function end
    the command with one line naming the function and the sample (exit 2), and nothing is written."""
    from edgedeploy.data_sources.preprocess import apply

    (tmp_path / "ends.py").write_text(ENDINGS)
    pre = load_preprocess(f"{tmp_path / 'ends.py'}:{fn}")
    with pytest.raises(UsageError) as err:
        apply(pre, np.zeros((3, 2), np.float32), ["raw.npz row 0", "raw.npz row 1", "raw.npz row 2"], "given")
    line = err.value.one_line()
    assert f"preprocess '{tmp_path / 'ends.py'}:{fn}' {words}" in line and err.value.exit_code == 2


@pytest.mark.parametrize("body,words", [
    ("import sys\nprint('loading')\nsys.exit(0)\n", "cannot be loaded (SystemExit: 0)"),
    ("raise KeyboardInterrupt\n", "cannot be loaded (KeyboardInterrupt)"),
    ("raise SystemExit('bye')\n", "cannot be loaded (SystemExit: bye). fix the module"),
])
def test_a_module_that_ends_the_process_while_loading_is_one_usage_error(tmp_path, capfd, body, words):
    (tmp_path / "fe_end.py").write_text(body)
    with pytest.raises(UsageError) as err:
        load_preprocess(f"{tmp_path / 'fe_end.py'}:f")
    assert words in err.value.one_line() and capfd.readouterr().out == ""  # (what it printed went to stderr)
    sys.path.insert(0, str(tmp_path))
    try:
        with pytest.raises(UsageError) as err:
            load_preprocess("fe_end:f")
        assert words in err.value.one_line() and capfd.readouterr().out == ""
    finally:
        sys.path.remove(str(tmp_path))
        sys.modules.pop("fe_end", None)


def test_what_a_preprocessing_function_prints_goes_to_stderr_and_stdout_is_restored(tmp_path, capfd):
    from edgedeploy.data_sources.preprocess import apply

    (tmp_path / "ends.py").write_text(ENDINGS)
    got = apply(load_preprocess(f"{tmp_path / 'ends.py'}:prints"), np.ones((2, 3), np.float32), None, "given")
    assert got.shape == (2, 3)
    print("after")
    out, err = capfd.readouterr()
    assert out == "after\n"  # only what is printed after the user's code ran
    assert err.count("features of 3") == 2 and err.count("written to descriptor 1") == 2


def test_an_interrupt_by_a_signal_while_the_function_runs_stays_an_interrupt(tmp_path):
    import signal

    from edgedeploy.data_sources.preprocess import apply

    (tmp_path / "ends.py").write_text(ENDINGS)
    # Python's own Ctrl-C handler, as in a command run from a terminal: a process started in the background of a
    # shell without job control inherits SIGINT ignored, and Python then installs no handler of its own
    old = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with pytest.raises(KeyboardInterrupt):
            apply(load_preprocess(f"{tmp_path / 'ends.py'}:signalled"), np.ones((2, 3), np.float32), None, "given")
    finally:
        signal.signal(signal.SIGINT, old)
