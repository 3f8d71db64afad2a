"""edgedeploy.report.judge, the one judge of the report, the walk and the sweep: dominance and the Pareto front,
the shortfall of a check, the walk's pick across targets, the sweep's overall pick, and that all three agree
where their questions are the same (one model, one target, one leaf per level)."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings, strategies as st

from helpers import examples

from edgedeploy.report.judge import (
    closest_misses, describe_miss, dominates, judge_leaves, least_optimized, overall, pareto_front, pick, quality,
    quality_across_models, recommend, shortfall, shortfalls, undominated,
)
from edgedeploy.report.limits import Requirements

POINTS = st.lists(st.tuples(*[st.integers(0, 4)] * 3), min_size=1, max_size=8)
# one tree leaf per level, least optimized first
ONE_PER_LEVEL = ["ptq", "qat", "pruned", "pqat", "pcqat", "thinned_pcqat"]


def cell(value, unit=""):
    return {"value": value, "unit": unit, "mode": "estimated"}


def made(leaf, level, acc, flash, cycles, **extra):
    return {"leaf": leaf, "level": level, "target": "t", "requirements": {}, "meets_requirements": None,
            "recommended": False, "values": {"int8_accuracy_pct": cell(acc, "%"), "compiled_model_bytes": cell(flash, "B"),
                                             "total_cycles": cell(cycles)}, **extra}


@given(POINTS)
def test_the_front_is_exactly_the_points_nothing_dominates(points):
    named = {f"p{i}": p for i, p in enumerate(points)}
    front = pareto_front(named)
    for name, p in named.items():
        beaten = any(dominates(q, p) for other, q in named.items() if other != name)
        assert (name in front) is not beaten
    # every point off the front is dominated by a point on it (dominance is transitive, the set finite)
    for name in set(named) - front:
        assert any(dominates(named[f], named[name]) for f in front)
    assert undominated(list(named), named.__getitem__) == [n for n in named if n in front]


@given(POINTS)
def test_the_least_optimized_choice_is_on_the_front_and_names_only_leaves_ranked_before_it(points):
    items = list(range(len(points)))
    best, passed = least_optimized(items, points.__getitem__, lambda i: i)
    assert not any(dominates(points[j], points[best]) for j in items if j != best)
    assert all(i < best for i, _ in passed)  # only the leaves the order would have taken first
    for i, by in passed:
        assert dominates(points[by], points[i])
        assert by == min(j for j in items if j != i and dominates(points[j], points[i]))
    # every dominated item ranked before the chosen one is named
    assert {i for i, _ in passed} == {i for i in items if i < best
                                     and any(dominates(points[j], points[i]) for j in items if j != i)}


def test_shortfall_is_relative_to_the_limit_and_unjudged_is_infinitely_far():
    assert shortfall({"met": True, "excess": 5, "limit": 10}) == 0.0
    assert shortfall({"met": False, "excess": 5, "limit": 10}) == 0.5
    assert shortfall({"met": False, "excess": 5, "limit": None}) == 5  # a board that does not fit: its bytes over
    assert shortfall({"met": None, "why": "cannot be judged"}) == math.inf
    assert shortfall({"met": False}) == math.inf  # missed, but not by how much


def test_a_miss_reads_the_same_for_one_target_and_across_targets():
    check = {"met": False, "limit": 1000, "value": 1250, "excess": 250, "excess_pct": 25.0, "unit": "B"}
    assert describe_miss("max_flash", check, "ptq") == \
        "max_flash 1,000 B: closest is ptq with 1,250 B, over by 250 B (25.0%)"
    assert describe_miss("max_flash", check, "ptq", "u55") == \
        "max_flash 1,000 B: closest is ptq on u55 with 1,250 B, over by 250 B (25.0%)"
    unjudged = {"met": None, "why": "cannot be judged: no accuracy"}
    assert describe_miss("max_accuracy_drop", unjudged, "ptq") == "max_accuracy_drop: ptq cannot be judged: no accuracy"
    assert describe_miss("max_accuracy_drop", unjudged, "ptq", "u55") == \
        "max_accuracy_drop: ptq on u55: cannot be judged: no accuracy"


def test_the_closest_miss_breaks_ties_by_the_order_given():
    checks = {"a": {"met": False, "excess": 10, "limit": 100}, "b": {"met": False, "excess": 10, "limit": 100},
              "c": {"met": False, "excess": 30, "limit": 100}}
    (only,) = closest_misses(["max_flash"], ["c", "b", "a"], lambda c, n: checks[c], {"a": 0, "b": 1, "c": 2}.get)
    assert only[1] == "a"
    assert closest_misses(["max_flash"], ["b", "a"], lambda c, n: checks[c], {"a": 1, "b": 0}.get)[0][1] == "b"
    checks["c"] = {"met": True}  # some candidate meets it: not a miss
    assert closest_misses(["max_flash"], ["a", "b", "c"], lambda c, n: checks[c], str) == []


def test_a_walk_where_no_leaf_fits_its_board_names_the_closest_leaf():
    def board_row(leaf, over):
        fit = {"met": False, "why": f"SRAM {over} B over the board's", "excess": over, "unit": "B", "limit": None,
               "value": None, "label": "fits u55"}
        return {"leaf": leaf, "target": "board", "requirements": {"fits_board": fit}, "meets_requirements": False}

    verdicts = judge_leaves({"rows": [board_row("ptq", 4000), board_row("pruned", 1000)]}, ["ptq", "pruned"], ["board"])
    (u,) = shortfalls(verdicts)
    assert (u["requirement"], u["closest_leaf"], u["target"], u["excess"]) == ("fits_board", "pruned", "board", 1000)
    assert u["text"] == "fits_board: pruned on board does not fit (SRAM 1000 B over the board's)"


def test_the_walk_passes_over_a_leaf_only_when_beaten_on_every_target():
    def two(leaf, a, b):
        return [made(leaf, None, *a, target="a"), made(leaf, None, *b, target="b")]

    # pruned beats ptq on target a but is bigger on target b: a trade-off, ptq (least optimized) stays
    doc = {"rows": [*two("ptq", (90, 3000, 100), (90, 3000, 100)), *two("pruned", (91, 2000, 90), (91, 4000, 90))]}
    assert pick(doc, ["ptq", "pruned"], ["a", "b"]) == ("ptq", {})
    assert pick(doc, ["ptq", "pruned"], ["a"]) == ("pruned", {"ptq": "pruned"})


def test_quality_across_models_signs_the_metric_by_its_direction():
    row = {"values": {"int8_metric": cell(0.02) | {"higher_is_better": False}, "int8_metric_drop": cell(0.005)}}
    assert quality(row) == -0.005  # within a run: minus the drop against ptq
    assert quality_across_models(row) == -0.02  # across models: the MSE itself, lower better
    row["values"]["int8_metric"]["higher_is_better"] = True
    assert quality_across_models(row) == 0.02


def test_models_judged_apart_get_no_overall_pick():
    rows = [made("ptq", 0, 90.0, 30000, 100, model="a"), made("ptq", 0, 91.0, 20000, 90, model="b")]
    models = [{"name": "a", "recommendations": {"t": {"leaf": "ptq"}}, "measure": {"name": "accuracy"}},
              {"name": "b", "recommendations": {"t": {"leaf": "ptq"}}, "measure": {"name": "accuracy"}}]
    out = overall(rows, "t", False, "different data", models)
    assert out["model"] is None and "different data; each model's own: a: ptq; b: ptq" in out["message"]
    out = overall(rows, "t", True, "", models)
    assert (out["model"], out["leaf"], out["front"]) == ("b", "ptq", ["b/ptq"])  # b beats a on every axis
    assert rows[1]["overall"] and rows[0]["front"] is False


@settings(max_examples=examples(60), deadline=None)
@given(st.lists(st.tuples(st.integers(80, 92), st.integers(1, 6), st.integers(1, 6)), min_size=1,
                max_size=len(ONE_PER_LEVEL)))
def test_report_walk_and_sweep_agree_on_one_model_and_one_target(values):
    def rows():
        return [made(leaf, level, float(acc), flash * 1000, cycles * 100, model="m")
                for level, (leaf, (acc, flash, cycles)) in enumerate(zip(ONE_PER_LEVEL, values))]

    leaves = ONE_PER_LEVEL[:len(values)]
    by_report = recommend(rows(), "t", Requirements())["leaf"]
    by_walk, _ = pick({"rows": rows()}, leaves, ["t"])
    models = [{"name": "m", "recommendations": None, "measure": {"name": "accuracy"}}]
    by_sweep = overall(rows(), "t", True, "", models)["leaf"]
    assert by_report == by_walk == by_sweep
    # the least-optimized leaf that no other leaf beats on accuracy, flash and cycles
    points = [(-a, f, c) for a, f, c in values]
    assert by_report == leaves[next(i for i, p in enumerate(points) if not any(dominates(q, p) for q in points))]


@pytest.mark.parametrize("table", [None, {}, {"max_flash": "32KiB", "max_npu_cycles": 90000}])
def test_requirements_from_an_already_read_table_match_the_project_file(tmp_path, table):
    from edgedeploy.report.limits import requirements_from_project, requirements_from_table

    path = tmp_path / "edgedeploy.toml"
    body = "" if table is None else "[requirements]\n" + "".join(
        f"{k} = {v!r}\n".replace("'", '"') for k, v in table.items())
    path.write_text('model = "m.h5"\n' + body)
    assert requirements_from_table(table, path) == requirements_from_project(path)
