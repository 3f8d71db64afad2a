"""A real FVP run of a compiled model (needs an Arm Corstone FVP and the Kit's inference_runner)."""

from __future__ import annotations

import math

import pytest

from edgedeploy.pipeline.compile import compile_tflite
from edgedeploy.errors import ToolFailedError
from edgedeploy.fvp.discovery import locate_fvp_binary, locate_runner
from edgedeploy.fvp.inference import fvp_run
from edgedeploy.core.manifest import Manifest
from edgedeploy.config.targets import get_target

pytestmark = [pytest.mark.requires_fvp, pytest.mark.requires_data, pytest.mark.slow]
BOARDS = ["corstone-300-u55-128", "corstone-300-u65-256", "corstone-310-u55-256", "corstone-320-u85-256"]


def _available(board: str):
    target = get_target(board)
    fvp = locate_fvp_binary(target.fvp.binary)
    if fvp is None:
        pytest.skip(f"{target.fvp.binary} is not installed")
    runner = locate_runner(board)
    if runner is None:
        pytest.skip(f"no inference_runner for {board} (set EDGEDEPLOY_FVP_RUNNER; see fvp/README.md)")
    return target


@pytest.mark.parametrize("board", BOARDS)
def test_dscnn_on_the_fvp(board, tmp_path, dscnn_int8):
    target = _available(board)
    compile_tflite([dscnn_int8], [board], tmp_path)
    outcome = fvp_run(tmp_path, "dscnn_mlperf", board, timeout=900)
    rec = outcome.record
    assert rec.status == "ok" and rec.id == f"fvp/dscnn_mlperf/{board}"
    assert rec.parent == f"compile/dscnn_mlperf/{board}"
    total, active, idle = (rec.metric(k) for k in ("npu_total_cycles", "npu_active_cycles", "npu_idle_cycles"))
    assert total and total > 0 and active and 0 < active <= total and idle is not None
    assert rec.metrics["npu_total_cycles"].mode == "simulated"
    err = rec.metric("cycles_estimate_error_pct")
    assert err is not None and math.isfinite(err)
    out = rec.output("output")
    assert out is not None and out.bytes == 12
    assert rec.details["input"]["source"] == "zero"
    manifest = Manifest.load(tmp_path)
    assert target.fvp.binary in manifest.tools
    # unchanged inputs: the recorded result is reused
    again = fvp_run(tmp_path, "dscnn_mlperf", board, timeout=900)
    assert again.cached and again.record.metric("npu_total_cycles") == total


def test_a_run_cut_short_is_recorded_as_failed(tmp_path, dscnn_int8):
    board = "corstone-300-u55-128"
    _available(board)
    compile_tflite([dscnn_int8], [board], tmp_path)
    try:
        fvp_run(tmp_path, "dscnn_mlperf", board, timeout=1)
    except ToolFailedError as exc:
        assert exc.message.startswith(f"FVP run of dscnn_mlperf on {board}")
        rec = Manifest.load(tmp_path).records[f"fvp/dscnn_mlperf/{board}"]
        assert rec.status == "failed" and rec.error
        assert not (tmp_path / "fvp" / "dscnn_mlperf" / board).exists()
    else:
        pytest.skip("the FVP finished within one second; nothing was cut short")


def test_golden_case_on_the_fvp(tmp_path, dscnn_int8, shared_data):
    """The first golden case of an export bundle: the NPU's answer is compared with TFLM's reference."""
    from edgedeploy.export import ExportOptions, export_bundle

    board = "corstone-300-u55-128"
    _available(board)
    compile_tflite([dscnn_int8], [board], tmp_path / "run")
    npz = shared_data / "kws" / "speech_commands_v2_test_mfcc_mlperf.npz"
    export_bundle(tmp_path / "run", ExportOptions(out=tmp_path / "fw", target=board, data=npz, golden=1))
    rec = fvp_run(tmp_path / "run", "dscnn_mlperf", board, golden=tmp_path / "fw", timeout=900).record
    assert rec.details["input"]["source"] == "golden"
    cmp = rec.details["output"]["golden_comparison"]
    assert cmp["comparable"] and cmp["argmax_agrees"]
    assert rec.metric("output_elements_differing") == cmp["elements_differing"]

