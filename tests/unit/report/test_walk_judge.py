"""The walk's judgments on report rows (no training, no Vela): per-target verdicts, the pick, the shortfall."""

from __future__ import annotations

import pytest

from edgedeploy.errors import UsageError
from edgedeploy.pipeline.walk import levels_of
from edgedeploy.report.judge import judge_leaves, meets_everywhere, pick, shortfalls
from edgedeploy.report.render.walk_text import walk_lines


def row(leaf, target, acc, flash, cycles, flash_limit=None):
    checks = {}
    if flash_limit is not None:
        met = flash <= flash_limit
        checks["max_flash"] = {"label": "flash", "limit": flash_limit, "value": flash, "unit": "B", "met": met,
                               **({} if met else {"excess": flash - flash_limit,
                                                  "excess_pct": 100 * (flash - flash_limit) / flash_limit})}
    return {"leaf": leaf, "target": target,
            "values": {"int8_accuracy_pct": {"value": acc}, "compiled_model_bytes": {"value": flash},
                       "total_cycles": {"value": cycles}},
            "requirements": checks, "meets_requirements": all(c["met"] for c in checks.values()) if checks else None}


def test_levels_follow_the_tree_and_palette_leaves_take_their_base_level():
    assert levels_of(["pcqat_palette", "ptq", "pqat", "pruned", "qat"]) == {
        0: ["ptq"], 1: ["qat"], 2: ["pruned"], 3: ["pqat"], 4: ["pcqat_palette"]}
    with pytest.raises(UsageError):
        levels_of(["ptq", "mine"])


def test_a_leaf_must_meet_on_every_target():
    doc = {"rows": [row("ptq", "a", 90, 36000, 100, 30000), row("ptq", "b", 90, 29000, 100, 30000),
                    row("pruned", "a", 89, 28000, 99, 30000), row("pruned", "b", 89, 28500, 99, 30000)]}
    v = judge_leaves(doc, ["ptq", "pruned"], ["a", "b"])
    assert not meets_everywhere(v["ptq"]) and meets_everywhere(v["pruned"])
    assert v["ptq"]["a"]["requirements"]["max_flash"]["excess"] == 6000
    # a target the leaf was not compiled for is a miss
    assert judge_leaves(doc, ["ptq"], ["c"])["ptq"]["c"]["meets"] is False
    lines = walk_lines({"levels": [{"level": 0, "nodes_trained": ["baseline"], "verdicts": {"ptq": v["ptq"]},
                                    "seconds": 3}], "stopped": "exhausted", "seconds": 3, "message": "m"})
    assert lines[0] == "level 0: trained baseline; ptq (a: misses max_flash; b: meets) [3 s]"


def test_pick_skips_a_meeting_leaf_that_another_beats_on_every_target():
    doc = {"rows": [row("pruned", "a", 85, 28000, 99), row("pruned", "b", 85, 28000, 99),
                    row("pqat", "a", 88, 27000, 98), row("pqat", "b", 88, 27000, 98),
                    row("ptq", "a", 90, 36000, 100), row("ptq", "b", 90, 36000, 100)]}
    best, passed = pick(doc, ["ptq", "pruned", "pqat"], ["a", "b"])
    assert best == "ptq" and passed == {}
    best, passed = pick(doc, ["pruned", "pqat"], ["a", "b"])
    assert best == "pqat" and passed == {"pruned": "pqat"}


def test_shortfall_names_the_closest_leaf_on_its_worst_target():
    doc = {"rows": [row("ptq", "a", 90, 36000, 100, 20000), row("ptq", "b", 90, 37000, 100, 20000),
                    row("pruned", "a", 89, 28000, 99, 20000), row("pruned", "b", 89, 30000, 99, 20000)]}
    (u,) = shortfalls(judge_leaves(doc, ["ptq", "pruned"], ["a", "b"]))
    assert (u["requirement"], u["closest_leaf"], u["target"], u["excess"]) == ("max_flash", "pruned", "b", 10000)
    assert "over by 10,000 B (50.0%)" in u["text"]
    # a requirement some leaf meets everywhere is not a shortfall
    doc["rows"][2:] = [row("pruned", "a", 89, 18000, 99, 20000), row("pruned", "b", 89, 19000, 99, 20000)]
    assert shortfalls(judge_leaves(doc, ["ptq", "pruned"], ["a", "b"])) == []


def test_a_project_file_may_limit_npu_cycles(tmp_path):
    from edgedeploy.errors import UsageError as Usage
    from edgedeploy.pipeline.project import load_project
    from edgedeploy.report import requirements_from_project

    path = tmp_path / "edgedeploy.toml"
    path.write_text('model = "m.h5"\ndata = "d.npz"\n[requirements]\nmax_npu_cycles = 90000\nmax_flash = "34KiB"\n')
    assert load_project(path).requirements["max_npu_cycles"] == 90000
    req = requirements_from_project(path)
    assert (req.max_npu_cycles, req.max_flash) == (90000, 34816)
    path.write_text('model = "m.h5"\ndata = "d.npz"\n[requirements]\nmax_npu_cycles = -1\n')
    with pytest.raises(Usage):
        load_project(path)


def test_requirements_from_command_line_options():
    from edgedeploy.report.judge import requirements_from_options

    req = requirements_from_options(max_accuracy_drop=1.0, max_flash="32KiB", max_npu_cycles=90000,
                                    max_metric_drop=0.2)
    assert req.given() == {"max_accuracy_drop": 1.0, "max_metric_drop": 0.2, "max_flash": 32768,
                           "max_npu_cycles": 90000}
    assert req.sources == ("command line",) and requirements_from_options().sources == ()
    with pytest.raises(UsageError, match="--max-npu-cycles"):
        requirements_from_options(max_npu_cycles=-1)


def test_a_leaf_costing_more_than_ptq_is_named_in_the_walks_verdicts():
    """The flag the report sets on a row (edgedeploy.report.judge.over_reference) reaches the walk's verdict and
    its lines; a leaf without it reads as before."""
    rows = [row("ptq", "a", 90, 36000, 100), row("qat", "a", 91, 36000, 112)]
    rows[1]["over_reference"] = {"text": "qat costs more than ptq on a: NPU cycles 112, 1.120x ptq's 100"}
    v = judge_leaves({"rows": rows}, ["ptq", "qat"], ["a"])
    assert "over_reference" not in v["ptq"]["a"] and v["qat"]["a"]["over_reference"].startswith("qat costs more")
    lines = walk_lines({"levels": [{"level": 1, "nodes_trained": ["qat"], "verdicts": v, "seconds": 2}],
                        "stopped": "met", "seconds": 2, "message": "m"})
    assert lines[0] == "level 1: trained qat; ptq (a: no requirements); qat (a: no requirements, costs more than ptq) [2 s]"
    for leaf in v:
        v[leaf]["a"]["meets"] = True
    lines = walk_lines({"levels": [{"level": 1, "nodes_trained": ["qat"], "verdicts": v, "seconds": 2}],
                        "stopped": "met", "seconds": 2, "message": "m"})
    assert lines[0] == "level 1: trained qat; ptq (a: meets); qat (a: meets, costs more than ptq) [2 s]"
