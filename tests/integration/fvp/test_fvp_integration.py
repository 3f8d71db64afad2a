"""The fvp stage up to the FVP itself, on a model really compiled with Vela (no FVP needed)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from edgedeploy.pipeline.compile import compile_tflite
from edgedeploy.errors import ToolMissingError, UsageError
from edgedeploy.fvp import discovery
from edgedeploy.fvp.command import FvpInvocation, build_fvp_command
from edgedeploy.fvp.inference import _compiled, fvp_run
from edgedeploy.fvp.stimulus import choose_input, compare_outputs, golden_from_bundle, tensor_bytes
from edgedeploy.core.manifest import Manifest, StageRecord
from edgedeploy.config.targets import get_target
from edgedeploy.tflite.reader import read_tflite

pytestmark = pytest.mark.requires_data
BOARDS = ["corstone-300-u55-128", "corstone-320-u85-256"]


@pytest.fixture(scope="module")
def compiled(tmp_path_factory, shared_data) -> Path:
    out = tmp_path_factory.mktemp("fvp-run")
    compile_tflite([shared_data / "kws" / "dscnn_mlperf_int8.tflite"], BOARDS, out)
    return out


@pytest.fixture
def no_fvps(monkeypatch, tmp_path):
    empty = tmp_path / "empty-path"
    empty.mkdir()
    monkeypatch.setenv("PATH", str(empty))
    monkeypatch.setattr(discovery, "usual_install_dirs", lambda: [])
    monkeypatch.delenv(discovery.ENV_RUNNER, raising=False)


def test_missing_fvp_and_missing_runner_record_nothing(compiled, no_fvps, tmp_path, monkeypatch):
    manifest_file = compiled / "manifest.json"
    before = manifest_file.read_bytes()
    with pytest.raises(ToolMissingError, match="FVP_Corstone_SSE-320 needed for target corstone-320-u85-256"):
        fvp_run(compiled, "dscnn_mlperf", "corstone-320-u85-256")
    placeholder = tmp_path / "fvps" / "FVP_Corstone_SSE-320"  # found, never run
    placeholder.parent.mkdir()
    placeholder.write_text("#!/bin/sh\nexit 127\n")
    placeholder.chmod(0o755)
    monkeypatch.setenv("EDGEDEPLOY_FVP_DIR", str(placeholder.parent))
    with pytest.raises(ToolMissingError, match="no inference runner application for target corstone-320-u85-256"):
        fvp_run(compiled, "dscnn_mlperf", "corstone-320-u85-256")
    assert manifest_file.read_bytes() == before
    assert not (compiled / "fvp").exists()


@pytest.mark.parametrize("board", BOARDS)
def test_command_for_the_compiled_model(compiled, board):
    manifest = Manifest.load(compiled)
    target = get_target(board)
    rec, vela_model = _compiled(manifest, "dscnn_mlperf", target)
    assert vela_model.name == "model_int8_vela.tflite"
    model = read_tflite(vela_model)
    assert model.has_ethos_u_op()
    choice = choose_input(manifest, "dscnn_mlperf", board, model.inputs)
    (inp,) = model.inputs
    assert choice.source == "zero"  # an imported .tflite has no recorded data
    assert choice.data == bytes([inp.zero_point[0] & 0xFF]) * tensor_bytes(inp)
    out_bytes = sum(tensor_bytes(t) for t in model.outputs)
    assert out_bytes == 12  # one int8 score per keyword class
    argv = build_fvp_command(
        target,
        FvpInvocation(Path(target.fvp.binary), Path("runner.axf"), vela_model, Path("in.bin"), Path("out.bin"),
                      out_bytes, 50),
    )
    assert f"{vela_model}@0x90000000" in argv
    assert argv[argv.index("--dump") + 1].endswith("=out.bin@Memory:0x93000000,12")


def test_eval_sample_from_the_convert_record(compiled, shared_data):
    """A convert record naming its data file makes the first eval sample the FVP input."""
    npz = shared_data / "kws" / "speech_commands_v2_test_mfcc_mlperf.npz"
    manifest = Manifest.load(compiled)
    manifest.records["convert/dscnn_mlperf"] = StageRecord(
        id="convert/dscnn_mlperf", stage="convert", status="ok", variant="dscnn_mlperf",
        details={"data": {"path": str(npz), "layout": "x/y/split", "eval_split": "split == 1"}},
    )
    _, vela_model = _compiled(manifest, "dscnn_mlperf", get_target("corstone-300-u55-128"))
    (inp,) = read_tflite(vela_model).inputs
    choice = choose_input(manifest, "dscnn_mlperf", "corstone-300-u55-128", (inp,))
    assert choice.source == "eval_sample"
    with np.load(npz) as data:
        first = int(np.flatnonzero(data["split"] == 1)[0])
        v = data["x"][first].astype(np.float32) / np.float32(inp.scale[0])
    expected = np.clip(np.sign(v) * np.floor(np.abs(v) + 0.5) + inp.zero_point[0], -128, 127).astype(np.int8)
    assert choice.data == expected.tobytes()
    assert f"x[{first}]" in choice.description


def test_golden_case_of_a_real_export_bundle(compiled, shared_data, tmp_path, no_fvps):
    from edgedeploy.export import ExportOptions, export_bundle

    npz = shared_data / "kws" / "speech_commands_v2_test_mfcc_mlperf.npz"
    board = "corstone-300-u55-128"
    bundle = tmp_path / "fw"
    export_bundle(compiled, ExportOptions(out=bundle, target=board, leaf="dscnn_mlperf", data=npz, golden=2))
    manifest = Manifest.load(compiled)
    rec, vela_model = _compiled(manifest, "dscnn_mlperf", get_target(board))
    model = read_tflite(vela_model)
    choice = golden_from_bundle(bundle, "dscnn_mlperf", board, rec.output("vela_model").sha256, model.inputs,
                                model.outputs)
    with np.load(bundle / "golden.npz") as g:
        assert choice.data == g["input_0"][0].tobytes()
        assert len(choice.data) == tensor_bytes(model.inputs[0])
        assert choice.golden_output == g["output_0"][0].tobytes()
        assert f"data row {int(g['row'][0])}" in choice.description
    assert compare_outputs(choice.golden_output, choice.golden_output, model.outputs)["elements_differing"] == 0
    with pytest.raises(UsageError, match="not 'dscnn_mlperf' on corstone-320-u85-256"):
        golden_from_bundle(bundle, "dscnn_mlperf", "corstone-320-u85-256", rec.output("vela_model").sha256,
                           model.inputs, model.outputs)
    # without an FVP the run stops at the missing tool, before anything is written
    with pytest.raises(ToolMissingError):
        fvp_run(compiled, "dscnn_mlperf", board, golden=bundle)
