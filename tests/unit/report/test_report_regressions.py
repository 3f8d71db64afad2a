"""edgedeploy.report.regressions: the regression gate.

tests/data/report/run_u55_u85 is a run folder written by `edgedeploy compile` with Vela 5.2.0 (see its
SOURCE.md): the MLPerf DS-CNN and ResNet-8 int8 models on corstone-300-u55-128 and ethos-u85-256.
"""

from __future__ import annotations

import copy

import pytest

from helpers import RECORDED_RUN as RUN, report_row as row

from edgedeploy.errors import RegressionError
from edgedeploy.report import DEFAULT_TOLERANCES, build_report, compare_reports, parse_tolerances, raise_on_regression


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
    # bytes and cycles written as the requirement checks write them (edgedeploy.core.units.fmt_in_unit)
    cycles = r["values"]["total_cycles"]["value"]
    new_cycles = row(doc, "dscnn_mlperf", "corstone-300-u55-128")["values"]["total_cycles"]["value"]
    assert any(x["text"].startswith(f"dscnn_mlperf on corstone-300-u55-128: total cycles {cycles:,} cycles → "
                                    f"{new_cycles:,} cycles") for x in comp["regressions"])
    assert any(" B → " in x["text"] and x["metric"] == "flash" for x in comp["regressions"])
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


def test_compare_gates_leaves_not_compiled_with_their_metric_direction(doc):
    def uncompiled(mse):
        d = copy.deepcopy(doc)
        d["rows"] = [{"leaf": "pqat", "target": None, "values": {
            "int8_metric": {"value": mse, "unit": "", "mode": "measured", "metric": "mse", "higher_is_better": False}}}]
        return d

    comp = compare_reports(uncompiled(0.07), uncompiled(0.15), DEFAULT_TOLERANCES, "old.json")
    assert [(x["leaf"], x["target"], x["metric"]) for x in comp["regressions"]] == [("pqat", None, "metric")]
    assert comp["regressions"][0]["text"].startswith("pqat: int8 mse 0.07 → 0.15")
    assert compare_reports(uncompiled(0.15), uncompiled(0.07), DEFAULT_TOLERANCES)["passed"]  # lower MSE is better
    compiled = copy.deepcopy(doc)
    compiled["rows"] = [{**r, "leaf": "pqat"} for r in doc["rows"][:1]]
    assert compare_reports(uncompiled(0.07), compiled, DEFAULT_TOLERANCES)["passed"]  # compiled since
