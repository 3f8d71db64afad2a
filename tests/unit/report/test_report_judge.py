"""edgedeploy.report.judge: Pareto front, requirements, recommendation.

tests/data/report/run_u55_u85 is a run folder written by `edgedeploy compile` with Vela 5.2.0 (see its
SOURCE.md): the MLPerf DS-CNN and ResNet-8 int8 models on corstone-300-u55-128 and ethos-u85-256.
"""

from __future__ import annotations

from pathlib import Path

from helpers import RECORDED_RUN as RUN, report_row as row

from edgedeploy.report import Requirements, build_report, parse_size, pareto_front


def test_pareto_front():
    pts = {"a": (1, 5), "b": (2, 2), "c": (5, 1), "d": (3, 3), "e": (2, 2)}
    assert pareto_front(pts) == {"a", "b", "c", "e"}  # d is dominated by b; equal points both stay
    assert pareto_front({"x": (1, 1, 1)}) == {"x"}


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


def _converted_only(run: Path) -> Path:
    """A run folder as `edgedeploy optimize` leaves it: three leaves converted with their int8 accuracy, none compiled."""
    from edgedeploy.core.manifest import Manifest, Metric, StageRecord

    run.mkdir()
    m = Manifest(run)
    for leaf, acc in (("ptq", 90.0), ("qat", 89.6), ("pcqat", 88.5)):
        rec = StageRecord(id=f"convert/{leaf}", stage="convert", variant=leaf, status="ok")
        rec.metrics = {"float_accuracy": Metric(90.5, "%", "measured"), "int8_accuracy": Metric(acc, "%", "measured")}
        m.record(rec)
    m.save()
    return run


def test_leaves_compiled_for_no_target_are_judged_on_what_needs_no_target(tmp_path):
    from edgedeploy.report.render import render_markdown, render_table

    doc = build_report(_converted_only(tmp_path / "run"), Requirements(max_accuracy_drop=1.0, max_flash=100_000))
    rows = {r["leaf"]: r for r in doc["rows"]}
    assert all(r["target"] is None for r in rows.values())
    assert rows["qat"]["requirements"]["max_accuracy_drop"]["met"] is True
    assert rows["pcqat"]["requirements"]["max_accuracy_drop"]["met"] is False
    assert abs(rows["pcqat"]["requirements"]["max_accuracy_drop"]["value"] - 1.5) < 1e-9
    assert rows["qat"]["requirements"]["max_flash"]["met"] is None
    assert rows["qat"]["requirements"]["max_flash"]["why"] == "not compiled for a target"
    # a missed drop is a miss; otherwise the leaf waits for a compile to be judged on flash
    assert rows["pcqat"]["meets_requirements"] is False and rows["qat"]["meets_requirements"] is None
    text = render_table(doc)
    assert "Requirements of pcqat (no: max_accuracy_drop): max_accuracy_drop missed (1.50 pts" in text
    assert "Requirements of qat (not compiled; meets max_accuracy_drop)" in text
    assert "| no: max_accuracy_drop |" in render_markdown(doc)
    # only the drop asked for: it is all there is to judge
    alone = build_report(tmp_path / "run", Requirements(max_accuracy_drop=1.0))
    assert {r["leaf"]: r["meets_requirements"] for r in alone["rows"]} == {"ptq": True, "qat": True, "pcqat": False}
