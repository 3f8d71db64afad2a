"""The report judges a leaf that is not a classifier by its own metric, in that metric's direction."""

from __future__ import annotations

from edgedeploy.manifest import Metric, StageRecord
from edgedeploy.report import compare_reports, parse_tolerances
from edgedeploy.report.collect import _Variant, _accuracy_values
from edgedeploy.report.judge import _check_requirements
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
    _check_requirements(row, Requirements(max_metric_drop=0.05))
    assert row["meets_requirements"] is True
    _check_requirements(row, Requirements(max_metric_drop=0.01))
    assert row["meets_requirements"] is False
    _check_requirements(row, Requirements(max_accuracy_drop=1.0))  # no accuracy: cannot be judged, not met
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
