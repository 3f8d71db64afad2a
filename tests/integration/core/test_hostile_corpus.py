"""A corpus of bad or hostile inputs through the real command line and the Python API, one table per class: data
folders, WAV headers, preprocessing functions and data files; run folders whose manifest or artifacts were
tampered with; Ray addresses; counts; API arguments of the wrong kind. Each case ends in one line naming the file
or field and the fix, with its class's exit code, no traceback, within seconds, and leaves nothing behind (no
output folder, no staging folder, no temporary file).

One small run folder is made once (a 3-class Conv2D model on random 8x8 samples, `optimize --leaves ptq`, then
`compile` for ethos-u55-128); each run-folder case changes a copy of it. Data folders are given to a 3-class model
of 800 inputs (a 0.1 s clip at 8 kHz).
"""

from __future__ import annotations

import json
import os
import shutil
import struct
import time
import wave
from pathlib import Path

import numpy as np
import pytest

from helpers import one_error_line, run_in_process

TARGET = "ethos-u55-128"
INT8 = "convert/ptq/model_int8.tflite"
CASE_SECONDS = 60  # each case is refused from what it reads first: seconds, not a training run


def _leftovers(root: Path) -> list[str]:
    """Staging folders and temporary files under ``root`` (a command run by ``run_in_process`` has let go of its run
    folders, as its process would have ended)."""
    return [str(p) for p in root.rglob("*") if p.name.endswith((".part", ".tmp")) or p.name == ".edgedeploy-tmp"]


@pytest.fixture(scope="module")
def made(tmp_path_factory) -> dict[str, Path]:
    from edgedeploy.keras import tfenv

    keras = tfenv.load().keras
    root = tmp_path_factory.mktemp("corpus")
    model = root / "m.h5"
    keras.Sequential([keras.layers.Input((8, 8, 1)), keras.layers.Conv2D(4, 3, activation="relu"),
                      keras.layers.Flatten(), keras.layers.Dense(3, activation="softmax")]).save(model)
    keras.Sequential([keras.layers.Input((800,)), keras.layers.Dense(3, activation="softmax")]).save(root / "m800.h5")
    rng = np.random.default_rng(0)
    data = root / "data" / "d.npz"
    data.parent.mkdir()
    np.savez(data, x_train=rng.normal(size=(30, 8, 8, 1)).astype("float32"), y_train=rng.integers(0, 3, 30),
             x_test=rng.normal(size=(12, 8, 8, 1)).astype("float32"), y_test=rng.integers(0, 3, 12))
    run = root / "run"
    for args in (("optimize", model, "--data", data, "-o", run, "--leaves", "ptq", "--seed", "0"),
                 ("compile", run, "-t", TARGET)):
        proc = run_in_process(*args)
        assert proc.returncode == 0, proc.stderr[-3000:]
    assert not _leftovers(root)
    return {"model": model, "data": data, "run": run, "clips_model": root / "m800.h5"}


def _refused(proc, code: int, words: str, root: Path, *absent: Path) -> str:
    assert proc.returncode == code, proc.stderr[-3000:]
    line = one_error_line(proc)
    assert words in line, line
    assert not _leftovers(root), _leftovers(root)
    for path in absent:
        assert not path.exists(), sorted(str(p) for p in path.rglob("*"))[:10]
    return line


# --- data sources: optimize MODEL --data SOURCE, refused before anything is written ---------------------------------

def _wav(path: Path, rate: int = 8000, channels: int = 1, bits: int = 16, block: int | None = None,
         frames: int = 800, tag: int = 1) -> None:
    """A WAV file written field by field."""
    block = block if block is not None else max(1, channels) * ((bits + 7) // 8 or 1)
    data = bytes(frames * block)
    fmt = struct.pack("<HHIIHH", tag, channels, rate, (rate * block) & 0xFFFFFFFF, block, bits)
    body = b"WAVE" + b"fmt " + struct.pack("<I", 16) + fmt + b"data" + struct.pack("<I", len(data)) + data
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"RIFF" + struct.pack("<I", len(body)) + body)


