"""The reporter on a recorded real run folder (no Vela, no TensorFlow): numbers, formats, judgments, gate.

tests/data/report/run_u55_u85 is a run folder written by `edgedeploy compile` with Vela 5.2.0 (see its
SOURCE.md): the MLPerf DS-CNN and ResNet-8 int8 models on corstone-300-u55-128 and ethos-u85-256.
"""

from __future__ import annotations

import copy
import csv
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from edgedeploy.errors import InvalidInputError, RegressionError, UsageError
from edgedeploy.manifest import Manifest
from edgedeploy.report import (
    DEFAULT_TOLERANCES,
    LEAF_LEVELS,
    Requirements,
    Tolerance,
    build_report,
    compare_reports,
    leaf_level,
    load_report_json,
    parse_size,
    parse_tolerances,
    pareto_front,
    raise_on_regression,
    requirements_from_project,
)
from edgedeploy.report_render import render, render_csv, render_html, render_markdown

RUN = Path(__file__).resolve().parents[1] / "data" / "report" / "run_u55_u85"
EDGEDEPLOY = [sys.executable, "-m", "edgedeploy"]


def run_cli(*args, cwd=None):
    return subprocess.run([*EDGEDEPLOY, *map(str, args)], capture_output=True, text=True, cwd=cwd,
                          env={**os.environ, "NO_COLOR": "1", "COLUMNS": "200"})


@pytest.fixture(scope="module")
def doc() -> dict:
    return build_report(RUN)


def row(doc, leaf, target):
    return next(r for r in doc["rows"] if r["leaf"] == leaf and r["target"] == target)


# --------------------------------------------------------------------------- parsing


@pytest.mark.parametrize(
    "text, expected",
    [("123", 123), ("512KiB", 524288), ("2MiB", 2097152), ("1.5 MiB", 1572864), ("64kB", 64000), ("1MB", 10**6),
     ("0", 0), (4096, 4096), ("7b", 7), ("1gib", 1 << 30)],
)
def test_parse_size(text, expected):
    assert parse_size(text) == expected


@pytest.mark.parametrize("text", ["", "12 apples", "-3", "1k", "KiB", "1.2.3MiB"])
def test_parse_size_rejects(text):
    with pytest.raises(UsageError, match="--max-flash is") as err:
        parse_size(text, "--max-flash")
    assert "512KiB" in err.value.one_line()


def test_parse_tolerances():
    assert parse_tolerances(None) == DEFAULT_TOLERANCES
    t = parse_tolerances("accuracy=0.25, flash=2KiB ,cycles=5%")
    assert t["accuracy"] == Tolerance(0.25, False)
    assert t["flash"] == Tolerance(2048, False)
    assert t["cycles"] == Tolerance(5.0, True) and t["sram"] == DEFAULT_TOLERANCES["sram"]
    assert t["cycles"].allowed(200_000) == 10_000
    for bad, msg in (("accuracy=1%", "percentage points"), ("speed=3%", "NAME=VALUE"), ("cycles", "NAME=VALUE"),
                     ("cycles=x", "not a number"), ("flash=-1%", "negative")):
        with pytest.raises(UsageError, match=msg):
            parse_tolerances(bad)


def test_tree_levels_table():
    assert [n for n, _ in sorted(LEAF_LEVELS.items(), key=lambda kv: kv[1])][:2] == ["ptq", "qat"]
    assert leaf_level("ptq") == 0 and leaf_level("qat") == 1
    assert leaf_level("pruned") == leaf_level("clustered") == 2
    assert leaf_level("pqat") == leaf_level("cqat") == leaf_level("pruned_clustered") == 3
    assert leaf_level("pcqat") == 4
    assert leaf_level("pcqat_palette") == 4 and leaf_level("pruned_ptq") == 2
    assert leaf_level("dscnn_mlperf") is None and leaf_level("foo_palette") is None


def test_project_requirements(tmp_path):
    p = tmp_path / "edgedeploy.toml"
    p.write_text('[model]\npath = "m.h5"\n\n[requirements]\nmax_accuracy_drop = 1\nmax_flash = "512KiB"\n'
                 "max_sram = 262144\nmax_latency_ms = 2.5\n")
    req = requirements_from_project(p)
    assert (req.max_accuracy_drop, req.max_flash, req.max_sram, req.max_latency_ms) == (1.0, 524288, 262144, 2.5)
    assert req.sources == (f"{p} [requirements]",)
    merged = Requirements(max_flash=1000, sources=("command line",)).over(req)
    assert merged.max_flash == 1000 and merged.max_sram == 262144 and merged.sources[0] == "command line"
    (tmp_path / "none.toml").write_text("[model]\n")
    assert requirements_from_project(tmp_path / "none.toml").given() == {}


