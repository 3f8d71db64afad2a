"""`edgedeploy emulate` for real: TFLM built for Cortex-M55, the bundle's firmware on QEMU's mps3-an547.

The TFLM library is built once per test run into one cache (``EDGEDEPLOY_TEST_TFLM_CACHE`` names a
persistent one); each test then builds only its small firmware.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

from helpers import invoke_cli as cli, pytest_argv

from edgedeploy.pipeline.compile import compile_tflite
from edgedeploy.core.files import sha256_file

pytestmark = pytest.mark.requires_data

REPO = Path(__file__).resolve().parents[3]
TREE = Path(os.environ.get("EDGEDEPLOY_TFLM_DIR") or REPO.parent / "shared" / "third_party" / "tflm-cortex-m55")
BOARD = "corstone-300-u55-128"


@pytest.fixture(autouse=True)
def _tflm_env(request, monkeypatch):
    if "tflm_cache" in request.fixturenames:
        monkeypatch.setenv("XDG_CACHE_HOME", str(request.getfixturevalue("tflm_cache")))
        monkeypatch.setenv("EDGEDEPLOY_TFLM_DIR", str(TREE))


@pytest.fixture(scope="module")
def bundle(shared_data, tmp_path_factory) -> Path:
    run = tmp_path_factory.mktemp("emulate") / "run"
    compile_tflite([shared_data / "kws" / "dscnn_mlperf_int8.tflite"], [BOARD], run)
    fw = run.parent / "fw"
    data = shared_data / "kws" / "speech_commands_v2_test_mfcc_mlperf.npz"
    result = cli("export", run, "--out", fw, "--data", data, "--golden", 4)
    assert result.exit_code == 0, result.output
    return fw


@pytest.fixture(scope="module")
def build_dir(tmp_path_factory) -> Path:
    """One firmware build folder for the module: a rebuild compiles only what changed."""
    return tmp_path_factory.mktemp("firmware")


def copy_bundle(bundle: Path, build_dir: Path) -> Path:
    """A fresh copy of the bundle, always at the same path: the firmware's include paths stay the same."""
    dest = build_dir.parent / "bundle-copy"
    shutil.rmtree(dest, ignore_errors=True)
    shutil.copytree(bundle, dest)
    return dest


def test_golden_vectors_bit_exact_and_arena_measured(tflm_cache, bundle, build_dir, tmp_path):
    fw = copy_bundle(bundle, build_dir)
    result = cli("emulate", fw, "--json", "--build-dir", build_dir)
    assert result.exit_code == 0, result.output
    out = json.loads(result.stdout)  # stdout is only JSON
    assert out["ok"] and len(out["vectors"]) == 4
    assert all(v["bit_exact"] for v in out["vectors"])
    arena = out["arena"]
    assert 0 < arena["used_bytes"] <= arena["header_bytes"]
    assert 0 < out["stack"]["used_bytes"] < out["stack"]["size_bytes"]
    assert out["board"]["operators"] == ["AVERAGE_POOL_2D", "CONV_2D", "DEPTHWISE_CONV_2D", "FULLY_CONNECTED", "RESHAPE", "SOFTMAX"]
    header = (fw / "dscnn_mlperf.h").read_text()
    assert f"#define DSCNN_MLPERF_CPU_TENSOR_ARENA_SIZE {arena['header_bytes']}u" in header
    manifest = json.loads((fw / "manifest.json").read_text())
    measured = manifest["cpu_model"]["measured"]
    assert measured["arena_used_bytes"] == arena["used_bytes"] and measured["golden_bit_exact"] == "4/4"
    # the bundle's files are untouched: the HIL plugin still verifies them
    for name, info in manifest["files"].items():
        assert sha256_file(fw / name) == info["sha256"], name