def _clip(path: Path, seed: int) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with wave.open(str(path), "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(8000)
        w.writeframes(np.random.default_rng(seed).normal(0, 3000, 800).astype("<i2").tobytes())


def _folder(bad=None, classes=("a", "b", "c")):
    def make(root: Path) -> Path:
        folder = root / "clips"
        for c in classes:
            for i in range(2):
                _clip(folder / c / f"{i}.wav", i)
        if bad is not None:
            bad(folder)
        return folder
    return make


def _empty_classes(root: Path) -> Path:
    for c in "abc":
        (root / "clips" / c).mkdir(parents=True)
    return root / "clips"


def _npz(**arrays):
    def make(root: Path) -> Path:
        np.savez(root / "d.npz", **arrays)
        return root / "d.npz"
    return make


def _preprocessed(body: str):
    def make(root: Path) -> Path:
        (root / "front.py").write_text(f"import sys\nimport numpy as np\n\n\ndef fn(x):\n    {body}\n")
        return Path("DATA")
    return make


X = np.zeros((20, 8, 8, 1), "float32")
# (case, make the source under the test's folder (DATA: the module's data file), exit code, words of the line)
SOURCES = [
    ("WAV of 0 channels", _folder(lambda f: _wav(f / "b" / "1.wav", channels=0, block=2)), 3,
     "{src}/b/1.wav: the header's channel count is 0, outside 1-64"),
    ("WAV of 0 Hz", _folder(lambda f: _wav(f / "b" / "1.wav", rate=0)), 3,
     "{src}/b/1.wav: the header's sample rate is 0 Hz, outside"),
    ("WAV of 4,294,967,291 Hz", _folder(lambda f: _wav(f / "b" / "1.wav", rate=4_294_967_291)), 3,
     "{src}/b/1.wav: the header's sample rate is 4,294,967,291 Hz"),
    ("24-bit WAV with a 2-byte block", _folder(lambda f: _wav(f / "b" / "1.wav", bits=24, block=2)), 3,
     "{src}/b/1.wav: the header's block align is 2 bytes"),
    ("WAV in MP3 format", _folder(lambda f: _wav(f / "b" / "1.wav", tag=0x55)), 3,
     "{src}/b/1.wav: cannot be decoded as a WAV file"),
    ("text named .wav", _folder(lambda f: (f / "b" / "1.wav").write_text("hello")), 3,
     "{src}/b/1.wav: cannot be decoded as a WAV file (no RIFF/WAVE header)"),
    ("empty .wav", _folder(lambda f: (f / "b" / "1.wav").write_bytes(b"")), 3, "{src}/b/1.wav: cannot be decoded"),
    ("FIFO named .wav", _folder(lambda f: os.mkfifo(f / "c" / "2.wav")), 3, "{src}/c/2.wav is a FIFO"),
    ("link to nowhere", _folder(lambda f: os.symlink("/nonexistent", f / "a" / "x.wav")), 3,
     "{src}/a/x.wav does not exist"),
    ("empty class folders", _empty_classes, 3, "data folder {src}: classes a, b, c have no samples"),
    ("one empty class", _folder(lambda f: shutil.rmtree(f / "c") or (f / "c").mkdir()), 3,
     "data folder {src}: class c has no samples"),
    ("a folder of no classes", lambda root: (root / "clips").mkdir() or root / "clips", 3,
     "data folder {src} has no class subfolders"),
    ("images and WAV files", _folder(lambda f: (f / "a" / "i.png").write_bytes(b"\x89PNG\r\n\x1a\n")), 3,
     "data folder {src} holds both images"),
    ("one class for three outputs", _folder(classes=("only",)), 3,
     "{src}: 1 class folder (only) but the model has 3 outputs"),
    ("a loop link is no class", _folder(lambda f: os.symlink(".", f / "loop"), classes=("a", "b")), 3,
     "{src}: 2 class folders (a, b) but the model has 3 outputs"),
    ("x and y without split", _npz(x=X, y=np.zeros(20, int)), 3, "{src}: has 'y' but no 'split'"),
    ("complex samples", _npz(x_train=X.astype("complex64"), y_train=np.zeros(20, int), x_test=X[:4],
                             y_test=np.zeros(4, int)), 3, "'x_train' holds complex64 values, not real numbers"),
    ("preprocess returning a scalar", _preprocessed("return 1.0"), 3,
     "preprocess '{front}:fn' returned features of shape [] but the model's input is [8, 8, 1]"),
    ("preprocess returning the wrong shape", _preprocessed("return np.zeros(5)"), 3,
     "preprocess '{front}:fn' returned features of shape [5]"),
    ("preprocess returning None", _preprocessed("return None"), 3, "returned object values for given sample 0"),
    ("preprocess returning text", _preprocessed("return 'abc'"), 3, "returned <U3 values for given sample 0"),
    ("preprocess returning complex", _preprocessed("return x.astype('complex64')"), 3,
     "returned complex64 values for given sample 0, not real numbers"),
    ("preprocess returning NaN", _preprocessed("return x * np.nan"), 3, "returned NaN or infinite values"),
    ("preprocess of ragged shapes", _preprocessed("return np.zeros(1 + int(abs(x.sum()) * 1000) % 5)"), 3,
     "for given sample"),
    ("preprocess calling sys.exit(0)", _preprocessed("sys.exit(0)"), 2, "tried to end the command on given sample 0 "
                                                                       "(SystemExit: 0)"),
    ("preprocess raising KeyboardInterrupt", _preprocessed("raise KeyboardInterrupt"), 2,
     "tried to end the command on given sample 0 (KeyboardInterrupt)"),
]


@pytest.mark.parametrize("make, code, words", [c[1:] for c in SOURCES], ids=[c[0] for c in SOURCES])
def test_a_data_source_the_model_cannot_use_is_one_line_and_nothing_is_written(made, tmp_path, make, code, words):
    src = make(tmp_path)
    extra = ["--preprocess", f"{tmp_path / 'front.py'}:fn"] if src == Path("DATA") else []
    src = made["data"] if src == Path("DATA") else src
    recipe = tmp_path / "r.toml"
    recipe.write_text("[data]\nsample_rate = 8000\nclip_seconds = 0.1\n")
    out = tmp_path / "out"
    started = time.perf_counter()
    model = made["clips_model"] if src.is_dir() else made["model"]  # (800 samples: 0.1 s at 8 kHz)
    proc = run_in_process("optimize", model, "--data", src, "-o", out, "--leaves", "ptq", "--recipe", recipe, *extra)
    _refused(proc, code, words.format(src=src, front=tmp_path / "front.py"), tmp_path, out)
    assert time.perf_counter() - started < CASE_SECONDS


# --- run folders whose manifest or artifacts were changed ----------------------------------------------------------

def _edit(change):
    def make(run: Path) -> None:
        doc = json.loads((run / "manifest.json").read_text())
        change(doc)
        (run / "manifest.json").write_text(json.dumps(doc))
    return make


def _outputs(doc: dict):
    return [a for s in doc["stages"] for a in s["outputs"]]


def _int8_at(path: str):
    def change(doc: dict) -> None:
        for a in _outputs(doc):
            if a["path"] == INT8:
                a["path"] = path
    return change


def _linked(target: str | None):
    def make(run: Path) -> None:
        path = run / INT8
        if target is None:  # the same bytes, moved out of the folder and linked back
            shutil.copyfile(path, run.parent / "elsewhere.tflite")
        path.unlink()
        os.symlink(target or run.parent / "elsewhere.tflite", path)
    return make


def _replace_manifest(text: str):
    return lambda run: (run / "manifest.json").write_text(text)


def _manifest_folder(run: Path) -> None:
    (run / "manifest.json").unlink()
    (run / "manifest.json").mkdir()


TAMPERED = [
    ("manifest of invalid JSON", _replace_manifest("{not json"), "{run}/manifest.json is not valid JSON"),
    ("manifest of a list", _replace_manifest("[]"), "{run}/manifest.json is not an edgedeploy manifest"),
    ("manifest of a future schema", _edit(lambda d: d.__setitem__("schema_version", 99)),
     "{run}/manifest.json has schema version 99, newer than this edgedeploy understands (1)"),
    ("manifest of a text schema version", _edit(lambda d: d.__setitem__("schema_version", "1")),
     "{run}/manifest.json has schema version '1'"),
    ("manifest whose stages are text", _edit(lambda d: d.__setitem__("stages", "x")), "{run}/manifest.json is damaged"),
    ("manifest whose outputs are null", _edit(lambda d: [s.__setitem__("outputs", None) for s in d["stages"]]),
     "{run}/manifest.json is damaged"),
    ("manifest is a folder", _manifest_folder, "{run}/manifest.json is a folder, not a file"),
    ("record pointing up and out", _edit(_int8_at("../../../etc/passwd")),
     "records artifact 'int8_model' at '../../../etc/passwd', outside the run folder"),
    ("record of an absolute path", _edit(_int8_at("/etc/passwd")),
     "records artifact 'int8_model' at '/etc/passwd', outside the run folder"),
    ("sha256 of the wrong length", _edit(lambda d: [a.__setitem__("sha256", "abc") for a in _outputs(d)]),
     "was changed after"),
    ("artifact linked out of the folder", _linked(None),
     f"records artifact 'int8_model' at '{INT8}', outside the run folder (a link there leads to"),
    ("artifact linked to /etc/passwd", _linked("/etc/passwd"), "(a link there leads to /etc/passwd)"),
]
COMMANDS = {  # the commands that read a run folder back, with what they are given after it
    "report": [],
    "compile": ["-t", TARGET],
    "export": ["--leaf", "ptq", "-t", TARGET, "-o", "OUT", "--golden", "0"],
    "verify": ["--leaf", "ptq", "-t", TARGET, "-n", "1"],
}


@pytest.mark.parametrize("command", list(COMMANDS))
@pytest.mark.parametrize("change, words", [c[1:] for c in TAMPERED], ids=[c[0] for c in TAMPERED])
def test_a_tampered_run_folder_is_refused_in_one_line_by_every_command_that_reads_it(made, tmp_path, change, words,
                                                                                       command):
    run = tmp_path / "run"
    shutil.copytree(made["run"], run, symlinks=True)
    change(run)
    out = tmp_path / "out"
    proc = run_in_process(command, run, *[str(out) if a == "OUT" else a for a in COMMANDS[command]])
    _refused(proc, 3, words.format(run=run), tmp_path, out)


# --- compiled models whose driver payload lies (the manifest's hashes made to match, so verify reads it) ------------

VELA = f"compile/ptq/{TARGET}/model_int8_vela.tflite"


def _payload(edit):
    """Rewrite the Ethos-U driver payload (``COP1``, then driver actions) of the run's compiled model with
    ``edit(words, i)`` (``i``: the index of the command-stream action), and record the new bytes' hash."""
    def make(run: Path) -> None:
        import hashlib

        path = run / VELA
        data = bytearray(path.read_bytes())
        at = data.find(b"COP1")
        words = list(struct.unpack_from("<64I", data, at))
        i = next(k for k in range(1, 64) if words[k] & 0xFF == 0x02)  # DA_CMD_STREAM
        edit(words, i)
        struct.pack_into("<64I", data, at, *words)
        path.write_bytes(bytes(data))
        _edit(lambda d: [a.update(sha256=hashlib.sha256(data).hexdigest(), bytes=len(data)) for a in _outputs(d)
                         if a["path"] == VELA])(run)
    return make


def _set(k: int, value: int):
    return lambda words, i: words.__setitem__(i + k, value)


PAYLOADS = [  # (case, edit, words of the line)
    ("stream length past the buffer", lambda w, i: w.__setitem__(i, 0x02 | (0xFF << 8) | (0xFFFF << 16)),
     "the command stream is truncated"),
    ("stream length of one word too many", lambda w, i: w.__setitem__(i, w[i] + (1 << 16)),
     "the command stream is truncated"),
    ("unknown driver action", _set(0, 0x7F), "driver action 0x7f at word"),
    ("no COP1 magic", lambda w, i: w.__setitem__(0, 0), "the command stream is not an Ethos-U driver payload"),
]


@pytest.mark.parametrize("edit, words", [c[1:] for c in PAYLOADS], ids=[c[0] for c in PAYLOADS])
def test_verify_refuses_a_driver_payload_that_lies_about_itself(made, tmp_path, edit, words):
    run = tmp_path / "run"
    shutil.copytree(made["run"], run, symlinks=True)
    _payload(edit)(run)
    started = time.perf_counter()
    proc = run_in_process("verify", run, "--leaf", "ptq", "-t", TARGET, "-n", "1")
    line = _refused(proc, 11, words, tmp_path)
    assert str(run / VELA) in line, line
    assert time.perf_counter() - started < CASE_SECONDS


# --- counts and Ray addresses ----------------------------------------------------------------------------------------

COUNTS = [  # (case, command after the run folder, exit code, words of the line; None: it succeeds)
    ("verify -n 10**12", ["verify", "--leaf", "ptq", "-t", TARGET, "-n", str(10**12)], 2,
     "--count is 1,000,000,000,000. pass a number of cases from 1 to 10,000"),
    ("verify -n -5", ["verify", "--leaf", "ptq", "-t", TARGET, "-n", "-5"], 2, "--count is -5"),
    ("export --golden -1", ["export", "--leaf", "ptq", "-t", TARGET, "-o", "OUT", "--golden", "-1"], 2,
     "--golden is -1. pass a number of golden cases >= 0"),
    ("export --leaf ../../etc", ["export", "--leaf", "../../etc", "-t", TARGET, "-o", "OUT"], 2,
     "has no variant '../../etc'"),
]


@pytest.mark.parametrize("args, code, words", [c[1:] for c in COUNTS], ids=[c[0] for c in COUNTS])
def test_a_count_or_name_out_of_range_is_one_line(made, tmp_path, args, code, words):
    out = tmp_path / "out"
    proc = run_in_process(args[0], made["run"], *[str(out) if a == "OUT" else a for a in args[1:]])
    _refused(proc, code, words, tmp_path, out)


@pytest.mark.parametrize("golden", [10**9, 10**30])
def test_a_huge_golden_count_writes_the_evaluation_rows_there_are(made, tmp_path, golden):
    out = tmp_path / "fw"
    proc = run_in_process("export", made["run"], "--leaf", "ptq", "-t", TARGET, "-o", out, "--golden", golden)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "only 12 evaluation rows" in proc.stderr
    with np.load(out / "golden.npz") as g:
        assert all(len(g[k]) == 12 for k in g.files)


RAY = [  # (--ray-address, exit code, words of the line)
    ("[::1]:1", 6, "nothing answers at Ray address [::1]:1 (--ray-address)"),
    ("127.0.0.1:1", 6, "nothing answers at Ray address 127.0.0.1:1 (--ray-address)"),
    ("ray://127.0.0.1:1", 6, "nothing answers at Ray address ray://127.0.0.1:1"),
    ("host:99999", 2, "Ray address 'host:99999' is not HOST:PORT, ray://HOST:PORT or auto"),
    ("127.0.0.1:0", 2, "Ray address '127.0.0.1:0' is not HOST:PORT"),
    ("1.2.3.4:-1", 2, "Ray address '1.2.3.4:-1' is not HOST:PORT"),
    ("[::1", 2, "Ray address '[::1' is not HOST:PORT"),
    (":", 2, "Ray address ':' is not HOST:PORT"),
    ("a" * 300 + ":1", 2, "is not HOST:PORT"),
    ("a" * 70 + ".example:1", 6, "unknown host"),
]


@pytest.mark.parametrize("address, code, words", RAY, ids=[r[0][:24] for r in RAY])
def test_a_ray_address_where_nothing_answers_is_one_line_and_leaves_no_staging(made, tmp_path, address, code, words):
    pytest.importorskip("ray")
    run = tmp_path / "run"
    shutil.copytree(made["run"], run, symlinks=True)
    shutil.rmtree(run / "compile")  # so the compile runs, and joins Ray
    started = time.perf_counter()
    proc = run_in_process("compile", run, "-t", TARGET, "--executor", "ray", "--ray-address", address)
    _refused(proc, code, words, tmp_path, run / "compile")
    assert time.perf_counter() - started < CASE_SECONDS


def test_optimize_at_a_dead_ray_address_leaves_no_staging(made, tmp_path):
    pytest.importorskip("ray")
    out = tmp_path / "out"
    proc = run_in_process("optimize", made["model"], "--data", made["data"], "-o", out, "--leaves", "ptq",
                          "--executor", "ray", "--ray-address", "127.0.0.1:1")
    _refused(proc, 6, "nothing answers at Ray address 127.0.0.1:1 (--ray-address)", tmp_path)


# --- the Python API's arguments --------------------------------------------------------------------------------------

def _api_cases():
    def run(made):
        return _run_of(made["run"])

    for bad, kind in (({"a": 1}, "a dict"), (None, "None"), (5, "an int")):
        yield f"optimize(model={kind})", lambda m, b=bad: _optimize(b, m["data"], m["out"]), f"model is {kind}"
        yield f"optimize(data={kind})", lambda m, b=bad: _optimize(m["model"], b, m["out"]), "data"
        yield f"optimize(out={kind})", lambda m, b=bad: _optimize(m["model"], m["data"], b), f"out is {kind}"
        yield f"OptimizeRun({kind})", lambda m, b=bad: _run_of(b).report(), f"run_dir is {kind}"
        yield f"compile({kind})", lambda m, b=bad: run(m).compile(b), f"targets is {kind}"
        yield f"export(out={kind})", lambda m, b=bad: run(m).export("ptq", TARGET, b), f"out is {kind}"
        if bad is not None:
            yield f"optimize(leaves={kind})", lambda m, b=bad: _optimize(m["model"], m["data"], m["out"], leaves=b), \
                f"leaves is {kind}"
        if isinstance(bad, dict):  # (None is the default, 5 a fine count)
            yield f"compile(jobs={kind})", lambda m, b=bad: run(m).compile(TARGET, jobs=b), f"jobs is {kind}"
            yield f"export(golden={kind})", lambda m, b=bad: run(m).export("ptq", TARGET, m["out"], golden=b), \
                f"golden is {kind}"
        yield f"export(leaf={kind})", lambda m, b=bad: run(m).export(b, TARGET, m["out"]), f"leaf is {kind}"
        yield f"export(target={kind})", lambda m, b=bad: run(m).export("ptq", b, m["out"]), f"target is {kind}"
    yield "optimize(bogus_key=1)", lambda m: _optimize(m["model"], m["data"], m["out"], bogus_key=1), \
        "unknown key `bogus_key`"


def _optimize(*args, **kwargs):
    import edgedeploy

    return edgedeploy.optimize(*args, **kwargs)


def _run_of(run_dir):
    from edgedeploy.interactive.optimize_run import OptimizeRun

    return OptimizeRun(run_dir, {})


API = list(_api_cases())


@pytest.mark.parametrize("call, words", [c[1:] for c in API], ids=[c[0] for c in API])
def test_an_api_argument_of_the_wrong_kind_is_a_usage_error_naming_it(made, tmp_path, call, words):
    from edgedeploy.errors import UsageError

    out = tmp_path / "out"
    with pytest.raises(UsageError) as err:
        call({**made, "out": out})
    assert words in err.value.one_line(), err.value.one_line()
    assert not out.exists() and not _leftovers(tmp_path)
