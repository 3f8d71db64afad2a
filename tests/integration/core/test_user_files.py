"""Through the real CLI: edgedeploy never deletes a file it did not create, never follows a run or bundle manifest
out of its folder, never runs what a bundle holds, and leaves nothing behind when it is stopped. `compile`, a report
written to a device and a stopped command run as the console script; `export` and `emulate`, whose checks are the
exit code, the line and the files, run in this process."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from helpers import run_cli as cli
from helpers import balanced_part, run_in_process

EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "kws" / "dscnn_mlperf_int8.tflite"
KWS_TREE = Path(__file__).resolve().parents[3] / "examples" / "kws_tree"
LOOKALIKES = [".profile.old1", "docs/.notes.txt.old2", "docs/drafts/.thesis.tex.abcdefgh.part", ".ssh.old3/key",
              ".manifest.json.ab12cd34.part", "compile/dscnn_mlperf/.ethos-u55-128.old77/x"]


def _plant(root: Path, names) -> None:
    for name in names:
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(name)


def _kept(root: Path, names) -> bool:
    return all((root / n).is_file() and (root / n).read_text() == n for n in names)


def _one_line(proc, code: int) -> str:
    assert proc.returncode == code, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    return lines[0]


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("compiled") / "run"
    assert cli("compile", EXAMPLE, "-t", "ethos-u55-128", "-o", out).returncode == 0
    return out


def test_compiling_twice_into_a_home_folder_deletes_nothing(tmp_path):
    home = tmp_path / "home"
    _plant(home, LOOKALIKES)
    for _ in range(2):
        assert cli("compile", EXAMPLE, "-t", "ethos-u55-128", "-o", home).returncode == 0
    assert _kept(home, LOOKALIKES)
    assert not (home / ".edgedeploy-tmp").exists()  # the scratch folder goes when the command ends


def test_a_users_folder_where_a_stage_would_go_is_refused_and_kept(tmp_path):
    out = tmp_path / "out"
    _plant(out, ["import/dscnn_mlperf/thesis.tex"])
    line = _one_line(cli("compile", EXAMPLE, "-t", "ethos-u55-128", "-o", out), 2)
    assert "edgedeploy did not write it" in line and _kept(out, ["import/dscnn_mlperf/thesis.tex"])


def test_a_project_writing_into_its_own_folder_deletes_nothing(tmp_path, stratified):
    """``out = ""``: the project folder is the run folder (the example's model and a seeded part of its data, the
    ptq leaf, no training), written by the command in this process, which has TensorFlow loaded already."""
    _plant(tmp_path, LOOKALIKES)
    shutil.copyfile(KWS_TREE / "dscnn_mlperf_float.h5", tmp_path / "dscnn_mlperf_float.h5")
    balanced_part(KWS_TREE / "speech_commands_subset.npz", tmp_path / "data.npz", {0: 36, 1: 36}, stratified)
    (tmp_path / "edgedeploy.toml").write_text(
        'model = "dscnn_mlperf_float.h5"\ndata = "data.npz"\nout = ""\n'
        'targets = ["ethos-u55-128"]\n[recipe]\nleaves = ["ptq"]\nepochs = 0\n')
    proc = run_in_process("compile", tmp_path / "edgedeploy.toml")
    assert proc.returncode == 0, proc.stderr
    assert _kept(tmp_path, LOOKALIKES) and (tmp_path / "manifest.json").is_file()


def test_export_force_leaves_user_files_even_under_a_planted_manifest(run_dir, tmp_path):
    fw = tmp_path / "fw"
    _plant(fw, ["main.c", *LOOKALIKES])
    (fw / "manifest.json").write_text(json.dumps({"schema": "edgedeploy.firmware", "files": {
        "main.c": {"sha256": "0" * 64, "bytes": 1}, ".profile.old1": {"sha256": "0" * 64, "bytes": 1}}}))
    for _ in range(2):
        proc = run_in_process("export", run_dir, "-t", "ethos-u55-128", "-o", fw, "--golden", "0", "--force")
        assert proc.returncode == 0, proc.stderr
    assert _kept(fw, ["main.c", *LOOKALIKES]) and (fw / "dscnn_mlperf.c").is_file()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["fw"]  # nothing staged beside --out


def test_export_into_a_writable_folder_of_a_read_only_parent(run_dir, tmp_path):
    parent = tmp_path / "ro"
    (parent / "fw").mkdir(parents=True)
    parent.chmod(0o555)
    try:
        proc = run_in_process("export", run_dir, "-t", "ethos-u55-128", "-o", parent / "fw", "--golden", "0")
    finally:
        parent.chmod(0o755)
    assert proc.returncode == 0, proc.stderr
    assert sorted(p.name for p in parent.iterdir()) == ["fw"]


def _edited(run_dir: Path, tmp_path: Path, path: str) -> Path:
    copy = tmp_path / "edited"
    shutil.copytree(run_dir, copy)
    doc = json.loads((copy / "manifest.json").read_text())
    for stage in doc["stages"]:
        for art in stage["outputs"]:
            if art["role"] == "vela_model":
                art["path"] = path
    (copy / "manifest.json").write_text(json.dumps(doc))
    return copy


@pytest.mark.parametrize("path", ["ABS", "../run/compile/dscnn_mlperf/ethos-u55-128/model_int8_vela.tflite"])
def test_a_hand_edited_manifest_is_not_followed_out_of_its_folder(run_dir, tmp_path, path):
    outside = tmp_path / "elsewhere.tflite"
    shutil.copyfile(run_dir / "compile/dscnn_mlperf/ethos-u55-128/model_int8_vela.tflite", outside)
    edited = _edited(run_dir, tmp_path, str(outside) if path == "ABS" else path)
    proc = run_in_process("export", edited, "-t", "ethos-u55-128", "-o", tmp_path / "fw", "--golden", "0")
    line = _one_line(proc, 3)
    assert "outside the run folder" in line and not (tmp_path / "fw" / "dscnn_mlperf.c").exists()


def test_a_report_written_to_a_device_is_written_through_it(run_dir, tmp_path):
    with open(tmp_path / "captured", "w") as sink:
        proc = subprocess.run([sys.executable, "-m", "edgedeploy", "report", str(run_dir), "-f", "json", "-o",
                               "/dev/stdout"], stdout=sink, stderr=subprocess.PIPE, text=True)
    assert proc.returncode == 0, proc.stderr
    assert json.loads((tmp_path / "captured").read_text())["schema"] == "edgedeploy.report"


def test_emulate_refuses_a_bundle_whose_name_would_run_cmake_code(run_dir, tmp_path):
    fw = tmp_path / "fw"
    assert run_in_process("export", run_dir, "-t", "ethos-u55-128", "-o", fw, "--golden", "0").returncode == 0
    doc = json.loads((fw / "manifest.json").read_text())
    doc["name"] = 'x")\nexecute_process(COMMAND touch "%s")\n#' % (tmp_path / "pwned")
    (fw / "manifest.json").write_text(json.dumps(doc))
    line = _one_line(run_in_process("emulate", fw), 3)
    assert "name" in line and not (tmp_path / "pwned").exists()


def test_sigterm_ends_like_ctrl_c_and_leaves_nothing_behind(tmp_path):
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    args = ["compile", EXAMPLE, "-j", "1", "-o", "run"] + [a for t in ("ethos-u55-128", "ethos-u85-256",
            "ethos-u55-64", "ethos-u65-256", "ethos-u55-256", "ethos-u85-512") for a in ("-t", t)]
    p = subprocess.Popen([sys.executable, "-m", "edgedeploy", *map(str, args)], cwd=tmp_path, text=True,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, env={**os.environ, "TMPDIR": str(tmp)})
    scratch = tmp_path / "run" / ".edgedeploy-tmp"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and not any(q.name.endswith(".part") for q in scratch.glob("*")):
        time.sleep(0.002)
    p.send_signal(signal.SIGTERM)
    _, err = p.communicate(timeout=120)
    if p.returncode == 0:
        pytest.skip("the command finished before the signal arrived")
    assert p.returncode == 128 + signal.SIGTERM and "interrupted" in err and "Traceback" not in err, err
    assert not scratch.exists() or sorted(q.name for q in scratch.iterdir()) == [".edgedeploy-scratch"]
    assert list(tmp.iterdir()) == []  # its private temporary folder is gone
