"""Every command that reads back an artifact a manifest records checks its sha256 first; and the data file a run
recorded is followed (by `export --golden N`) only while it holds the recorded bytes.

One small real run, made once: the bundled example's float DS-CNN through `optimize --leaves ptq` (no training)
with its data in a folder of its own (outside the run folder, as users keep it), compiled for ethos-u55-128 with
`compile RUN`, exported with golden vectors. Each case changes one byte of one recorded file of a copy of it.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from helpers import balanced_part, one_error_line, run_in_process

REPO = Path(__file__).resolve().parents[3]
MODEL = REPO / "examples" / "kws_tree" / "dscnn_mlperf_float.h5"
DATA = REPO / "examples" / "kws_tree" / "speech_commands_subset.npz"
TARGET = "ethos-u55-128"
INT8 = "convert/ptq/model_int8.tflite"
VELA = f"compile/ptq/{TARGET}/model_int8_vela.tflite"
BASELINE = "optimize/baseline/model.h5"
PREPROCESS = "def half(x):\n    return x * 0.5\n"


def _ok(*args) -> None:
    proc = run_in_process(*args)
    assert proc.returncode == 0, proc.stderr[-3000:]


def _small_data(dest: Path, stratified) -> Path:
    """A seeded, class-balanced part of the example's data (48 fine-tune and 36 evaluation clips) at ``dest``: what
    is checked is which files are read back, not what the model scores on them."""
    return balanced_part(DATA, dest, {0: 48, 1: 36}, stratified)


@pytest.fixture(scope="module")
def made(tmp_path_factory, stratified) -> dict[str, Path]:
    """The run folder (optimized, compiled), the data file it recorded (outside it) and a bundle exported from it."""
    root = tmp_path_factory.mktemp("integrity")
    data = root / "data" / "d.npz"
    data.parent.mkdir()
    _small_data(data, stratified)
    run = root / "run"
    _ok("optimize", MODEL, "--data", data, "-o", run, "--leaves", "ptq", "--seed", "0")
    _ok("compile", run, "-t", TARGET)
    _ok("export", run, "--leaf", "ptq", "-t", TARGET, "-o", root / "fw", "--golden", "2", "--data", data)
    return {"run": run, "data": data, "fw": root / "fw"}


@pytest.fixture(scope="module")
def preprocessed(tmp_path_factory, stratified) -> Path:
    """A run whose samples went through a preprocessing function (so its data file is the run's inputs/data.npz)."""
    root = tmp_path_factory.mktemp("preprocessed")
    (root / "front.py").write_text(PREPROCESS)
    run = root / "run"
    data = _small_data(root / "d.npz", stratified)
    _ok("optimize", MODEL, "--data", data, "-o", run, "--leaves", "ptq", "--preprocess", f"{root / 'front.py'}:half")
    _ok("compile", run, "-t", TARGET)
    return run


def _flip(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01
    path.write_bytes(bytes(data))


def _state(folder: Path) -> dict[str, str]:
    """Every file under ``folder`` with its sha256: what a refused command must leave exactly as it was."""
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


WRITERS = {INT8: "convert/ptq", VELA: f"compile/ptq/{TARGET}", BASELINE: "optimize/baseline"}  # (bundle files: export)
# (command, the folder whose file is changed, the file, the arguments after the folder); OUT: an output path
CASES = [
    ("compile", "run", INT8, ["-t", TARGET]),
    ("report", "run", INT8, []),
    ("report", "run", BASELINE, ["-f", "html", "-o", "OUT"]),
    ("export", "run", INT8, ["--leaf", "ptq", "-t", TARGET, "-o", "OUT", "--golden", "0"]),
    ("export", "run", VELA, ["--leaf", "ptq", "-t", TARGET, "-o", "OUT", "--golden", "0"]),
    ("verify", "run", INT8, ["--leaf", "ptq", "-t", TARGET, "-n", "1"]),
    ("verify", "run", VELA, ["--leaf", "ptq", "-t", TARGET, "-n", "1"]),
    ("emulate", "fw", "ptq_cpu.c", []),
    ("emulate", "fw", "golden.npz", []),
    ("emulate", "fw", "CMakeLists.txt", []),
]


@pytest.mark.parametrize(("command", "folder", "name", "more"), CASES,
                         ids=[f"{c[0]}-{Path(c[2]).name}" for c in CASES])
def test_a_changed_artifact_is_refused_in_one_line_and_nothing_is_written(made, tmp_path, command, folder, name,
                                                                          more):
    copy = tmp_path / folder
    shutil.copytree(made[folder], copy, symlinks=True)
    _flip(copy / name)
    before = _state(copy)
    out = tmp_path / "out"
    proc = run_in_process(command, copy, *[str(out) if a == "OUT" else a for a in more])
    assert proc.returncode == 3, proc.stderr[-3000:]
    line = one_error_line(proc)
    writer = WRITERS.get(name, "`edgedeploy export`")
    assert f"{copy / name} was changed after {writer} wrote it" in line and "manifest.json" in line, line
    assert _state(copy) == before and not out.exists()
    if folder == "run":  # the fix names the command that writes the file again
        assert ("edgedeploy optimize" if name != VELA else f"edgedeploy compile {copy} -t {TARGET}") in line


def test_compile_writes_a_changed_compiled_model_again(made, tmp_path):
    copy = tmp_path / "run"
    shutil.copytree(made["run"], copy, symlinks=True)
    recorded = {a["role"]: a for s in json.loads((copy / "manifest.json").read_text())["stages"]
                if s["id"] == f"compile/ptq/{TARGET}" for a in s["outputs"]}["vela_model"]
    _flip(copy / VELA)
    proc = run_in_process("compile", copy, "-t", TARGET)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert f"stage compile/ptq/{TARGET}: an output was changed or removed after the stage wrote it" in proc.stderr
    assert hashlib.sha256((copy / VELA).read_bytes()).hexdigest() == recorded["sha256"]


def test_export_follows_the_recorded_data_file_while_it_holds_the_recorded_bytes(made, tmp_path):
    fw = tmp_path / "fw"
    _ok("export", made["run"], "--leaf", "ptq", "-t", TARGET, "-o", fw, "--golden", "8")
    doc = json.loads((fw / "manifest.json").read_text())
    assert doc["golden"]["count"] == 8 and doc["golden"]["data"]["path"] == str(made["data"].resolve())
    given = np.load(made["fw"] / "golden.npz")["input_0"]  # the same rows as with --data
    assert np.array_equal(np.load(fw / "golden.npz")["input_0"][:2], given)


@pytest.mark.parametrize("change", ["flipped", "missing"])
def test_export_refuses_a_recorded_data_file_that_changed(made, tmp_path, change):
    copy = tmp_path / "run"
    shutil.copytree(made["run"], copy, symlinks=True)
    data = tmp_path / "d.npz"  # the file the copy records, changed
    shutil.copyfile(made["data"], data)
    doc = json.loads((copy / "manifest.json").read_text())
    for stage in doc["stages"]:
        if (stage["details"].get("data") or {}).get("path"):
            stage["details"]["data"]["path"] = str(data)
    (copy / "manifest.json").write_text(json.dumps(doc))
    _flip(data) if change == "flipped" else data.unlink()
    proc = run_in_process("export", copy, "--leaf", "ptq", "-t", TARGET, "-o", tmp_path / "fw", "--golden", "8")
    assert proc.returncode == 2, proc.stderr[-3000:]
    line = one_error_line(proc)
    assert str(data) in line and ("was changed" if change == "flipped" else "is missing") in line
    assert "pass --data DATA.npz" in line and not (tmp_path / "fw").exists()


@pytest.mark.parametrize("command", ["export", "verify"])
def test_raw_data_for_a_preprocessed_run_is_refused(preprocessed, tmp_path, command):
    more = ["-o", tmp_path / "fw", "--golden", "2"] if command == "export" else ["-n", "1"]
    proc = run_in_process(command, preprocessed, "--leaf", "ptq", "-t", TARGET, "--data", DATA, *more)
    assert proc.returncode == 3, proc.stderr[-3000:]
    line = one_error_line(proc)
    assert f"--data {DATA}" in line and "front.py:half" in line and "leave out --data" in line
    assert not (tmp_path / "fw").exists()


def test_a_preprocessed_run_exports_its_own_samples(preprocessed, tmp_path):
    _ok("export", preprocessed, "--leaf", "ptq", "-t", TARGET, "-o", tmp_path / "fw", "--golden", "2")
    golden = json.loads((tmp_path / "fw" / "manifest.json").read_text())["golden"]
    assert golden["data"]["path"] == str((preprocessed / "inputs" / "data.npz").resolve())
    _ok("export", preprocessed, "--leaf", "ptq", "-t", TARGET, "-o", tmp_path / "fw2", "--golden", "2",
        "--data", preprocessed / "inputs" / "data.npz")  # the run's own samples, named: accepted