@pytest.mark.parametrize(
    "body, match",
    [("[requirements]\nmax_flsh = 3\n", r"requirements\.max_flsh. is not known"),
     ("[requirements]\nmax_flash = \"lots\"\n", r"requirements\.max_flash"),
     ("[requirements]\nmax_latency_ms = \"fast\"\n", r"requirements\.max_latency_ms. is 'fast'"),
     ("requirements = 3\n", "must be a table"),
     ("[requirements\n", "not valid TOML")],
)
def test_project_requirements_errors(tmp_path, body, match):
    p = tmp_path / "edgedeploy.toml"
    p.write_text(body)
    with pytest.raises(UsageError, match=match) as err:
        requirements_from_project(p)
    assert str(p) in err.value.message


def test_pareto_front():
    pts = {"a": (1, 5), "b": (2, 2), "c": (5, 1), "d": (3, 3), "e": (2, 2)}
    assert pareto_front(pts) == {"a", "b", "c", "e"}  # d is dominated by b; equal points both stay
    assert pareto_front({"x": (1, 1, 1)}) == {"x"}


# --------------------------------------------------------------------------- numbers from the recorded run


def test_rows_equal_recorded_vela_csvs(doc):
    manifest = Manifest.load(RUN)
    assert len(doc["rows"]) == 4
    for r in doc["rows"]:
        rec = manifest.records[r["stages"]["compile"]]
        with open(manifest.resolve(rec.output("summary_csv")), newline="") as fh:
            (s,) = list(csv.DictReader(fh))
        v = {k: c["value"] for k, c in r["values"].items()}
        assert v["sram_bytes"] == round(float(s["sram_memory_used"]) * 1024)
        assert v["dram_bytes"] == round(float(s["dram_memory_used"]) * 1024)
        assert v["vela_flash_bytes"] == round(
            (float(s["on_chip_flash_memory_used"]) + float(s["off_chip_flash_memory_used"])) * 1024)
        assert v["encoded_weights_bytes"] == float(s["total_npu_encoded_weights"])
        assert v["npu_cycles"] == float(s["cycles_npu"]) and v["total_cycles"] == float(s["cycles_total"])
        assert v["latency_ms"] == pytest.approx(float(s["inference_time"]) * 1000, rel=1e-3)
        assert v["compiled_model_bytes"] == rec.output("vela_model").bytes
        assert v["tflite_bytes"] == manifest.records[f"import/{r['leaf']}"].metric("tflite_bytes")


def test_unavailable_values_say_why(doc):
    r = row(doc, "dscnn_mlperf", "ethos-u85-256")
    assert r["level"] is None and r["kind"] == "imported"
    assert "imported from a .tflite" in r["values"]["int8_accuracy_pct"]["unavailable"]
    assert "no ptq leaf compiled for ethos-u85-256" in r["values"]["encoded_weights_ratio"]["unavailable"]
    comp = doc["compression"]["dscnn_mlperf"]
    assert comp["status"] == "unavailable" and "model_int8.tflite is missing" in comp["note"]
    # U85 in Dedicated_Sram mode reads the model from DRAM: Vela's flash estimate is 0 there.
    assert r["values"]["vela_flash_bytes"]["value"] == 0 and r["values"]["dram_bytes"]["value"] > 0
    assert r["values"]["compiled_model_bytes"]["value"] > r["values"]["encoded_weights_bytes"]["value"]


def test_board_fit_and_npu_targets(doc):
    on_board = row(doc, "resnet8_mlperf", "corstone-300-u55-128")
    fit = on_board["fit"]
    assert fit["applies"] and fit["fits"] is True
    assert fit["sram_needed_bytes"] == on_board["values"]["sram_bytes"]["value"] + 16384
    assert "16,384 B runtime margin" in fit["note"]
    assert on_board["requirements"]["fits_board"]["met"] is True
    npu = row(doc, "resnet8_mlperf", "ethos-u85-256")
    assert not npu["fit"]["applies"] and npu["requirements"] == {} and npu["meets_requirements"] is None
    assert any("16,384 B runtime margin" in n for n in doc["notes"])


