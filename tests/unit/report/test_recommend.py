"""The recommendation is never a leaf another leaf beats on accuracy, flash and latency at once.

Rows come from the recorded real run (tests/data/report/run_u55_u85: Vela 5.2 on the MLPerf DS-CNN and
ResNet-8) with tree-leaf names and int8 accuracies stated by the test, and from rows built here.
"""

from __future__ import annotations

import copy
from pathlib import Path

import pytest

from edgedeploy.report.judge import check_row, choose, dominates, objectives, recommend
from edgedeploy.report import Requirements, build_report

RUN = Path(__file__).resolve().parents[2] / "data" / "report" / "run_u55_u85"


def cell(value, unit=""):
    return {"value": value, "unit": unit, "mode": "estimated"}


def made(leaf, level, acc, flash, cycles, meets=None):
    return {"leaf": leaf, "level": level, "meets_requirements": meets,
            "values": {"int8_accuracy_pct": cell(acc, "%"), "compiled_model_bytes": cell(flash, "B"),
                       "total_cycles": cell(cycles)}}


def test_dominance_needs_every_axis():
    assert dominates((-90, 100, 10), (-80, 200, 20))
    assert dominates((-90, 100, 10), (-90, 100, 11))
    assert not dominates((-90, 100, 10), (-90, 100, 10))  # equal: neither beats the other
    assert not dominates((-95, 300, 10), (-80, 200, 20))  # better accuracy, bigger: a trade-off


def test_least_optimized_leaf_on_the_front_wins():
    rows = [made("ptq", 0, 90.0, 60000, 500), made("pruned", 2, 88.0, 40000, 450), made("pcqat", 4, 87.0, 30000, 440)]
    choice = choose(rows)
    assert choice.row["leaf"] == "ptq" and choice.beaten == {}


def test_dominated_ptq_is_passed_over_for_the_leaf_that_beats_it():
    # the DS-CNN-M case: pcqat_palette is more accurate, smaller and faster than ptq and qat
    rows = [made("ptq", 0, 90.5, 60000, 500), made("qat", 1, 91.0, 60000, 500),
            made("pcqat_palette", 4, 93.2, 27000, 480), made("pruned", 2, 94.0, 80000, 900)]
    choice = choose(rows)
    assert choice.row["leaf"] == "pruned"  # on the front (most accurate), less optimized than pcqat_palette
    assert choice.beaten == {"ptq": "qat", "qat": "pcqat_palette"}  # the least-optimized leaf that beats it
    rows[-1] = made("pruned", 2, 85.0, 80000, 900)
    assert choose(rows).row["leaf"] == "pcqat_palette"


def test_imported_models_come_after_tree_leaves_and_missing_accuracy_counts_as_worst():
    rows = [made("mine", None, 95.0, 10000, 100), made("ptq", 0, None, 10000, 100), made("qat", 1, 80.0, 10000, 100)]
    # ptq has no accuracy: qat (same flash and cycles) beats it; qat is a tree leaf, so before the import
    assert choose([rows[1], rows[2]]).row["leaf"] == "qat"
    assert choose(rows).row["leaf"] == "mine"  # beats both
    assert objectives(rows[1])[0] == float("inf")


@pytest.fixture(scope="module")
def recorded_rows():
    """The recorded rows of one target as a four-leaf tree: DS-CNN is smaller and faster than ResNet-8."""
    doc = build_report(RUN)
    t = "ethos-u85-256"
    by = {r["leaf"]: r for r in doc["rows"] if r["target"] == t}
    resnet, dscnn = by["resnet8_mlperf"], by["dscnn_mlperf"]
    rows = []
    for leaf, level, src, acc in (("ptq", 0, resnet, 86.0), ("qat", 1, resnet, 86.3),
                                  ("pruned", 2, dscnn, 85.0), ("pcqat_palette", 4, dscnn, 88.7)):
        r = copy.deepcopy(src)
        r.update(leaf=leaf, level=level, recommended=False)
        r["values"]["int8_accuracy_pct"] = cell(acc, "%")
        r["values"]["int8_accuracy_delta_pts"] = cell(round(acc - 86.0, 3), "pts")
        rows.append(r)
    return t, rows


def _run(rows, t, req):
    rows = copy.deepcopy(rows)
    for r in rows:
        check_row(r, req)
    return recommend(rows, t, req), rows


def test_recorded_rows_without_requirements_never_recommend_a_dominated_leaf(recorded_rows):
    t, rows = recorded_rows
    rec, judged = _run(rows, t, Requirements())
    assert rec["leaf"] == "pcqat_palette" and rec["met"]
    assert rec["passed_over"] == {"ptq": "qat", "qat": "pcqat_palette", "pruned": "pcqat_palette"}
    assert "beaten by pcqat_palette" in rec["message"]
    best = next(r for r in judged if r["recommended"])
    assert not any(dominates(objectives(o), objectives(best)) for o in judged if o is not best)


def test_recorded_rows_a_requirement_the_better_leaf_misses_keeps_ptq(recorded_rows):
    t, rows = recorded_rows
    flash = {r["leaf"]: r["values"]["compiled_model_bytes"]["value"] for r in rows}
    # the palette leaf stated to need more SRAM than the limit: the leaves beaten only by it are candidates again
    rows = copy.deepcopy(rows)
    sram = rows[0]["values"]["sram_bytes"]["value"]
    rows[3]["values"]["sram_bytes"]["value"] = sram + 1
    rows[2]["values"]["sram_bytes"]["value"] = sram + 1
    rec, _ = _run(rows, t, Requirements(max_sram=sram))
    assert rec["leaf"] == "qat"  # qat beats ptq (more accurate, same flash and cycles)
    rec, _ = _run(rows, t, Requirements(max_flash=flash["pcqat_palette"]))
    assert rec["leaf"] == "pcqat_palette"


def test_npu_cycles_requirement_on_the_recorded_run():
    doc = build_report(RUN)
    t = "ethos-u85-256"
    cycles = {r["leaf"]: r["values"]["npu_cycles"]["value"] for r in doc["rows"] if r["target"] == t}
    out = build_report(RUN, Requirements(max_npu_cycles=cycles["dscnn_mlperf"]))
    assert out["recommendations"][t]["leaf"] == "dscnn_mlperf"
    out = build_report(RUN, Requirements(max_npu_cycles=cycles["dscnn_mlperf"] - 1))
    (u,) = out["recommendations"][t]["unmet"]
    assert u["requirement"] == "max_npu_cycles" and u["excess"] == 1 and "over by 1 cycles" in u["text"]


def test_a_regression_leaf_is_judged_by_its_metric_drop():
    def reg(leaf, level, drop, flash, cycles):
        r = made(leaf, level, None, flash, cycles)
        r["values"]["int8_metric_drop"] = cell(drop)
        return r

    rows = [reg("ptq", 0, 0.0, 60000, 500), reg("pcqat", 4, -0.001, 30000, 480)]  # pcqat's MSE is lower
    choice = choose(rows)
    assert choice.row["leaf"] == "pcqat" and choice.beaten == {"ptq": "pcqat"}
