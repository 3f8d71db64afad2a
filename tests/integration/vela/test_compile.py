"""`edgedeploy compile` on real models with real Vela: results equal bare Vela runs; bad input is refused."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from helpers import run_cli, run_cli_loading, run_in_process

from edgedeploy.pipeline.compile import CompileOptions, compile_tflite
from edgedeploy.config.targets import get_target
from edgedeploy.core.files import release_run_dirs
from edgedeploy.vela.outputs import parse_summary_csv

pytestmark = pytest.mark.requires_data


def bare_vela(vela_bin, model: Path, target_name: str, out: Path, optimise="Performance") -> dict:
    t = get_target(target_name)
    subprocess.run(
        [vela_bin, str(model), "--accelerator-config", t.accelerator_config, "--config", str(t.vela_ini_path()),
         "--system-config", t.vela.system_config, "--memory-mode", t.vela.memory_mode, "--optimise", optimise,
         "--output-dir", str(out)],
        check=True, capture_output=True,
    )
    (csv,) = out.glob("*_summary_*.csv")
    return parse_summary_csv(csv.read_text())


# the same comparison for a second model in the slow run (the default run's compiles of ResNet-8 are checked
# against Vela's own CSVs in test_report_integration.py's test_numbers_equal_velas_own_csv)
@pytest.mark.parametrize("model", ["kws/dscnn_mlperf_int8.tflite",
                                   pytest.param("ic/resnet8_mlperf_int8.tflite",
                                                marks=[pytest.mark.requires_data("ic/resnet8_mlperf_int8.tflite"),
                                                       pytest.mark.slow])])
def test_json_equals_bare_vela(shared_data, tmp_path, vela_bin, model):
    targets = ["ethos-u55-128", "ethos-u65-256", "ethos-u85-256"]
    args = ["compile", shared_data / model, "--out", tmp_path / "run", "--json"]
    for t in targets:
        args += ["--target", t]
    proc = run_cli(*args)
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)  # stdout is only JSON
    assert report["schema"] == "edgedeploy.compile" and report["schema_version"] == 1
    assert report["tools"]["ethos-u-vela"] == "5.2.0"
    by_target = {r["target"]: r for r in report["results"]}
    assert sorted(by_target) == sorted(targets)
    for t in targets:
        bare = bare_vela(vela_bin, shared_data / model, t, tmp_path / f"bare-{t}")
        m = {k: v["value"] for k, v in by_target[t]["metrics"].items()}
        assert m["sram_bytes"] == round(bare["sram_memory_used"] * 1024)
        assert m["dram_bytes"] == round(bare["dram_memory_used"] * 1024)
        assert m["flash_bytes"] == round((bare["off_chip_flash_memory_used"] + bare["on_chip_flash_memory_used"]) * 1024)
        assert m["npu_cycles"] == bare["cycles_npu"] and m["total_cycles"] == bare["cycles_total"]
        assert m["encoded_weights_bytes"] == bare["total_npu_encoded_weights"]
        assert m["macs"] == bare["nn_macs"]
        assert m["cpu_operators"] == 0
        assert report["targets"][t]["vela"]["config_sha256"] == get_target(t).vela_ini_sha256()
    manifest = json.loads((tmp_path / "run" / "manifest.json").read_text())
    compiled = [s for s in manifest["stages"] if s["stage"] == "compile"]
    assert len(compiled) == 3
    for s in compiled:
        assert s["tool"]["name"] == "vela" and s["tool"]["argv"][0] == "vela"
        out_dir = Path(s["tool"]["argv"][s["tool"]["argv"].index("--output-dir") + 1])
        assert out_dir == (tmp_path / "run" / s["id"]).resolve(), "the recorded command names the final folder"
        assert s["inputs"][0]["sha256"] == manifest["stages"][0]["outputs"][0]["sha256"]
        assert {a["role"] for a in s["outputs"]} >= {"vela_model", "summary_csv", "per_layer_csv", "log"}


def test_unchanged_rerun_is_reused_and_a_change_recompiles(shared_data, tmp_path):
    model = shared_data / "kws" / "dscnn_mlperf_int8.tflite"
    first = compile_tflite([model], ["ethos-u55-128", "ethos-u85-256"], tmp_path)
    assert first.compiled == 2 and not first.cached_ids
    vela_file = tmp_path / "compile" / "dscnn_mlperf" / "ethos-u55-128"
    mtime = next(vela_file.glob("*_vela.tflite")).stat().st_mtime_ns
    again = compile_tflite([model], ["ethos-u55-128", "ethos-u85-256"], tmp_path)
    assert again.compiled == 0 and len(again.cached_ids) == 2
    assert next(vela_file.glob("*_vela.tflite")).stat().st_mtime_ns == mtime
    assert [r.metrics["total_cycles"].value for r in again.records] == [r.metrics["total_cycles"].value for r in first.records]
    size = compile_tflite([model], ["ethos-u55-128"], tmp_path, CompileOptions(optimise="Size"))
    assert size.compiled == 1


@pytest.mark.requires_data("ic/resnet8_mlperf_int8.tflite")
def test_parallel_jobs_give_the_same_numbers_as_one_job(shared_data, tmp_path):
    models = [shared_data / "kws" / "dscnn_mlperf_int8.tflite", shared_data / "ic" / "resnet8_mlperf_int8.tflite"]
    targets = ["ethos-u55-64", "ethos-u65-512", "ethos-u85-512"]
    one = compile_tflite(models, targets, tmp_path / "one", CompileOptions(jobs=1))
    two = compile_tflite(models, targets, tmp_path / "two", CompileOptions(jobs=2))
    key = lambda r: (r.variant, r.target)  # noqa: E731
    a = {key(r): {k: m.value for k, m in r.metrics.items()} for r in one.records}
    b = {key(r): {k: m.value for k, m in r.metrics.items()} for r in two.records}
    assert len(a) == 6 and a == b


def test_table_output(shared_data, tmp_path):
    proc = run_cli("compile", shared_data / "kws" / "dscnn_mlperf_int8.tflite", "-t", "corstone-300-u55-128",
                   "-o", tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "corstone-300-u55-128" in proc.stdout and "NPU cycles" in proc.stdout
    assert "manifest:" in proc.stderr


TREE_MODULES = ("edgedeploy.optimize", "edgedeploy.pipeline.tree_run", "edgedeploy.pipeline.walk",
                "edgedeploy.pipeline.sweep", "edgedeploy.report.judge", "edgedeploy.keras", "numpy", "tensorflow")


def test_compiling_tflite_files_loads_none_of_the_trees_modules(dscnn_int8, tmp_path):
    """`edgedeploy compile MODEL.tflite` loads what compiling needs: the deployment tree's modules (the optimize
    package, the walk, the sweep, the judge), numpy and TensorFlow stay out of the command's process (Vela runs
    in its workers), so the command starts sooner."""
    proc, loaded = run_cli_loading("compile", dscnn_int8, "-t", "ethos-u55-128", "-o", tmp_path / "run", "--json",
                                   watch=TREE_MODULES)
    assert proc.returncode == 0 and loaded == [], proc.stdout + proc.stderr
    assert json.loads(proc.stdout)["results"][0]["target"] == "ethos-u55-128"


@pytest.mark.requires_data("kws/ds_cnn_s_arm_int8.tflite")
def test_cpu_operators_recorded_with_reason_and_io_quantize_allowed(shared_data, tmp_path):
    out = compile_tflite([shared_data / "kws" / "ds_cnn_s_arm_int8.tflite"], ["ethos-u55-128"], tmp_path)
    (rec,) = out.records
    ops = rec.details["cpu_operators"]
    assert {o["op"] for o in ops} == {"QUANTIZE", "DEQUANTIZE"}
    assert all(o["reason"] for o in ops)
    assert rec.metrics["cpu_operators"].value == 2


# --------------------------------------------------------------------------- bad input
# A missing model through the console script; the other refusals, and the commands whose check is what they print
# and write, run the command in this process (their check is the exit code, the one line and what is written).


def _assert_clean_failure(proc, code, *needles, out: Path | None = None):
    assert proc.returncode == code, (proc.returncode, proc.stderr)
    assert "Traceback" not in proc.stderr
    lines = [l for l in proc.stderr.strip().splitlines() if l.strip()]
    assert len(lines) == 1, proc.stderr
    for n in needles:
        assert n in lines[0], lines[0]
    if out is not None:
        assert not out.exists() or not any(out.iterdir()), "nothing may be written on bad input"


def test_missing_model(tmp_path):
    out = tmp_path / "out"
    proc = run_cli("compile", tmp_path / "nope.tflite", "-t", "ethos-u55-128", "-o", out)
    _assert_clean_failure(proc, 3, "nope.tflite does not exist", out=out)


def test_truncated_model(shared_data, tmp_path):
    data = (shared_data / "kws" / "dscnn_mlperf_int8.tflite").read_bytes()
    bad = tmp_path / "cut.tflite"
    bad.write_bytes(data[: len(data) // 2])
    out = tmp_path / "out"
    _assert_clean_failure(run_in_process("compile", bad, "-t", "ethos-u55-128", "-o", out), 3,
                          "cut.tflite is truncated", out=out)


def test_not_tflite(shared_data, tmp_path):
    out = tmp_path / "out"
    proc = run_in_process("compile", shared_data / "kws" / "dscnn_mlperf_float.h5", "-t", "ethos-u55-128", "-o", out)
    _assert_clean_failure(proc, 3, "not a TFLite flatbuffer", out=out)


def test_float_model_is_refused_with_the_reason(float_tflite, tmp_path):
    out = tmp_path / "out"
    proc = run_in_process("compile", float_tflite, "-t", "ethos-u55-128", "-o", out)
    _assert_clean_failure(proc, 3, "is a float model", "CPU", "edgedeploy optimize", out=out)


def test_vela_output_is_refused(shared_data, tmp_path):
    compile_tflite([shared_data / "kws" / "dscnn_mlperf_int8.tflite"], ["ethos-u55-128"], tmp_path / "first")
    (vela_model,) = (tmp_path / "first" / "compile" / "dscnn_mlperf" / "ethos-u55-128").glob("*_vela.tflite")
    proc = run_in_process("compile", vela_model, "-t", "ethos-u55-128", "-o", tmp_path / "out")
    _assert_clean_failure(proc, 3, "already compiled by Vela", out=tmp_path / "out")


def test_a_folder_that_is_not_an_optimize_run_is_refused(shared_data, tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    _assert_clean_failure(run_in_process("compile", empty, "-t", "ethos-u55-128"), 3, "empty has no manifest.json",
                          out=empty)
    compiled = tmp_path / "compiled"  # a run folder of `compile` itself: it has no converted leaves
    compile_tflite([shared_data / "kws" / "dscnn_mlperf_int8.tflite"], ["ethos-u55-128"], compiled)
    release_run_dirs()  # the folder as the API's process leaves it when it ends (the commands below end so too)
    before = sorted(p.relative_to(compiled) for p in compiled.rglob("*"))
    _assert_clean_failure(run_in_process("compile", compiled, "-t", "ethos-u85-256"), 3,
                          "compiled holds no int8 leaves", "edgedeploy optimize")
    _assert_clean_failure(run_in_process("compile", compiled, "-t", "ethos-u85-256", "-o", tmp_path / "elsewhere"),
                          2, "compiled into itself", out=tmp_path / "elsewhere")
    _assert_clean_failure(run_in_process("compile", compiled, shared_data / "kws" / "dscnn_mlperf_int8.tflite",
                                         "-t", "ethos-u55-128"), 2, "compiled is a folder")
    assert sorted(p.relative_to(compiled) for p in compiled.rglob("*")) == before


def test_unknown_target(shared_data, tmp_path):
    out = tmp_path / "out"
    proc = run_in_process("compile", shared_data / "kws" / "dscnn_mlperf_int8.tflite", "-t", "ethos-u56-128", "-o", out)
    _assert_clean_failure(proc, 4, "unknown target 'ethos-u56-128'", "ethos-u55-128", out=out)


def test_target_file_with_bad_value(shared_data, tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text(get_target("ethos-u55-128").source.read_text().replace('"ethos-u55-128"\n\n[vela]', '"ethos-u55-100"\n\n[vela]'))
    out = tmp_path / "out"
    proc = run_in_process("compile", shared_data / "kws" / "dscnn_mlperf_int8.tflite", "-t", bad, "-o", out)
    _assert_clean_failure(proc, 4, str(bad), "`npu.accelerator_config` is 'ethos-u55-100'", "allowed values", out=out)


def test_vela_failing_is_reported_and_leaves_no_output(shared_data, tmp_path):
    # A vela.ini whose system config has a value Vela rejects when it compiles.
    ini = tmp_path / "broken.ini"
    ini.write_text("[System_Config.Broken]\ncore_clock=fast\naxi0_port=Sram\naxi1_port=OffChipFlash\n"
                   "[Memory_Mode.Mode]\nconst_mem_area=Axi1\narena_mem_area=Axi0\ncache_mem_area=Axi0\n")
    target = tmp_path / "broken.toml"
    target.write_text('schema_version = 1\nname = "broken"\nkind = "npu"\n[npu]\naccelerator_config = "ethos-u55-128"\n'
                      '[vela]\nconfig = "broken.ini"\nsystem_config = "Broken"\nmemory_mode = "Mode"\n'
                      '[clocks]\nnpu_hz = 500_000_000\n')
    out = tmp_path / "out"
    proc = run_in_process("compile", shared_data / "kws" / "dscnn_mlperf_int8.tflite", "-t", target, "-o", out)
    _assert_clean_failure(proc, 6, "Vela failed", "broken")
    assert not (out / "compile" / "dscnn_mlperf" / "broken").exists()
    assert not [p for p in (out / "compile" / "dscnn_mlperf").iterdir()] if (out / "compile" / "dscnn_mlperf").exists() else True
    manifest = json.loads((out / "manifest.json").read_text())
    failed = [s for s in manifest["stages"] if s["status"] == "failed"]
    assert failed and "Vela failed" in failed[0]["error"]


def test_bad_optimise_value(shared_data, tmp_path):
    proc = run_in_process("compile", shared_data / "kws" / "dscnn_mlperf_int8.tflite", "-t", "ethos-u55-128",
                   "--optimise", "Speed", "-o", tmp_path / "o")
    _assert_clean_failure(proc, 2, "--optimise is 'Speed'", "Performance, Size", out=tmp_path / "o")


def test_no_arguments_shows_help_and_fails():
    proc = run_cli()
    assert proc.returncode != 0 and "compile" in (proc.stdout + proc.stderr)


def test_cpu_fallback_is_an_error_unless_allowed(reverse_tflite, tmp_path):
    proc = run_in_process("compile", reverse_tflite, "-t", "ethos-u55-128", "-o", tmp_path / "a")
    _assert_clean_failure(proc, 7, str(reverse_tflite), "REVERSE_V2", "falls back to the CPU on ethos-u55-128",
                          "--allow-cpu-ops")
    proc = run_in_process("compile", reverse_tflite, "-t", "ethos-u55-128", "-o", tmp_path / "a", "--allow-cpu-ops",
                          "--json")
    assert proc.returncode == 0, proc.stderr
    (res,) = json.loads(proc.stdout)["results"]
    assert res["metrics"]["cpu_operators"]["value"] == 1
    assert res["cpu_operators"][0]["op"] == "REVERSE_V2" and res["cpu_operators"][0]["reason"]
    # Ethos-U85 runs REVERSE_V2 on the NPU
    assert run_in_process("compile", reverse_tflite, "-t", "ethos-u85-128", "-o", tmp_path / "b").returncode == 0


def test_debug_db_gives_per_layer_npu_weights_in_the_report(shared_data, tmp_path):
    """`compile --debug-db` records Vela's per-layer weight facts; `report` shows them per layer."""
    model = shared_data / "kws" / "dscnn_mlperf_int8.tflite"
    proc = run_in_process("compile", model, "-t", "ethos-u55-128", "-o", tmp_path, "--debug-db")
    assert proc.returncode == 0, proc.stderr
    manifest = json.loads((tmp_path / "manifest.json").read_text())
    (rec,) = [r for r in manifest["stages"] if r["stage"] == "compile"] if isinstance(manifest["stages"], list) \
        else [r for r in manifest["stages"].values() if r["stage"] == "compile"]
    facts = rec["details"]["npu_weights"]
    # DS-CNN: 5 conv, 4 depthwise, 1 dense; per-channel int8 weights: every tensor is beyond Vela's palette
    assert len(facts["layers"]) == 10 and facts["summary"]["layers_over_palette"] == 10
    assert sum(r["encoded_weight_bytes"] for r in facts["layers"]) == facts["summary"]["encoded_weight_bytes"]
    assert abs(facts["summary"]["encoded_weight_bytes"] - rec["metrics"]["encoded_weights_bytes"]["value"]) < 512
    report = run_in_process("report", tmp_path, "--json")
    assert report.returncode == 0, report.stderr
    (per_target,) = json.loads(report.stdout)["npu_weights"].values()
    layers = per_target["ethos-u55-128"]["layers"]
    assert [r["layer"].split("/")[-1] for r in layers].count("depthwise") == 4
    table = run_in_process("report", tmp_path)
    assert "NPU weights per layer" in table.stdout and "functional_1/dense/MatMul" in table.stdout
    # without --debug-db there is no per-layer section and no debug database
    plain = run_in_process("compile", model, "-t", "ethos-u55-128", "-o", tmp_path / "plain")
    assert plain.returncode == 0 and not list((tmp_path / "plain").rglob("*_debug.xml"))
    assert json.loads(run_in_process("report", tmp_path / "plain", "--json").stdout)["npu_weights"] == {}


