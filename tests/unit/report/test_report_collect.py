"""edgedeploy.report.collect and .compression on a recorded real run (no Vela, no TensorFlow).

tests/data/report/run_u55_u85 is a run folder written by `edgedeploy compile` with Vela 5.2.0 (see its
SOURCE.md): the MLPerf DS-CNN and ResNet-8 int8 models on corstone-300-u55-128 and ethos-u85-256.
"""

from __future__ import annotations

import copy
import csv

import pytest

from helpers import RECORDED_RUN as RUN, report_row as row

from edgedeploy.core.manifest import Manifest
from edgedeploy.report import build_report
from edgedeploy.report.render import render


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


def test_uncompiled_leaf_and_failed_compile(tmp_path):
    """A copy of the recorded run with a convert-style record (accuracies stated by this test, no model file)
    for a leaf that was never compiled, and a failed compile record."""
    import shutil

    from edgedeploy.core.manifest import Metric, StageRecord

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

    from edgedeploy.core.manifest import StageRecord

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


@pytest.mark.requires_data
def test_weight_reader_matches_the_tflite_package(dscnn_int8):
    import numpy as np
    import tflite

    from edgedeploy.report import weight_diagnostics
    from edgedeploy.tflite.reader import read_weight_tensors

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
