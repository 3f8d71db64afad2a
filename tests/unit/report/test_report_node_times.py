"""Each optimize node's time by step, read from its record in the manifest and shown in every report format."""

from __future__ import annotations

import json
import shutil

import pytest

from helpers import RECORDED_RUN

from edgedeploy.core.manifest import Manifest, StageRecord
from edgedeploy.report import build_report
from edgedeploy.report.node_times import time_rows
from edgedeploy.report.render import render


def _fact(seconds):
    return {"value": seconds, "unit": "s", "mode": "measured"}


TIMES = {"steps": {"sensitivity": {"wall": _fact(12.5), "processor": _fact(20.0), "calls": 1},
                   "search": {"wall": _fact(1.25), "processor": _fact(1.0), "calls": 1},
                   "search/candidate_vela": {"wall": _fact(50.0), "processor": _fact(0.5), "calls": 3},
                   "fine_tune": {"wall": _fact(30.0), "processor": _fact(45.0), "calls": 1}},
         "other": {"wall": _fact(6.25), "processor": _fact(4.0)},
         "total": {"wall": _fact(100.0), "processor": _fact(70.5)}}


def _run_with(tmp_path, times):
    run = tmp_path / "run"
    shutil.copytree(RECORDED_RUN, run)
    manifest = Manifest.load(run)
    manifest.record(StageRecord("optimize/thinned", "optimize", "ok", variant="thinned",
                                details={"time_by_step": times}, seconds=101.0))
    manifest.record(StageRecord("optimize/ptq", "optimize", "ok", variant="ptq"))  # no steps recorded: no rows
    return run


@pytest.mark.parametrize("fmt", ["markdown", "table", "html"])
def test_a_nodes_steps_are_shown_with_their_share_of_its_time(tmp_path, fmt):
    doc = build_report(_run_with(tmp_path, TIMES))
    assert doc["node_times"] == {"thinned": TIMES}
    assert json.loads(render(doc, "json"))["node_times"] == {"thinned": TIMES}
    text = render(doc, fmt)
    assert "Time by step of each node" in text
    assert [row[:2] for row in time_rows(doc)] == [["thinned", s] for s in (*TIMES["steps"], "other", "total")]
    cells = {"markdown": "| thinned | search/candidate_vela | 50.00 | 0.50 | 3 | 50.0 |",
             "html": "<td class='key'>search/candidate_vela</td><td class='num'>50.00</td><td class='num'>0.50</td>"
                     "<td class='num'>3</td><td class='num'>50.0</td>"}
    if fmt in cells:
        assert cells[fmt] in text
    for step in ("sensitivity", "search", "fine_tune", "other", "total"):
        assert step in text
    assert "12.50" in text and "100.00" in text and "70.50" in text


def test_a_damaged_time_record_shows_as_not_available(tmp_path):
    damaged = {"steps": {"sensitivity": {"wall": "soon", "processor": None}, "search": [1, 2]},
               "total": {"wall": _fact(10.0)}}
    doc = build_report(_run_with(tmp_path, damaged))
    text = render(doc, "markdown")
    assert "| thinned | sensitivity | n/a | n/a |" in text and "| thinned | other | n/a | n/a |" in text
    assert "| thinned | total | 10.00 | n/a |" in text