def test_pareto_without_accuracy(doc):
    for t in ("corstone-300-u55-128", "ethos-u85-256"):
        assert doc["pareto"][t]["front"] == ["dscnn_mlperf"]  # smaller and faster than ResNet-8
        assert doc["pareto"][t]["objectives"] == ["compiled_model_bytes (min)", "total_cycles (min)"]
        assert row(doc, "resnet8_mlperf", t)["pareto"] is False


# --------------------------------------------------------------------------- requirements


def test_recommendation_without_accuracy_prefers_smaller_flash(doc):
    for t, rec in doc["recommendations"].items():
        assert rec["leaf"] == "dscnn_mlperf" and rec["met"]
        assert row(doc, "dscnn_mlperf", t)["recommended"] and not row(doc, "resnet8_mlperf", t)["recommended"]


def test_recommendation_follows_flash_and_latency(doc):
    t = "ethos-u85-256"
    d, r = row(doc, "dscnn_mlperf", t), row(doc, "resnet8_mlperf", t)
    lat_d, lat_r = d["values"]["latency_ms"]["value"], r["values"]["latency_ms"]["value"]
    out = build_report(RUN, Requirements(max_latency_ms=(lat_d + lat_r) / 2))
    assert out["recommendations"][t]["leaf"] == "dscnn_mlperf"
    assert out["recommendations"][t]["met"]
    assert row(out, "resnet8_mlperf", t)["requirements"]["max_latency_ms"]["met"] is False


def test_limit_equal_to_the_value_is_met(doc):
    t = "corstone-300-u55-128"
    exact = row(doc, "dscnn_mlperf", t)["values"]["compiled_model_bytes"]["value"]
    out = build_report(RUN, Requirements(max_flash=exact))
    assert out["recommendations"][t]["leaf"] == "dscnn_mlperf"
    assert build_report(RUN, Requirements(max_flash=exact - 1))["recommendations"][t]["leaf"] is None


def test_nothing_meets_flash_reports_closest_and_excess(doc):
    out = build_report(RUN, Requirements(max_flash=parse_size("20KiB")))
    for t, rec in out["recommendations"].items():
        smallest = row(doc, "dscnn_mlperf", t)["values"]["compiled_model_bytes"]["value"]
        assert rec["leaf"] is None and rec["judged"] and not rec["met"]
        (u,) = rec["unmet"]
        assert (u["requirement"], u["closest_leaf"], u["excess"]) == ("max_flash", "dscnn_mlperf", smallest - 20480)
        assert f"over by {smallest - 20480:,} B" in rec["message"]


def test_accuracy_requirement_cannot_be_judged_without_accuracy():
    out = build_report(RUN, Requirements(max_accuracy_drop=1.0))
    rec = out["recommendations"]["ethos-u85-256"]
    assert rec["leaf"] is None
    (u,) = rec["unmet"]
    assert u["requirement"] == "max_accuracy_drop" and "cannot be judged" in u["text"]


def test_cli_exit_codes_and_project_file(tmp_path):
    proc = run_cli("report", RUN, "--json", "--max-flash", "20KiB")
    assert proc.returncode == 8
    assert json.loads(proc.stdout)["schema"] == "edgedeploy.report"  # stdout is only JSON
    assert "no leaf meets max_flash" in proc.stderr
    (tmp_path / "edgedeploy.toml").write_text('[requirements]\nmax_flash = "20KiB"\n')
    assert run_cli("report", RUN, "--json", cwd=tmp_path).returncode == 8  # ./edgedeploy.toml applies
    assert run_cli("report", RUN, "--json", "--max-flash", "1MiB", cwd=tmp_path).returncode == 0
    other = tmp_path / "other.toml"
    other.write_text("[requirements]\nmax_sram = 1\n")
    proc = run_cli("report", RUN, "--json", "--project", other)
    assert proc.returncode == 8 and "max_sram" in proc.stderr
    for args, msg in ((["--format", "pdf"], "--format is 'pdf'"), (["--max-flash", "big"], "--max-flash is 'big'"),
                      (["--fail-on-regression"], "need a reference report")):
        proc = run_cli("report", RUN, *args)
        assert proc.returncode == 2 and msg in proc.stderr
    proc = run_cli("report", tmp_path)
    assert proc.returncode == 3 and "has no manifest.json" in proc.stderr


# --------------------------------------------------------------------------- formats