def test_a_changed_golden_output_fails_naming_vector_and_element(tflm_cache, bundle, build_dir, tmp_path):
    fw = copy_bundle(bundle, build_dir)
    with np.load(fw / "golden.npz") as g:
        arrays = {k: g[k] for k in g.files}
    arrays["output_0"] = arrays["output_0"].copy()
    arrays["output_0"][2, 3] += 1
    from edgedeploy.export import npz_bytes

    (fw / "golden.npz").write_bytes(npz_bytes(arrays))
    manifest = json.loads((fw / "manifest.json").read_text())
    manifest["files"]["golden.npz"]["sha256"] = sha256_file(fw / "golden.npz")
    (fw / "manifest.json").write_text(json.dumps(manifest))
    result = cli("emulate", fw, "--build-dir", build_dir)
    assert result.exit_code == 6, result.output
    assert "FAIL  vector 2: DIFFERS" in result.stdout and "ok  vector 0: bit-exact" in result.stdout
    err = result.stderr.strip().splitlines()
    assert len(err) == 1 and "golden vector 2 differs" in err[0] and "element 3" in err[0]


def test_a_firmware_that_faults_gives_one_line(tflm_cache, bundle, build_dir, tmp_path):
    fw = copy_bundle(bundle, build_dir)
    result = cli("emulate", fw, "--stack-size", 1024, "--build-dir", build_dir)  # TFLM overflows 1 KiB: the stack limit faults
    assert result.exit_code == 6, result.output
    err = result.stderr.strip().splitlines()
    assert len(err) == 1 and "faulted on the emulated Cortex-M55" in err[0] and "Traceback" not in result.output
    assert "EDGEDEPLOY start" in err[0]  # the last lines the firmware printed


def test_a_hang_is_a_timeout_with_exit_6(tflm_cache, bundle, build_dir, tmp_path):
    from edgedeploy.hil.emulate.golden_run import emulate_bundle
    from edgedeploy.errors import ToolFailedError

    with pytest.raises(ToolFailedError, match="hung: no exit within 0.01 s") as exc:
        emulate_bundle(copy_bundle(bundle, build_dir), build_dir=build_dir, timeout=0.01)
    assert exc.value.exit_code == 6


def test_an_arena_too_small_quotes_tflm_in_one_line(tflm_cache, bundle, build_dir, tmp_path):
    """AllocateTensors fails: the one line quotes TFLM's own reason (its MicroPrintf output), not just the call.

    The last test of the module's build folder: its changed header recompiles the firmware, which the others share.
    """
    fw = copy_bundle(bundle, build_dir)
    manifest = json.loads((fw / "manifest.json").read_text())
    header = fw / f"{manifest['name']}.h"
    define = f"#define {manifest['name'].upper()}_CPU_TENSOR_ARENA_SIZE "
    text = header.read_text()
    assert define in text
    header.write_text("\n".join(define + "4096u" if ln.startswith(define) else ln for ln in text.split("\n")))
    record = manifest["files"][header.name]
    record["sha256"] = sha256_file(header)  # as if exported with a 4 KiB arena
    if "bytes" in record:
        record["bytes"] = header.stat().st_size
    (fw / "manifest.json").write_text(json.dumps(manifest))
    result = cli("emulate", fw, "--build-dir", build_dir)
    assert result.exit_code == 6, result.output
    err = result.stderr.strip().splitlines()
    assert len(err) == 1 and "Traceback" not in result.output, result.output
    assert "AllocateTensors failed (arena 4096 bytes); TFLM says: " in err[0] and "allocate" in err[0], err[0]


def test_sample_hil_test_passes_on_the_qemu_device(tflm_cache, bundle):
    args = pytest_argv("-q", str(REPO / "examples" / "hil"), "--edgedeploy-bundle", str(bundle),
                       "--edgedeploy-device", "qemu")
    proc = subprocess.run(args, capture_output=True, text=True, cwd=REPO / "examples" / "hil", timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "5 passed" in proc.stdout  # 4 golden cases + the top-1 test
