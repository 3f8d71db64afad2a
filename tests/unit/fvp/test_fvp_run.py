"""The fvp stage's pure parts: metrics from real transcripts, input choice, errors before any run."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from edgedeploy.errors import InvalidInputError, ToolMissingError, UsageError
from edgedeploy.fvp import discovery
from edgedeploy.fvp.parse import parse_fvp_log
from edgedeploy.fvp.counters import fvp_metrics
from edgedeploy.fvp.inference import fvp_run
from edgedeploy.fvp.stimulus import (
    choose_input,
    compare_outputs,
    golden_from_bundle,
    quantize_sample,
    tensor_bytes,
    zero_input,
)
from edgedeploy.core.manifest import Manifest, Metric, StageRecord
from edgedeploy.config.targets import get_target
from edgedeploy.tflite.reader import TensorInfo

DATA = Path(__file__).resolve().parents[2] / "data" / "fvp"
INT8_IN = TensorInfo("input_1", (1, 49, 10, 1), "int8", (0.5847029089927673,), (83,))


def compiled_record(total=None, npu=None) -> StageRecord:
    metrics = {}
    if total is not None:
        metrics["total_cycles"] = Metric(total, "cycles", "estimated")
    if npu is not None:
        metrics["npu_cycles"] = Metric(npu, "cycles", "estimated")
    return StageRecord(id="compile/v/t", stage="compile", status="ok", metrics=metrics)


def test_metrics_from_mlek_transcript():
    console = parse_fvp_log((DATA / "mlek_cs300_u55_img_class_pmu.txt").read_text())
    target = get_target("corstone-300-u55-128")
    m = fvp_metrics(console, target, compiled_record(total=8_000_000, npu=7_000_000))
    assert m["npu_active_cycles"] == Metric(7345741, "cycles", "simulated")
    assert m["npu_idle_cycles"].value == 431
    assert m["npu_total_cycles"].value == 7346172
    assert m["axi0_read_beats"] == Metric(2468259, "beats", "simulated")
    assert m["axi0_write_beats"].value == 1151319
    assert m["axi1_read_beats"].value == 432351
    assert m["npu_read_beats"].value == 2468259 + 432351
    assert m["npu_latency_ms"].value == pytest.approx(7346172 / target.npu_hz * 1e3)
    assert m["vela_total_cycles"] == Metric(8_000_000, "cycles", "estimated")
    assert m["vela_npu_cycles"].value == 7_000_000
    err = m["cycles_estimate_error_pct"]
    assert err.mode == "computed" and err.value == pytest.approx(100 * (8_000_000 - 7346172) / 7346172)
    assert m["cycles_simulated_to_estimated"].value == pytest.approx(7346172 / 8_000_000)
    assert m["sim_time_s"].value is None and m["sim_time_s"].unavailable == "the FVP printed no --stat block"


def test_metrics_from_u85_sram_ext_counters():
    console = parse_fvp_log((DATA / "mlek_cs320_u85_asr_conformer_pmu.txt").read_text())
    m = fvp_metrics(console, get_target("corstone-320-u85-256"), None)
    assert m["sram_read_beats"].value == 13858306
    assert m["sram_write_beats"].value == 7968438
    assert m["ext_read_beats"].value == 26978241
    assert m["ext_write_beats"].value == 18985466
    assert m["npu_write_beats"].value == 7968438 + 18985466
    assert m["vela_total_cycles"].value is None
    assert m["cycles_estimate_error_pct"].unavailable == "no Vela total_cycles estimate"


def test_metrics_when_the_log_has_no_counters():
    console = parse_fvp_log((DATA / "toolsolutions_cs300_u55_hello_tflm_full.txt").read_text())
    m = fvp_metrics(console, get_target("corstone-300-u55-128"), compiled_record(total=1000))
    for key in ("npu_active_cycles", "npu_total_cycles", "npu_read_beats", "npu_latency_ms"):
        assert m[key].value is None and m[key].to_dict()["unavailable"] == "the runner printed no Ethos-U PMU counters"
    assert m["cycles_estimate_error_pct"].unavailable == "no simulated NPU cycles"
    assert m["arena_used_bytes"] == Metric(1596, "B", "simulated")
    assert m["sim_time_s"].value == 0.066055
    assert m["cpu_instructions"].value == 1171181
    assert m["host_wall_time_s"] == Metric(0.165018, "s", "measured")


# --------------------------------------------------------------------------- inputs


def test_tensor_bytes_and_zero_input():
    assert tensor_bytes(INT8_IN) == 490
    assert tensor_bytes(TensorInfo("x", (1, 10), "float32", (), ())) == 40
    assert tensor_bytes(TensorInfo("x", (-1, 10), "int8", (), ())) is None
    data = zero_input((INT8_IN, TensorInfo("y", (2,), "float32", (), ())))
    assert data == bytes([83]) * 490 + b"\x00" * 8


def test_quantize_sample_uses_scale_and_zero_point():
    x = np.linspace(-200, 100, 490, dtype=np.float32)
    q = np.frombuffer(quantize_sample(x, INT8_IN), dtype=np.int8)
    v = x / np.float32(0.5847029089927673)
    expected = np.clip(np.sign(v) * np.floor(np.abs(v) + 0.5) + 83, -128, 127)
    assert np.array_equal(q, expected.astype(np.int8))
    assert q.max() == 127 and q.min() == -128  # saturates
    # ties round away from zero, as TFLite's QUANTIZE kernel does (numpy's round would give 0, 0, 2)
    half = TensorInfo("h", (3,), "int8", (0.5,), (0,))
    assert np.frombuffer(quantize_sample([0.25, -0.25, 1.25], half), np.int8).tolist() == [1, -1, 3]
    with pytest.raises(InvalidInputError, match="490"):
        quantize_sample(np.zeros(10), INT8_IN)
    f32 = TensorInfo("x", (1, 3), "float32", (), ())
    assert np.frombuffer(quantize_sample([1.5, 2, 3], f32), "<f4").tolist() == [1.5, 2.0, 3.0]


def _manifest_with(tmp_path: Path, records: list[StageRecord]) -> Manifest:
    manifest = Manifest(tmp_path)
    for r in records:
        manifest.records[r.id] = r
    manifest.save()
    return Manifest.load(tmp_path)


def test_input_is_eval_sample_when_convert_recorded_data_else_zero(tmp_path):
    npz = tmp_path / "data.npz"
    x = np.random.default_rng(0).normal(0, 3, size=(4, 49, 10, 1)).astype(np.float32)
    np.savez(npz, x=x, y=np.arange(4), split=np.array([0, 0, 1, 1]))
    # details["data"] as the convert stage records it (edgedeploy.config.data.Dataset.describe())
    convert = StageRecord(id="convert/leaf", stage="convert", status="ok", variant="leaf",
                          details={"data": {"path": str(npz), "layout": "x/y/split", "eval_split": "split == 1"}})
    manifest = _manifest_with(tmp_path, [convert])
    sample = choose_input(manifest, "leaf", "corstone-300-u55-128", (INT8_IN,))
    assert sample.source == "eval_sample" and "x[2]" in sample.description
    assert sample.data == quantize_sample(x[2], INT8_IN)
    assert sample.files == {"data": npz}

    np.savez(tmp_path / "cifar.npz", x_train=x[:2], y_train=np.arange(2), x_test=x[2:][::-1], y_test=np.arange(2))
    convert.details["data"]["path"] = str(tmp_path / "cifar.npz")
    sample = choose_input(_manifest_with(tmp_path, [convert]), "leaf", "t", (INT8_IN,))
    assert "x_test[0]" in sample.description and sample.data == quantize_sample(x[3], INT8_IN)

    zero = choose_input(_manifest_with(tmp_path / "z", []), "leaf", "corstone-300-u55-128", (INT8_IN,))
    assert zero.source == "zero" and zero.data == bytes([83]) * 490


def _bundle(tmp_path: Path, **changes) -> Path:
    out = tmp_path / "bundle"
    out.mkdir(exist_ok=True)
    info = {"schema": "edgedeploy.firmware", "source": {"leaf": "kws", "target": "corstone-300-u55-128"},
            "model": {"sha256": "ab" * 32}, "golden": {"count": 2, "npz": "golden.npz"}}
    info.update(changes)
    (out / "manifest.json").write_text(json.dumps(info))
    rng = np.random.default_rng(1)
    np.savez(out / "golden.npz", input_0=rng.integers(-128, 128, (2, 1, 49, 10, 1)).astype(np.int8)[:, 0],
             output_0=rng.integers(-128, 128, (2, 12)).astype(np.int8), row=np.array([7, 9]))
    return out


def test_golden_case_from_an_export_bundle(tmp_path):
    out12 = (TensorInfo("Identity", (1, 12), "int8", (0.0039,), (-128,)),)
    bundle = _bundle(tmp_path)
    choice = golden_from_bundle(bundle, "kws", "corstone-300-u55-128", "ab" * 32, (INT8_IN,), out12)
    with np.load(bundle / "golden.npz") as g:
        assert choice.data == g["input_0"][0].tobytes()
        assert choice.golden_output == g["output_0"][0].tobytes()
    assert choice.source == "golden" and "data row 7" in choice.description
    assert choose_input(Manifest(tmp_path), "kws", "corstone-300-u55-128", (INT8_IN,), choice) is choice

    with pytest.raises(UsageError, match="not 'kws' on corstone-320-u85-256"):
        golden_from_bundle(bundle, "kws", "corstone-320-u85-256", "ab" * 32, (INT8_IN,), out12)
    with pytest.raises(InvalidInputError, match="another compile"):
        golden_from_bundle(bundle, "kws", "corstone-300-u55-128", "cd" * 32, (INT8_IN,), out12)
    with pytest.raises(InvalidInputError, match="no golden vectors"):
        golden_from_bundle(_bundle(tmp_path, golden={"count": 0}), "kws", "corstone-300-u55-128", "ab" * 32,
                           (INT8_IN,), out12)
    with pytest.raises(InvalidInputError, match="not an edgedeploy firmware bundle"):
        golden_from_bundle(_bundle(tmp_path, schema="other"), "kws", "corstone-300-u55-128", "ab" * 32,
                           (INT8_IN,), out12)


def test_compare_outputs():
    outs = (TensorInfo("a", (1, 4), "int8", (1.0,), (0,)), TensorInfo("b", (2,), "int16", (1.0,), (0,)))
    ref = np.array([1, 5, -3, 2], np.int8).tobytes() + np.array([300, -2], "<i2").tobytes()
    assert compare_outputs(ref, ref, outs) == {"comparable": True, "elements_differing": 0, "max_abs_diff": 0.0,
                                               "argmax_agrees": True}
    got = np.array([1, 4, -3, 7], np.int8).tobytes() + np.array([290, -2], "<i2").tobytes()
    cmp = compare_outputs(got, ref, outs)
    assert (cmp["elements_differing"], cmp["max_abs_diff"], cmp["argmax_agrees"]) == (3, 10.0, False)
    assert compare_outputs(got[:5], ref, outs) == {"comparable": False}


# --------------------------------------------------------------------------- errors before running


@pytest.fixture
def no_fvps(monkeypatch, tmp_path):
    empty = tmp_path / "empty-path"
    empty.mkdir()
    monkeypatch.setenv("PATH", str(empty))
    monkeypatch.setattr(discovery, "usual_install_dirs", lambda: [])
    monkeypatch.delenv(discovery.ENV_RUNNER, raising=False)


def test_missing_manifest(tmp_path):
    with pytest.raises(InvalidInputError, match="has no manifest.json"):
        fvp_run(tmp_path, "leaf", "corstone-300-u55-128")


def test_missing_fvp_leaves_the_manifest_alone(no_fvps, tmp_path):
    run = tmp_path / "run"
    Manifest(run).save()
    before = (run / "manifest.json").read_bytes()
    with pytest.raises(ToolMissingError, match="FVP_Corstone_SSE-300_Ethos-U55"):
        fvp_run(run, "leaf", "corstone-300-u55-128")
    assert (run / "manifest.json").read_bytes() == before
    assert sorted(p.name for p in run.iterdir()) == ["manifest.json"]


def test_missing_compile_names_what_is_compiled(no_fvps, tmp_path, monkeypatch):
    placeholder = tmp_path / "fvps" / "FVP_Corstone_SSE-300_Ethos-U55"  # found, never run
    placeholder.parent.mkdir()
    placeholder.write_text("#!/bin/sh\nexit 127\n")
    placeholder.chmod(0o755)
    monkeypatch.setenv("EDGEDEPLOY_FVP_DIR", str(tmp_path / "fvps"))
    run = tmp_path / "run"
    Manifest(run).save()
    with pytest.raises(InvalidInputError, match="nothing is compiled in this run yet"):
        fvp_run(run, "leaf", "corstone-300-u55-128")


@pytest.mark.parametrize("damage, words", [
    ("flipped", "was changed after compile/leaf/corstone-300-u55-128 wrote it (sha256 "),
    ("grown", "was changed after compile/leaf/corstone-300-u55-128 wrote it (5 bytes, recorded 4)"),
    ("missing", "is missing"),
    ("folder", "is not a regular file"),
])
def test_a_changed_vela_model_is_refused_by_the_shared_check_before_the_fvp_runs(no_fvps, tmp_path, monkeypatch,
                                                                                  damage, words):
    """fvp reads the compiled model through the manifest's one check: the same line compile, report, export and
    verify give (the file, why, the manifest and the sha256 it records, the command that writes it again)."""
    from edgedeploy.core.manifest import Artifact

    placeholder = tmp_path / "fvps" / "FVP_Corstone_SSE-300_Ethos-U55"  # found, never run
    placeholder.parent.mkdir()
    placeholder.write_text("#!/bin/sh\nexit 127\n")
    placeholder.chmod(0o755)
    monkeypatch.setenv("EDGEDEPLOY_FVP_DIR", str(tmp_path / "fvps"))
    run = tmp_path / "run"
    vela = run / "compile" / "leaf" / "corstone-300-u55-128" / "model_vela.tflite"
    vela.parent.mkdir(parents=True)
    vela.write_bytes(b"TFL3")
    record = StageRecord(id="compile/leaf/corstone-300-u55-128", stage="compile", status="ok", variant="leaf",
                         target="corstone-300-u55-128", outputs=[Artifact.of("vela_model", vela, run)])
    _manifest_with(run, [record])
    if damage == "flipped":
        vela.write_bytes(b"TFL4")
    elif damage == "grown":
        vela.write_bytes(b"TFL3!")
    elif damage in ("missing", "folder"):
        vela.unlink()
        if damage == "folder":
            vela.mkdir()
    before = {p: p.stat().st_mtime_ns for p in run.rglob("*")}
    with pytest.raises(InvalidInputError) as err:
        fvp_run(run, "leaf", "corstone-300-u55-128")
    line = err.value.one_line()
    assert line.startswith(f"the Vela-compiled model of 'leaf' for corstone-300-u55-128 {vela} {words}"), line
    assert f"{run / 'manifest.json'} (compile/leaf/corstone-300-u55-128) records sha256 " in line, line
    assert f"edgedeploy compile {run} -t corstone-300-u55-128" in line, line
    assert {p: p.stat().st_mtime_ns for p in run.rglob("*")} == before  # nothing written