def test_csv_and_json_agree(doc):
    lines = list(csv.DictReader(render_csv(doc).splitlines()))
    assert [(l["leaf"], l["target"]) for l in lines] == [(r["leaf"], r["target"]) for r in doc["rows"]]
    for line, r in zip(lines, doc["rows"]):
        for key, cell in r["values"].items():
            if cell["value"] is None:
                assert line[key] == "" and f"{key}: {cell['unavailable']}" in line["unavailable"]
            else:
                assert float(line[key]) == cell["value"]
        assert line["recommended"] == ("yes" if r["recommended"] else "")


def test_markdown_numbers_agree_with_json(doc):
    md = [l for l in render_markdown(doc).splitlines() if l.startswith("| ")]
    header = [c.strip() for c in md[0].strip("|").split(" | ")]
    keys = [c["key"] for c in doc["columns"]]
    assert header == [c["header"] for c in doc["columns"]]
    for line, r in zip(md[1:], doc["rows"]):
        cells = dict(zip(keys, (c.strip() for c in line.strip("|").split(" | "))))
        for key, cell in r["values"].items():
            shown = cells[key]
            if cell["value"] is None:
                assert shown.startswith("n/a [")
                continue
            digits = len(shown.split(".")[1]) if "." in shown else 0
            assert abs(float(shown.replace(",", "")) - cell["value"]) <= 0.5 * 10**-digits + 1e-9, (key, shown)
    assert "(B)" in md[0] and "(ms)" in md[0] and "(%)" in md[0]  # units in headers


def test_json_is_versioned_and_reloadable(doc, tmp_path):
    p = tmp_path / "r.json"
    p.write_text(render(doc, "json"))
    again = load_report_json(p)
    assert again["schema"] == "edgedeploy.report" and again["schema_version"] == 1
    assert again["rows"] == json.loads(json.dumps(doc["rows"]))
    p.write_text(json.dumps({**again, "schema_version": 2}))
    with pytest.raises(InvalidInputError, match="schema version 2"):
        load_report_json(p)
    p.write_text(json.dumps({"schema": "edgedeploy.compile"}))
    with pytest.raises(InvalidInputError, match="not an edgedeploy report"):
        load_report_json(p)


def test_html_is_self_contained_and_states_skipped_plots(doc):
    page = render_html(doc)
    assert page.count("<img ") >= 3  # flash vs cycles and the per-layer cycles of each recommendation
    assert all(part.startswith("data:image/png;base64,") for part in page.split("src='")[1:])
    assert "http://" not in page and "https://" not in page
    assert "Accuracy vs NPU-encoded weights: no leaf has a measured accuracy" in page
    assert "Weight density through the stages: no optimize/baseline record" in page


