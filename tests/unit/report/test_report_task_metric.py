"""The report judges a leaf that is not a classifier by its own metric, in that metric's direction."""

from __future__ import annotations

from helpers import RECORDED_RUN as RUN

from edgedeploy.core.manifest import Metric, StageRecord
from edgedeploy.report import compare_reports, parse_tolerances
from edgedeploy.report.collect import _Variant, _accuracy_values
from edgedeploy.report.judge import check_row
from edgedeploy.report.limits import Requirements

SPEC = {"name": "mse", "key": "mse", "unit": "", "higher_is_better": False, "task": "reconstruction", "title": "MSE"}


def _convert(leaf: str, mse: float, auc: float) -> StageRecord:
    rec = StageRecord(id=f"convert/{leaf}", stage="convert", variant=leaf, status="ok")
    rec.metrics = {"float_mse": Metric(mse * 0.99, "", "measured"), "int8_mse": Metric(mse, "", "measured"),
                   "int8_auc": Metric(auc, "%", "measured"), "tflite_bytes": Metric(1000, "B", "measured"),
                   "gzip_bytes": Metric(900, "B", "measured")}
    rec.details = {"metric": dict(SPEC)}
    return rec


def test_metric_columns_drop_and_accuracy_unavailable():
    ptq = _Variant("ptq", accuracy=_convert("ptq", 0.80, 70.0))
    pcqat = _Variant("pcqat", accuracy=_convert("pcqat", 0.84, 69.0))
    mine = _accuracy_values(pcqat, ptq)
    assert mine["int8_metric"]["value"] == 0.84 and mine["int8_metric"]["higher_is_better"] is False
    assert abs(mine["int8_metric_drop"]["value"] - 0.04) < 1e-9  # lower is better: a rise of the MSE is a drop
    assert mine["int8_accuracy_pct"]["value"] is None and "not a classifier" in mine["int8_accuracy_pct"]["unavailable"]
    assert "AUC 69" in mine["int8_other_metrics"]["value"]
    row = {"values": mine, "fit": {"applies": False}, "target": "t"}
    check_row(row, Requirements(max_metric_drop=0.05))
    assert row["meets_requirements"] is True
    check_row(row, Requirements(max_metric_drop=0.01))
    assert row["meets_requirements"] is False
    check_row(row, Requirements(max_accuracy_drop=1.0))  # no accuracy: cannot be judged, not met
    assert row["requirements"]["max_accuracy_drop"]["met"] is None


def test_regression_gate_compares_the_metric_in_its_direction():
    def doc(mse: float) -> dict:
        cell = {"value": mse, "unit": "", "mode": "measured", "metric": "mse", "higher_is_better": False}
        return {"rows": [{"leaf": "ptq", "target": "t", "values": {"int8_metric": cell}}]}

    tol = parse_tolerances("metric=1%")
    worse = compare_reports(doc(0.80), doc(0.90), tol)
    assert not worse["passed"] and "int8 mse" in worse["regressions"][0]["text"]
    better = compare_reports(doc(0.80), doc(0.70), tol)
    assert better["passed"] and "better" in better["changes"][0]["text"]


PSNR = {"name": "psnr", "key": "psnr", "unit": "dB", "higher_is_better": True, "task": "regression", "title": "PSNR"}


def _regression_run(tmp_path):
    """The recorded two-model run, with each leaf's convert stage judged by PSNR (a regression model)."""
    import shutil

    from edgedeploy.core.manifest import Manifest

    run = tmp_path / "run"
    shutil.copytree(RUN, run)
    m = Manifest.load(run)
    for leaf, db in (("dscnn_mlperf", 31.5), ("resnet8_mlperf", 29.25)):
        rec = StageRecord(id=f"convert/{leaf}", stage="convert", variant=leaf, status="ok")
        rec.metrics = {"float_psnr": Metric(db + 0.5, "dB", "measured"), "int8_psnr": Metric(db, "dB", "measured"),
                       "tflite_bytes": Metric(1000, "B", "measured"), "gzip_bytes": Metric(900, "B", "measured")}
        rec.details = {"metric": dict(PSNR)}
        m.record(rec)
    m.save()
    return run


