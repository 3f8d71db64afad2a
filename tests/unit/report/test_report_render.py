"""edgedeploy.report.render: every format from the same document.

tests/data/report/run_u55_u85 is a run folder written by `edgedeploy compile` with Vela 5.2.0 (see its
SOURCE.md): the MLPerf DS-CNN and ResNet-8 int8 models on corstone-300-u55-128 and ethos-u85-256.
"""

from __future__ import annotations

import csv
import json

import pytest

from helpers import RECORDED_RUN as RUN

from edgedeploy.errors import InvalidInputError
from edgedeploy.report import build_report, load_report_json
from edgedeploy.report.render import render, render_csv, render_html, render_markdown


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


@pytest.fixture(scope="module")
def html_page(tmp_path_factory):
    """A copy of the recorded run, the report document with its plot inputs built from it, and its HTML page (each
    page draws every plot: rendered once for the tests that read it)."""
    import shutil

    run = tmp_path_factory.mktemp("render") / "run"
    shutil.copytree(RUN, run)
    page_doc = build_report(run, html=True)
    return run, page_doc, render_html(page_doc)


def test_html_is_self_contained_and_states_skipped_plots(html_page):
    _, _, page = html_page
    assert page.count("<img ") >= 3  # flash vs cycles and the per-layer cycles of each recommendation
    assert all(part.startswith("data:image/png;base64,") for part in page.split("src='")[1:])
    assert "http://" not in page and "https://" not in page
    assert "Accuracy vs NPU-encoded weights: no leaf has a measured accuracy" in page
    assert "Weight density through the stages: no optimize/baseline record" in page


def test_html_renders_from_the_document_alone(html_page):
    """Rendering reads nothing: the same page comes from the document after the run folder is gone."""
    import shutil

    run, page_doc, before = html_page
    assert set(page_doc["html"]["layer_cycles"]) == set(page_doc["recommendations"])
    shutil.rmtree(run)
    assert render_html(page_doc) == before
    assert "html" not in json.loads(render(page_doc, "json"))


def test_html_without_plot_inputs_says_so(doc):
    page = render_html(doc)
    assert "<img " in page  # the plots drawn from the rows
    assert "the report document carries no plot inputs" in page


def test_requirements_line_states_each_limit_in_its_own_unit():
    from edgedeploy.report.render.cells import _req_text

    doc = {"requirements": {"max_metric_drop": 0.01, "max_npu_cycles": 50000, "max_accuracy_drop": 1.0,
                            "sources": ["command line"]},
           "rows": [{"leaf": "ptq", "values": {"int8_metric": {"value": 0.18, "metric": "mse"}}}]}
    text = _req_text(doc)
    assert "max_metric_drop = 0.01 (int8 MSE worse than the ptq leaf's)" in text  # the metric named, as in its columns
    assert "max_npu_cycles = 50,000 cycles" in text
    assert "max_accuracy_drop = 1 pts (int8 accuracy below the ptq leaf)" in text


def test_the_compile_table_writes_bytes_and_cycles_as_the_report_does(doc):
    """One formatter per kind: the compile table's SRAM, flash and cycles cells are the report table's text."""
    from edgedeploy.core.manifest import Manifest
    from edgedeploy.report.render.cells import fmt_value
    from edgedeploy.report.render.tables import COMPILE_COLUMNS, compile_rows

    m = Manifest.load(RUN)
    compiled = [r for r in m.records.values() if r.stage == "compile"]
    rows = compile_rows(m, compiled, set())
    headers = dict(COMPILE_COLUMNS)
    assert (headers["sram"], headers["flash"]) == ("SRAM (B)", "Vela flash (B)")
    by_pair = {(r["leaf"], r["target"]): r["values"] for r in doc["rows"]}
    assert rows and all("KiB" not in r["sram"] and "MiB" not in r["flash"] for r in rows)
    for row, rec in zip(rows, compiled):
        values = by_pair[(rec.variant, rec.target)]
        assert row["sram"] == fmt_value(values["sram_bytes"]["value"], "bytes") == f"{rec.metric('sram_bytes'):,}"
        assert row["total_cycles"] == fmt_value(values["total_cycles"]["value"], "count")
