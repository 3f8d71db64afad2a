"""HIL tests on `--edgedeploy-device npu`: the sample HIL test against the command stream Vela wrote for a real
bundle, run by the functional NPU model (real Vela, the real model, pytest in a subprocess); the bundles it cannot
run end in one line."""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

from helpers import pytest_argv, pytest_sessions
from typer.testing import CliRunner

from edgedeploy.cli.app import app
from edgedeploy.pipeline.compile import compile_tflite

pytestmark = pytest.mark.requires_data

REPO = Path(__file__).resolve().parents[3]
HIL_TESTS = REPO / "examples" / "hil"
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


def run_hil(bundle: Path, *more: str, tests: Path = HIL_TESTS) -> subprocess.CompletedProcess:
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


def changed_weight_stream(bundle: Path, dest: Path) -> Path:
    """The bundle with its command stream's weights damaged (hashes updated to match, as if Vela had written them)."""
    from edgedeploy.npu.leaf_layout import read_leaf

    fw = copy_bundle(bundle, dest)
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
    return fw


def altered_compiled_model(bundle: Path, dest: Path) -> Path:
    """The bundle with one bit of its compiled model flipped, its manifest left as export wrote it."""
    fw = copy_bundle(bundle, dest)
    path = fw / f"{NAME}_vela.tflite"
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 1
    path.write_bytes(bytes(data))
    return fw


def unshipped_compiled_model(bundle: Path, dest: Path) -> Path:
    """The bundle as an edgedeploy that did not ship the compiled model as a file exported it."""
    fw = copy_bundle(bundle, dest)
    manifest = json.loads((fw / "manifest.json").read_text())
    name = manifest["model"].pop("tflite")
    del manifest["files"][name]
    (fw / name).unlink()
    (fw / "manifest.json").write_text(json.dumps(manifest))
    return fw


@dataclass
class HilRun:
    bundle: Path
    proc: subprocess.CompletedProcess


@pytest.fixture(scope="module")
def hil_runs(u55_bundle, kws_run, kws_data, tmp_path_factory) -> dict[str, HilRun]:
    """The sample HIL tests on the NPU model against each bundle, one pytest session each (all in one interpreter)."""
    work = tmp_path_factory.mktemp("npu-sessions")
    bundles = {
        "sample": u55_bundle,
        "changed-weights": changed_weight_stream(u55_bundle, work / "weights"),
        "u85": export(kws_run, U85, work / "u85", kws_data, 2),
        "altered": altered_compiled_model(u55_bundle, work / "altered"),
        "unshipped": unshipped_compiled_model(u55_bundle, work / "unshipped"),
    }
    sessions = {name: ["-q", str(HIL_TESTS), "--edgedeploy-bundle", str(fw), "--edgedeploy-device", "npu"]
                for name, fw in bundles.items()}  # fmt: skip
    bundles["unshipped-on-host"] = bundles["unshipped"]
    sessions["unshipped-on-host"] = sessions["unshipped"][:-1] + ["host"]
    procs = pytest_sessions(list(sessions.values()), HIL_TESTS, work)
    return {name: HilRun(bundles[name], proc) for name, proc in zip(sessions, procs, strict=True)}


def test_the_sample_hil_test_passes_bit_exactly_on_the_npu_model(hil_runs):
    proc = hil_runs["sample"].proc
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    assert f"{GOLDEN + 1} passed" in proc.stdout  # each golden case at tolerance 0, and the top-1 test


def test_a_changed_weight_stream_fails_the_cases_it_changes(hil_runs):
    """The device runs the file's command stream and weights: damage them and the cases no longer pass."""
    proc = hil_runs["changed-weights"].proc
    assert proc.returncode == 1 and f"{GOLDEN + 1} failed" in proc.stdout, proc.stdout[-3000:]
    assert proc.stdout.count("output elements differ by more than 0") >= GOLDEN, proc.stdout[-3000:]


def test_an_ethos_u85_bundle_passes_bit_exactly_on_the_npu_model(hil_runs):
    proc = hil_runs["u85"].proc
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    assert "3 passed" in proc.stdout  # each golden case at tolerance 0, and the top-1 test


def test_an_altered_compiled_model_is_refused(hil_runs):
    line = one_device_line(hil_runs["altered"].proc, errors=GOLDEN + 1)
    assert f"{NAME}_vela.tflite was changed after `edgedeploy export` wrote it" in line
    assert "export the bundle again" in line


def test_a_bundle_exported_before_the_file_was_shipped_names_the_fix(hil_runs):
    run = hil_runs["unshipped"]
    line = one_device_line(run.proc, errors=GOLDEN + 1)
    assert str(run.bundle) in line and f"holds no compiled model file ({NAME}_vela.tflite)" in line
    assert "export the bundle again with `edgedeploy export`" in line
    assert hil_runs["unshipped-on-host"].proc.returncode == 0  # the other devices do not need the file


@pytest.mark.requires_data("kws/ds_cnn_s_arm_int8.tflite", "kws/speech_commands_v2_test_mfcc_arm.npz")
def test_a_model_with_cpu_operators_fails_in_one_line(shared_data, tmp_path):
    run = tmp_path / "run"
    result = CliRunner().invoke(app, ["compile", str(shared_data / "kws" / "ds_cnn_s_arm_int8.tflite"), "-t", U55,
                                      "-o", str(run), "--allow-cpu-ops"])  # fmt: skip
    assert result.exit_code == 0, result.output
    fw = export(run, U55, tmp_path / "fw", shared_data / "kws" / "speech_commands_v2_test_mfcc_arm.npz", 1)
    line = one_device_line(run_hil(fw), errors=2)
    assert "on the CPU; the NPU model runs only the NPU part" in line and "DEQUANTIZE" in line