def test_another_model_with_the_same_file_name_is_kept_beside_the_first(tmp_path):
    example = Path(__file__).resolve().parents[3] / "examples" / "kws" / "dscnn_mlperf_int8.tflite"
    for folder in ("a", "b"):
        (tmp_path / folder).mkdir()
        (tmp_path / folder / "m_int8.tflite").write_bytes(example.read_bytes())
    first = run_cli("compile", "a/m_int8.tflite", "-t", "ethos-u55-128", "-o", "R", cwd=tmp_path)
    assert first.returncode == 0, first.stderr
    second = run_in_process("compile", "b/m_int8.tflite", "-t", "ethos-u55-128", "-o", "R", cwd=tmp_path)
    assert second.returncode == 0, second.stderr
    assert "variant 'm' of R is another model" in second.stderr and "compiled as 'b_m'" in second.stderr
    doc = json.loads((tmp_path / "R" / "manifest.json").read_text())
    sources = {s["variant"]: Path(s["params"]["source"]).parent.name for s in doc["stages"] if s["stage"] == "import"}
    assert sources == {"m": "a", "b_m": "b"}
    again = run_in_process("compile", "b/m_int8.tflite", "-t", "ethos-u55-128", "-o", "R", cwd=tmp_path)
    assert again.returncode == 0 and "another model" not in again.stderr  # b/ keeps its name, silently