def test_a_regression_report_names_its_metric_and_unit_instead_of_accuracy(tmp_path):
    from edgedeploy.report import build_report
    from edgedeploy.report.render import render_html, render_markdown, render_table

    run = _regression_run(tmp_path)
    doc = build_report(run, html=True)
    text, md, page = render_table(doc), render_markdown(doc), render_html(doc)
    assert "PSNR and file size of each leaf" in text
    header = next(line for line in md.splitlines() if line.startswith("| Leaf"))
    assert "| Float PSNR (dB) | Int8 PSNR (dB) | PSNR drop vs ptq (dB) |" in header
    assert "| 31.5 |" in md  # the number alone: the header names the metric and its unit
    assert "PSNR vs NPU-encoded weights" in page and "Int8 PSNR (dB)" in page
    for shown in (text, md, page):
        assert "ccuracy" not in shown, [line for line in shown.splitlines() if "ccuracy" in line][:3]
    assert [c["header"] for c in doc["columns"] if c["key"] == "int8_metric"] == ["Int8 PSNR (dB)"]
    judged = build_report(run, Requirements(max_metric_drop=0.5))
    assert judged["rows"][0]["requirements"]["max_metric_drop"]["label"] == "int8 PSNR drop vs ptq ≤ 0.5 dB"
    assert "max_metric_drop = 0.5 dB (int8 PSNR worse than the ptq leaf's)" in render_table(judged)


def test_the_compile_table_shows_the_task_metric_of_a_regression_leaf(tmp_path):
    from edgedeploy.core.manifest import Manifest
    from edgedeploy.report.render.tables import compile_columns, compile_rows

    m = Manifest.load(_regression_run(tmp_path))
    records = m.find(stage="compile")
    for r in records:
        r.parent = f"convert/{r.variant}"
    rows = compile_rows(m, records, set())
    assert dict(compile_columns(rows))["accuracy"] == "Int8 PSNR (dB)"
    assert {r["variant"]: r["accuracy"] for r in rows} == {"dscnn_mlperf": "31.5", "resnet8_mlperf": "29.25"}
    for r in records:  # imported .tflite files: no quality column at all, as before
        r.parent = None
    assert "accuracy" not in dict(compile_columns(compile_rows(m, records, set())))


def test_a_classifier_with_other_outputs_shows_their_metrics_beside_its_accuracy():
    """The first output's accuracy is the judged score; another output's metrics (``int8_box_mse``) are named after
    the output in *Other int8 metrics*; a classifier with one output gets no such column."""
    from edgedeploy.report.columns import value_columns

    def convert(leaf: str, extra: dict) -> StageRecord:
        rec = StageRecord(id=f"convert/{leaf}", stage="convert", variant=leaf, status="ok")
        rec.metrics = {"float_accuracy": Metric(80.0, "%", "measured"), "int8_accuracy": Metric(79.0, "%", "measured"),
                       "tflite_bytes": Metric(1000, "B", "measured"), "gzip_bytes": Metric(900, "B", "measured"),
                       **extra}
        return rec

    heads = {"int8_box_mse": Metric(0.02, "", "measured"), "int8_box_psnr": Metric(17.5, "dB", "measured"),
             "int8_top_box_mae": Metric(0.1, "", "measured")}
    mine = _accuracy_values(_Variant("ptq", accuracy=convert("ptq", heads)), None)
    assert mine["int8_accuracy_pct"]["value"] == 79.0
    assert mine["int8_other_metrics"]["value"] == "box MSE 0.02, box PSNR 17.5 dB, top_box MAE 0.1"
    alone = _accuracy_values(_Variant("ptq", accuracy=convert("ptq", {})), None)
    assert "int8_other_metrics" not in alone
    keys = [[c.key for c in value_columns([{"values": values}])] for values in (mine, alone)]
    assert "int8_other_metrics" in keys[0] and "int8_other_metrics" not in keys[1]
