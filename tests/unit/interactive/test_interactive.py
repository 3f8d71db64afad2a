"""The Python API's face without TensorFlow: the package attribute, the report object's HTML and DataFrame."""

from __future__ import annotations

import subprocess
import sys

import pytest

from edgedeploy.interactive.report_view import Report, _scoped_css
from edgedeploy.report.columns import VALUE_COLUMNS


def test_edgedeploy_optimize_is_the_typed_function_and_the_subpackage_still_imports():
    code = ("import sys, importlib, inspect, edgedeploy; f = edgedeploy.optimize; "
            "sub = importlib.import_module('edgedeploy.optimize'); import edgedeploy.pipeline.tree_run; "
            "assert edgedeploy.optimize is f and inspect.isfunction(f) and hasattr(sub, 'fine_tune'); "
            "assert [p for p in inspect.signature(f).parameters][:3] == ['model', 'data', 'out']; "
            "assert 'tensorflow' not in sys.modules and 'pandas' not in sys.modules")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_page_styles_are_scoped_to_the_report():
    css = _scoped_css("body { margin: 24px; }\nth, td { border: 1px solid #ccc; }\n.bad { color: red; }")
    assert css.splitlines() == [".edgedeploy-report { margin: 24px; }",
                                ".edgedeploy-report th, .edgedeploy-report td { border: 1px solid #ccc; }",
                                ".edgedeploy-report .bad { color: red; }"]


def test_the_report_becomes_one_row_per_leaf_and_target():
    pd = pytest.importorskip("pandas")
    values = {c.key: {"value": None, "unit": c.unit, "unavailable": "not compiled"} for c in VALUE_COLUMNS}
    rows = [{"leaf": leaf, "target": "ethos-u55-128", "level": lvl, "recommended": leaf == "pcqat",
             "fit": {"fits": None}, "values": {**values, "int8_accuracy_pct": {"value": acc, "unit": "%"}}}
            for leaf, lvl, acc in (("ptq", 0, 90.5), ("pcqat", 3, 90.0))]
    report = Report({"rows": rows, "recommendations": {"ethos-u55-128": {"leaf": "pcqat"}}, "run_dir": "out"})
    frame = report.to_pandas()
    assert isinstance(frame, pd.DataFrame)
    assert frame[["leaf", "int8_accuracy_pct", "recommended"]].values.tolist() == [["ptq", 90.5, False],
                                                                                 ["pcqat", 90.0, True]]
    assert frame["latency_ms"].isna().all() and frame.attrs["units"]["latency_ms"] == "ms"
    assert "recommended ethos-u55-128: pcqat" in repr(report)
