"""The comparing report of a sweep (edgedeploy.report.sweep_report) on hand-made member report documents: rows of every
model, each model's pick, one overall pick per target on the front of quality, flash and latency, no ranking of
models judged by different metrics or on different data, failures named, every format from the same document,
and the regression gate per model."""

from __future__ import annotations

import csv
import json

import pytest

from edgedeploy.errors import InvalidInputError, UsageError
from edgedeploy.report import DEFAULT_TOLERANCES, Requirements
from edgedeploy.report.render import render
from edgedeploy.report.judge import sweep_unmet
from edgedeploy.report.regressions import compare_reports
from edgedeploy.report.sweep_report import compare_models, load_sweep_record, load_sweep_report_json

T = "ethos-u55-128"
DATA = {"path": "/d/kws.npz", "sha256": "a" * 64, "eval_split": "split == 1", "n_eval": 400}


def cell(value, unit="", **extra):
    return {"value": value, "unit": unit, "mode": "estimated", **extra}


def row(leaf, level, acc, flash, cycles, meets=None, recommended=False, target=T, metric=None):
    values = {"int8_accuracy_pct": cell(acc, "%"), "int8_accuracy_delta_pts": cell(None, "pts"),
              "compiled_model_bytes": cell(flash, "B"), "sram_bytes": cell(20000, "B"),
              "total_cycles": cell(cycles, "cycles"), "latency_ms": cell(cycles / 500000, "ms")}
    if metric is not None:  # a task judged by its metric (value, name, higher_is_better)
        values["int8_accuracy_pct"] = cell(None, "%")
        values["int8_metric"] = cell(metric[0], "", metric=metric[1], higher_is_better=metric[2])
        values["int8_metric_drop"] = cell(0.0)
    return {"leaf": leaf, "target": target, "level": level, "values": values, "meets_requirements": meets,
            "recommended": recommended}


def doc(rows, pick=None):
    return {"schema": "edgedeploy.report", "schema_version": 1, "rows": rows, "created": "2026-01-01T00:00:00Z",
            "recommendations": {T: {"leaf": pick, "message": f"{T}: {pick}"}}, "walk": None}


def member(name, rows, pick=None, data=DATA, status="ok"):
    return ({"name": name, "folder": name, "run_dir": f"/out/{name}", "status": status, "error": None,
             "data": data}, doc(rows, pick))


def test_overall_pick_meets_the_requirements_and_no_meeting_pair_beats_it():
    a = member("a", [row("ptq", 0, 90.0, 36000, 90000, meets=False), row("pruned", 2, 88.0, 27000, 89000, meets=True,
                                                                        recommended=True)], "pruned")
    # b's pruned leaf is smaller but less accurate (a trade-off); b's pqat is beaten by a/pruned on every axis
    b = member("b", [row("ptq", 0, 91.0, 36000, 90000, meets=False), row("pruned", 2, 84.0, 22000, 88000, meets=True,
                                                                        recommended=True),
                     row("pqat", 3, 87.0, 28000, 89500, meets=True)], "pruned")
    d = compare_models([a, b], Requirements(max_flash=35000), run_dir="/out")
    assert d["schema"] == "edgedeploy.sweep_report" and d["comparable"]["ranked"] is True
    assert [(r["model"], r["leaf"]) for r in d["rows"]] == [("a", "ptq"), ("a", "pruned"), ("b", "ptq"),
                                                             ("b", "pruned"), ("b", "pqat")]
    overall = d["overall"][T]
    assert (overall["model"], overall["leaf"]) == ("a", "pruned")
    assert "a / pruned (88.00% accuracy, 27,000 B flash" in overall["message"]
    front = {(r["model"], r["leaf"]): r["front"] for r in d["rows"]}
    assert front[("b", "pqat")] is False and front[("a", "pruned")] is True and front[("b", "ptq")] is True
    assert [r["overall"] for r in d["rows"]].count(True) == 1
    assert {m["name"]: m["recommendations"][T]["leaf"] for m in d["models"]} == {"a": "pruned", "b": "pruned"}
    assert sweep_unmet(d) == []