def test_help_imports_no_heavy_modules():
    code = ("import sys; from edgedeploy.commands import app; "
            "bad = [m for m in ('tensorflow', 'matplotlib', 'numpy', 'h5py') if m in sys.modules]; print(bad)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
    help_text = run_cli("report", "--help").stdout
    assert "--fail-on-regression" in help_text and "[requirements]" in help_text


# --------------------------------------------------------------------------- regression gate


def test_compare_equal_reports_pass(doc):
    comp = compare_reports(doc, doc, DEFAULT_TOLERANCES, "same.json")
    assert comp["passed"] and comp["regressions"] == [] and comp["changes"] == []
    raise_on_regression(comp)


def test_compare_finds_regressions_beyond_tolerance(doc):
    old = copy.deepcopy(doc)
    r = row(old, "dscnn_mlperf", "corstone-300-u55-128")
    r["values"]["total_cycles"]["value"] = int(r["values"]["total_cycles"]["value"] / 1.05)  # new is +5%
    r["values"]["sram_bytes"]["value"] -= 100  # +0.45%: within 1%
    r2 = row(old, "resnet8_mlperf", "ethos-u85-256")
    r2["values"]["compiled_model_bytes"]["value"] -= 2000  # about +2.1%
    comp = compare_reports(old, doc, DEFAULT_TOLERANCES, "old.json")
    got = {(x["leaf"], x["target"], x["metric"]) for x in comp["regressions"]}
    assert got == {("dscnn_mlperf", "corstone-300-u55-128", "cycles"), ("resnet8_mlperf", "ethos-u85-256", "flash")}
    assert any("within the tolerance sram=1%" in c["text"] for c in comp["changes"])
    with pytest.raises(RegressionError, match="2 regression") as err:
        raise_on_regression(comp)
    assert err.value.exit_code == 10
    loose = parse_tolerances("cycles=6%,flash=3%")
    assert compare_reports(old, doc, loose, "old.json")["passed"]


def test_compare_accuracy_and_missing_rows(doc):
    old, new = copy.deepcopy(doc), copy.deepcopy(doc)
    for d, acc in ((old, 90.0), (new, 89.4)):
        for r in d["rows"]:
            r["values"]["int8_accuracy_pct"] = {"value": acc, "unit": "%", "mode": "measured"}
    comp = compare_reports(old, new, DEFAULT_TOLERANCES)
    assert {x["metric"] for x in comp["regressions"]} == {"accuracy"}  # 0.6 points > 0.5
    assert compare_reports(old, new, parse_tolerances("accuracy=0.7"))["passed"]
    new["rows"] = [r for r in doc["rows"] if r["leaf"] != "resnet8_mlperf"]
    comp = compare_reports(doc, new, DEFAULT_TOLERANCES)
    assert sum("missing now" in x["text"] for x in comp["regressions"]) == 2


def test_cli_gate(tmp_path):
    ref = tmp_path / "old.json"
    assert run_cli("report", RUN, "--format", "json", "--out", ref).returncode == 0
    ok = run_cli("report", RUN, "--compare", ref, "--fail-on-regression", "--format", "markdown")
    assert ok.returncode == 0 and "no regression" in ok.stdout
    old = json.loads(ref.read_text())
    old["rows"][0]["values"]["total_cycles"]["value"] -= 10_000
    ref.write_text(json.dumps(old))
    bad = run_cli("report", RUN, "--compare", ref, "--fail-on-regression", "--format", "csv")
    assert bad.returncode == 10
    assert "1 regression(s)" in bad.stderr and "total cycles" in bad.stderr


# --------------------------------------------------------------------------- partial runs


def test_uncompiled_leaf_and_failed_compile(tmp_path):
    """A copy of the recorded run with a convert-style record (accuracies stated by this test, no model file)
    for a leaf that was never compiled, and a failed compile record."""
    import shutil

    from edgedeploy.manifest import Metric, StageRecord

    run = tmp_path / "run"
    shutil.copytree(RUN, run)
    m = Manifest.load(run)
    m.records["convert/ptq"] = StageRecord(
        id="convert/ptq", stage="convert", status="ok", variant="ptq",
        metrics={"float_accuracy": Metric(92.2, "%", "measured"), "int8_accuracy": Metric(91.9, "%", "measured"),
                 "tflite_bytes": Metric(53936, "B", "measured"),
                 "gzip_bytes": Metric.missing("B", "measured", "not measured in this test")})
    m.records["compile/resnet8_mlperf/ethos-u55-256"] = StageRecord(
        id="compile/resnet8_mlperf/ethos-u55-256", stage="compile", status="failed", variant="resnet8_mlperf",
        target="ethos-u55-256", error="Vela failed (exit 1): out of memory")
    m.save()
    doc = build_report(run)
    ptq = next(r for r in doc["rows"] if r["leaf"] == "ptq")
    assert ptq["target"] is None and ptq["level"] == 0 and ptq["kind"] == "leaf"
    assert ptq["values"]["int8_accuracy_pct"]["value"] == 91.9
    assert ptq["values"]["int8_accuracy_delta_pts"]["value"] == 0
    assert ptq["values"]["gzip_bytes"]["unavailable"] == "not measured in this test"
    assert "not compiled" in ptq["values"]["total_cycles"]["unavailable"]
    failed = row(doc, "resnet8_mlperf", "ethos-u55-256")
    assert "failed: Vela failed (exit 1): out of memory" in failed["values"]["sram_bytes"]["unavailable"]
    rec = doc["recommendations"]["ethos-u55-256"]
    assert rec["leaf"] is None and not rec["judged"] and "no leaf was compiled" in rec["message"]
    assert doc["compression"]["ptq"]["status"] == "unavailable"
    # Other targets still recommend the compiled model; every format renders the partial run.
    assert doc["recommendations"]["ethos-u85-256"]["leaf"] == "dscnn_mlperf"
    table = render(doc, "table")
    assert "Not compiled for any target: ptq" in table and "out of memory" in table
    for fmt in ("markdown", "csv", "html", "json"):
        assert "out of memory" in render(doc, fmt)


def test_a_palette_leaf_over_its_size_budget_is_flagged(tmp_path):
    """A copy of the recorded run whose DS-CNN compile records stand in for a palette sweep's two leaves (the
    sweep's record is stated by this test): the QAT leaf over the budget its plan met gets a note and a row
    warning; the PTQ leaf under it, and the other target, get none."""
    import shutil

    from edgedeploy.manifest import StageRecord

    run = tmp_path / "run"
    shutil.copytree(RUN, run)
    m = Manifest.load(run)
    compiled = m.records["compile/dscnn_mlperf/corstone-300-u55-128"]
    mine = compiled.metrics["encoded_weights_bytes"].value
    for leaf in ("pcqat_palette", "pruned_clustered_palette"):
        for target in ("corstone-300-u55-128", "ethos-u85-256"):
            rec = copy.deepcopy(m.records[f"compile/dscnn_mlperf/{target}"])
            rec.id, rec.variant = f"compile/{leaf}/{target}", leaf
            m.records[rec.id] = rec
    m.records["compile/pruned_clustered_palette/corstone-300-u55-128"].metrics["encoded_weights_bytes"].value = mine - 64
    reference = (mine - 16) * 5 // 2  # 0.4 x reference = mine - 16

    def sweep(fits: bool) -> StageRecord:
        return StageRecord(
            id="optimize/pruned_clustered_palette", stage="optimize", status="ok", variant="pruned_clustered_palette",
            details={"sweep": {"target": "corstone-300-u55-128", "size": {
                "size_budget": 0.4, "reference_encoded_bytes": reference, "encoded_bytes": mine - 64, "fits": fits}}})

    m.records["optimize/pruned_clustered_palette"] = sweep(True)
    m.save()
    doc = build_report(run)
    flagged = [n for n in doc["notes"] if "over its size budget" in n]
    assert len(flagged) == 1 and flagged[0].startswith("pcqat_palette on corstone-300-u55-128: ")
    assert "16 B over" in flagged[0] and "pruned_clustered_palette, which keeps them" in flagged[0]
    assert flagged[0] in row(doc, "pcqat_palette", "corstone-300-u55-128")["warnings"]
    assert not any("size budget" in w for r in doc["rows"] if r["leaf"] != "pcqat_palette" or
                   r["target"] != "corstone-300-u55-128" for w in r["warnings"])
    for fmt in ("table", "markdown", "html"):
        assert "16 B over its size budget" in " ".join(render(doc, fmt).split()), fmt
    # a sweep whose smallest plan could not fit already said so in its own stage
    m.records["optimize/pruned_clustered_palette"] = sweep(False)
    m.save()
    assert not [n for n in build_report(run)["notes"] if "over its size budget" in n]


# --------------------------------------------------------------------------- weights of a real int8 model


@pytest.mark.requires_data
def test_weight_reader_matches_the_tflite_package(dscnn_int8):
    import numpy as np
    import tflite

    from edgedeploy.report import weight_diagnostics
    from edgedeploy.tflite_model import read_weight_tensors

    buf = dscnn_int8.read_bytes()
    model = tflite.Model.GetRootAsModel(buf, 0)
    sg = model.Subgraphs(0)
    tensors = {sg.Tensors(i).Name().decode(): sg.Tensors(i) for i in range(sg.TensorsLength())}
    weights = read_weight_tensors(dscnn_int8)
    assert [w.op for w in weights].count("CONV_2D") == 5 and [w.op for w in weights].count("DEPTHWISE_CONV_2D") == 4
    for w in weights:
        t = tensors[w.name]
        assert bytes(model.Buffers(t.Buffer()).DataAsNumpy()) == w.data
        assert tuple(t.ShapeAsNumpy()) == w.shape and w.dtype == "int8"
        assert w.quantized_dimension == t.Quantization().QuantizedDimension()
    diag = {d["tensor"]: d for d in weight_diagnostics(dscnn_int8)}
    for w in weights:
        v = np.frombuffer(w.data, np.int8).reshape(w.shape)
        axis = 3 if w.op == "DEPTHWISE_CONV_2D" else 0
        per_channel = max(len(set(np.take(v, i, axis=axis).ravel().tolist())) for i in range(v.shape[axis]))
        d = diag[w.name]
        assert d["distinct_values"] == len(set(v.ravel().tolist()))
        assert d["max_distinct_per_channel"] == per_channel and d["output_channels"] == v.shape[axis]
        assert d["zero_fraction"] == pytest.approx(float((v == 0).mean()))
