"""The optimize command's leaf table (edgedeploy.api.leaves_json, edgedeploy.api.process.leaves_table) names the layers 2:4 left out,
palette leaves included."""

from __future__ import annotations

from types import SimpleNamespace

from edgedeploy.api import leaves_json
from edgedeploy.core.manifest import StageRecord


def _rec(leaf, details):
    return StageRecord.from_dict({
        "id": f"convert/{leaf}", "stage": "convert", "status": "ok", "variant": leaf, "details": details,
        "metrics": {"int8_accuracy": {"value": 0.5}, "gzip_bytes": {"value": 100}},
        "outputs": [{"role": "int8_model", "path": f"convert/{leaf}/model_int8.tflite", "sha256": "0", "bytes": 1}],
    })


def test_a_palette_leaf_names_the_layers_its_int8_2of4_check_left_out():
    # the rows a 2:4 pcqat_palette leaf recorded (convert/pcqat_palette details.pattern_2of4 of a real run)
    pattern = [
        {"layer": "model/quant_conv2d/Conv2D", "kind": "Conv2D", "where": "int8", "pattern": "2:4",
         "status": "left out", "note": "3 input channels, not a multiple of 4"},
        {"layer": "model/quant_conv2d_1/Conv2D", "kind": "Conv2D", "where": "int8", "pattern": "2:4", "groups": 108,
         "groups_short": 0, "status": "ok", "note": ""},
    ]
    outcome = SimpleNamespace(run_dir="run", leaves={"ptq": _rec("ptq", {}), "pcqat_palette": _rec("pcqat_palette",
                                                                                    {"pattern_2of4": pattern})})
    notes = {d["leaf"]: d["preservation_notes"] for d in leaves_json(outcome)["leaves"]}
    assert [(r["layer"], r["status"]) for r in notes["pcqat_palette"]] == [("conv2d", "left out")]
    assert notes["ptq"] == []


def test_the_leaf_table_is_headed_by_the_task_metric_and_its_unit():
    import io

    from rich.console import Console

    from edgedeploy.api.process import leaves_table

    def headers(details, metrics):
        rec = _rec("ptq", details)
        rec.metrics.update({k: type(rec.metrics["gzip_bytes"])(v, "", "measured") for k, v in metrics.items()})
        rec.metrics["tflite_bytes"] = rec.metrics["gzip_bytes"]
        table = leaves_table(leaves_json(SimpleNamespace(run_dir="run", leaves={"ptq": rec})))
        console = Console(file=io.StringIO(), width=200, no_color=True)
        console.print(table)
        return table.title, [c.header for c in table.columns]

    title, cols = headers({"metric": {"name": "psnr", "key": "psnr", "unit": "dB", "higher_is_better": True}},
                          {"float_psnr": 30.0, "int8_psnr": 29.5})
    assert title == "Deployment tree leaves (PSNR on the evaluation split)"
    assert cols[1:3] == ["Float PSNR (dB)", "Int8 PSNR (dB)"]
    title, cols = headers({}, {})
    assert title == "Deployment tree leaves (accuracy on the evaluation split)"
    assert cols[1:3] == ["Float accuracy (%)", "Int8 accuracy (%)"]