def test_a_pair_missing_a_requirement_is_never_the_overall_pick():
    a = member("a", [row("ptq", 0, 95.0, 20000, 80000, meets=False)])  # best everywhere, but misses (e.g. SRAM)
    b = member("b", [row("ptq", 0, 90.0, 30000, 90000, meets=True)], "ptq")
    d = compare_models([a, b], Requirements(max_sram=1000))
    assert (d["overall"][T]["model"], d["overall"][T]["leaf"]) == ("b", "ptq")
    nothing = compare_models([a], Requirements(max_sram=1000))
    assert nothing["overall"][T]["leaf"] is None
    assert sweep_unmet(nothing) == [{"target": T, "message": f"no (model, leaf) of the sweep meets the requirements "
                                                             f"on {T}"}]


def test_without_requirements_the_least_optimized_undominated_pair_wins():
    a = member("a", [row("ptq", 0, 90.0, 36000, 90000), row("pruned", 2, 89.0, 27000, 89000)])
    b = member("b", [row("ptq", 0, 92.0, 36000, 90000), row("pruned", 2, 80.0, 20000, 88000)])
    d = compare_models([a, b])
    assert (d["overall"][T]["model"], d["overall"][T]["leaf"]) == ("b", "ptq")  # a/ptq is beaten by b/ptq
    assert "no requirements set" in d["overall"][T]["message"]
    assert next(r for r in d["rows"] if (r["model"], r["leaf"]) == ("a", "ptq"))["front"] is False


def test_models_judged_by_different_metrics_are_not_ranked():
    a = member("a", [row("ptq", 0, 90.0, 36000, 90000, meets=True)], "ptq")
    b = member("b", [row("ptq", 0, None, 20000, 50000, meets=True, metric=(0.01, "mse", False))], "ptq")
    d = compare_models([a, b], Requirements(max_flash=40000))
    assert d["comparable"]["ranked"] is False and "different metrics (a by accuracy, b by mse)" in d["comparable"]["why"]
    assert d["overall"][T]["leaf"] is None and all(r["front"] is None for r in d["rows"])
    assert "each model's own: a: ptq; b: ptq" in d["overall"][T]["message"]
    assert "0.01 mse" in render(d, "table")


def test_models_scored_on_different_data_are_not_ranked():
    a = member("a", [row("ptq", 0, 90.0, 36000, 90000)])
    b = member("b", [row("ptq", 0, 95.0, 30000, 80000)], data={**DATA, "path": "/d/other.npz", "sha256": "b" * 64})
    d = compare_models([a, b])
    assert d["comparable"]["ranked"] is False and "scored on different data (a: kws.npz, b: other.npz)" in \
        d["comparable"]["why"]
    assert d["overall"][T]["model"] is None


def test_the_same_clips_through_two_front_ends_are_ranked():
    # two files (MFCCs of two front ends, classes in another order) of the same evaluation clips and classes
    a = member("a", [row("ptq", 0, 90.0, 36000, 90000)], data={**DATA, "eval_set": "c" * 64})
    b = member("b", [row("ptq", 0, 95.0, 30000, 80000)],
               data={**DATA, "path": "/d/arm.npz", "sha256": "b" * 64, "eval_set": "c" * 64})
    d = compare_models([a, b])
    assert d["comparable"]["ranked"] is True and d["overall"][T]["model"] == "b"
    other = member("b", [row("ptq", 0, 95.0, 30000, 80000)],
                   data={**DATA, "path": "/d/arm.npz", "sha256": "b" * 64, "eval_set": "d" * 64})
    assert compare_models([a, other])["comparable"]["ranked"] is False


