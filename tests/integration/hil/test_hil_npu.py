"""HIL tests on `--edgedeploy-device npu`: the sample HIL test against the command stream Vela wrote for a real
bundle, run by the functional NPU model (real Vela, the real model, pytest in a subprocess); the bundles it cannot
run end in one line."""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
from pathlib import Path

import pytest

from helpers import pytest_argv
from typer.testing import CliRunner

from edgedeploy.cli.app import app
from edgedeploy.pipeline.compile import compile_tflite

pytestmark = pytest.mark.requires_data

REPO = Path(__file__).resolve().parents[3]
U55, U85 = "ethos-u55-128", "ethos-u85-256"
NAME = "dscnn_mlperf"
GOLDEN = 4


def export(run: Path, target: str, out: Path, data: Path, golden: int) -> Path:
    result = CliRunner().invoke(app, ["export", str(run), "-t", target, "-o", str(out), "--data", str(data),
                                      "--golden", str(golden)])  # fmt: skip
    assert result.exit_code == 0, result.output
    return out


@pytest.fixture(scope="module")
def kws_run(shared_data, tmp_path_factory) -> Path:
    run = tmp_path_factory.mktemp("npu-hil") / "run"
    compile_tflite([shared_data / "kws" / "dscnn_mlperf_int8.tflite"], [U55, U85], run)
    return run


@pytest.fixture(scope="module")
def kws_data(shared_data) -> Path:
    return shared_data / "kws" / "speech_commands_v2_test_mfcc_mlperf.npz"


@pytest.fixture(scope="module")
def u55_bundle(kws_run, kws_data, tmp_path_factory) -> Path:
    return export(kws_run, U55, tmp_path_factory.mktemp("fw-u55") / "fw", kws_data, GOLDEN)


def run_hil(bundle: Path, *more: str, tests: Path = REPO / "examples" / "hil") -> subprocess.CompletedProcess:
    args = pytest_argv("-q", str(tests), "--edgedeploy-bundle", str(bundle), "--edgedeploy-device", "npu", *more)
    return subprocess.run(args, capture_output=True, text=True, cwd=tests, timeout=600)


def one_device_line(proc: subprocess.CompletedProcess, errors: int) -> str:
    """The one distinct ``--edgedeploy-device npu:`` line of a run whose every test errored at set-up."""
    assert proc.returncode == 1 and f"{errors} errors" in proc.stdout, proc.stdout[-3000:] + proc.stderr[-2000:]
    assert not any(t in proc.stdout for t in ("Traceback", "InvalidInputError", "NpuModelError")), proc.stdout[-3000:]
    lines = {line for line in proc.stdout.splitlines() if line.startswith("--edgedeploy-device npu: ")}
    assert len(lines) == 1, proc.stdout[-3000:]
    return lines.pop()


def copy_bundle(bundle: Path, dest: Path) -> Path:
    shutil.copytree(bundle, dest, ignore=shutil.ignore_patterns(".edgedeploy*"))
    return dest


def test_the_bundle_ships_the_compiled_model_as_a_file(u55_bundle, kws_run):
    manifest = json.loads((u55_bundle / "manifest.json").read_text())
    name = manifest["model"]["tflite"]
    assert name == f"{NAME}_vela.tflite"
    data = (u55_bundle / name).read_bytes()
    (compiled,) = (kws_run / "compile" / NAME / U55).glob("*_vela.tflite")
    assert data == compiled.read_bytes()  # the bytes Vela wrote, which the C array holds too
    digest = hashlib.sha256(data).hexdigest()
    assert manifest["files"][name] == {"sha256": digest, "bytes": len(data)} and manifest["model"]["sha256"] == digest


def test_the_sample_hil_test_passes_bit_exactly_on_the_npu_model(u55_bundle):
    proc = run_hil(u55_bundle)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    assert f"{GOLDEN + 1} passed" in proc.stdout  # each golden case at tolerance 0, and the top-1 test


def test_a_changed_weight_stream_fails_the_cases_it_changes(u55_bundle, tmp_path):
    """The device runs the file's command stream and weights: damage them (hashes updated to match, as if Vela had
    written them) and the cases no longer pass."""
    from edgedeploy.npu.leaf_layout import read_leaf

    fw = copy_bundle(u55_bundle, tmp_path / "fw")
    path = fw / f"{NAME}_vela.tflite"
    data = bytearray(path.read_bytes())
    start = data.find(read_leaf(path).weights[:64])
    for i in range(start + 6000, start + 6040):  # inside a weight stream, as tests/integration/npu/test_npu_verify.py
        data[i] ^= 0x5A
    path.write_bytes(bytes(data))
    manifest = json.loads((fw / "manifest.json").read_text())
    digest = hashlib.sha256(data).hexdigest()
    manifest["files"][path.name]["sha256"] = manifest["model"]["sha256"] = digest
    (fw / "manifest.json").write_text(json.dumps(manifest))
    proc = run_hil(fw)
    assert proc.returncode == 1 and f"{GOLDEN + 1} failed" in proc.stdout, proc.stdout[-3000:]
    assert proc.stdout.count("output elements differ by more than 0") >= GOLDEN, proc.stdout[-3000:]


def test_an_ethos_u85_bundle_passes_bit_exactly_on_the_npu_model(kws_run, kws_data, tmp_path):
    fw = export(kws_run, U85, tmp_path / "fw", kws_data, 2)
    proc = run_hil(fw)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    assert "3 passed" in proc.stdout  # each golden case at tolerance 0, and the top-1 test


def test_an_altered_compiled_model_is_refused(u55_bundle, tmp_path):
    fw = copy_bundle(u55_bundle, tmp_path / "fw")
    path = fw / f"{NAME}_vela.tflite"
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 1
    path.write_bytes(bytes(data))
    line = one_device_line(run_hil(fw), errors=GOLDEN + 1)
    assert f"{NAME}_vela.tflite was changed after `edgedeploy export` wrote it" in line
    assert "export the bundle again" in line


def test_a_bundle_exported_before_the_file_was_shipped_names_the_fix(u55_bundle, tmp_path):
    fw = copy_bundle(u55_bundle, tmp_path / "fw")
    manifest = json.loads((fw / "manifest.json").read_text())
    name = manifest["model"].pop("tflite")
    del manifest["files"][name]
    (fw / name).unlink()
    (fw / "manifest.json").write_text(json.dumps(manifest))
    line = one_device_line(run_hil(fw), errors=GOLDEN + 1)
    assert str(fw) in line and f"holds no compiled model file ({NAME}_vela.tflite)" in line
    assert "export the bundle again with `edgedeploy export`" in line
    assert run_hil(fw, "--edgedeploy-device", "host").returncode == 0  # the other devices do not need the file


@pytest.mark.requires_data("kws/ds_cnn_s_arm_int8.tflite", "kws/speech_commands_v2_test_mfcc_arm.npz")
def test_a_model_with_cpu_operators_fails_in_one_line(shared_data, tmp_path):
    run = tmp_path / "run"
    result = CliRunner().invoke(app, ["compile", str(shared_data / "kws" / "ds_cnn_s_arm_int8.tflite"), "-t", U55,
                                      "-o", str(run), "--allow-cpu-ops"])  # fmt: skip
    assert result.exit_code == 0, result.output
    fw = export(run, U55, tmp_path / "fw", shared_data / "kws" / "speech_commands_v2_test_mfcc_arm.npz", 1)
    line = one_device_line(run_hil(fw), errors=2)
    assert "on the CPU; the NPU model runs only the NPU part" in line and "DEQUANTIZE" in line