def test_a_failed_model_is_named_and_the_others_compared():
    a = member("a", [row("ptq", 0, 90.0, 36000, 90000)])
    failed = ({"name": "b", "folder": "b", "run_dir": "/out/b", "status": "failed",
               "error": {"exit_code": 6, "message": "vela failed", "hint": None}}, None)
    d = compare_models([a, failed])
    assert {r["model"] for r in d["rows"]} == {"a"} and d["overall"][T]["model"] == "a"
    assert "model b failed (exit 6): vela failed; its rows are missing" in d["notes"]
    for fmt in ("table", "markdown", "html"):
        assert "failed (exit 6): vela failed" in render(d, fmt), fmt


def test_every_format_shows_the_same_rows():
    a = member("a", [row("ptq", 0, 90.0, 36000, 90000), row("pruned", 2, 88.5, 27000, 89000)])
    b = member("b", [row("ptq", 0, 92.0, 36000, 90000)])
    d = compare_models([a, b], run_dir="/out")
    lines = list(csv.DictReader(render(d, "csv").splitlines()))
    assert [(r["model"], r["leaf"]) for r in lines] == [(r["model"], r["leaf"]) for r in d["rows"]]
    assert [float(r["compiled_model_bytes"]) for r in lines] == [r["values"]["compiled_model_bytes"]["value"]
                                                                 for r in d["rows"]]
    assert json.loads(render(d, "json"))["overall"][T]["leaf"] == "ptq"
    md = render(d, "markdown")
    assert "| a | pruned | ethos-u55-128 | 88.50% acc |" in md and "## Overall recommendation" in md
    html = render(d, "html")
    assert html.count("<tr class='recommended'>") == 1 and "b / ptq" in html
    assert "<h3>Accuracy vs flash, per target</h3><img" in html and "<h3>Flash vs total cycles, per target</h3><img" in html
    assert "b / ptq" in render(d, "table")


def test_regression_gate_runs_per_model(tmp_path):
    old = compare_models([member("a", [row("ptq", 0, 90.0, 36000, 90000)]),
                          member("b", [row("ptq", 0, 90.0, 36000, 90000)])])
    new = compare_models([member("a", [row("ptq", 0, 90.0, 36000, 90000)]),
                          member("b", [row("ptq", 0, 85.0, 36000, 90000)])])
    comp = compare_reports(json.loads(render(old, "json")), new, DEFAULT_TOLERANCES, against="old.json")
    assert comp["passed"] is False and [r["model"] for r in comp["regressions"]] == ["b"]
    assert comp["regressions"][0]["text"].startswith("b: ptq on ethos-u55-128: int8 accuracy 90.00% → 85.00%")
    assert compare_reports(json.loads(render(old, "json")), old, DEFAULT_TOLERANCES)["passed"] is True
    gone = compare_reports(old, compare_models([member("a", [row("ptq", 0, 90.0, 36000, 90000)])]), DEFAULT_TOLERANCES)
    assert [r["text"] for r in gone["regressions"]] == ["model b: in the reference but missing now"]
    with pytest.raises(UsageError, match="report of one run"):
        compare_reports(doc([row("ptq", 0, 90.0, 36000, 90000)]), new, DEFAULT_TOLERANCES)
    (tmp_path / "old.json").write_text(render(old, "json"))
    assert load_sweep_report_json(tmp_path / "old.json")["schema"] == "edgedeploy.sweep_report"
    (tmp_path / "bad.json").write_text("{")
    with pytest.raises(InvalidInputError, match="not valid JSON"):
        load_sweep_report_json(tmp_path / "bad.json")


@pytest.mark.parametrize("models", [[{"name": "../x", "folder": "../x"}], [{"name": "a", "folder": "b"}], "a"])
def test_a_sweep_record_naming_folders_outside_is_refused(tmp_path, models):
    (tmp_path / "sweep.json").write_text(json.dumps({"schema": "edgedeploy.sweep", "schema_version": 1,
                                                     "models": models}))
    with pytest.raises(InvalidInputError, match="not a list of named run folders"):
        load_sweep_record(tmp_path)
