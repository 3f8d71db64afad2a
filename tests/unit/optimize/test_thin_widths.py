"""The cycle staircase and width search of thinned leaves, and the channel preservation check (pure)."""

from __future__ import annotations

import itertools

import pytest

from edgedeploy.optimize.techniques.thin_widths import (N, Staircase, candidate_widths, choose, colour_groups, learn,
                                          orthogonal_rows, shortlist)
from edgedeploy.core.weight_stats import WeightStats
from edgedeploy.optimize.preserve_channels import check_channels, int8_channels


def test_candidate_widths_are_npu_steps():
    assert candidate_widths(64) == [64, 56, 48, 40, 32]  # the OFM block depth (8) where it gives five widths
    assert candidate_widths(32) == [32, 28, 24, 20, 16]  # else a finer step, each width distinct
    assert candidate_widths(16) == [16, 14, 12, 10, 8]
    assert candidate_widths(6) == [6, 5, 4, 3, 3]
    # 2:4 sparsity: every width a multiple of 4 (a 14-wide input leaves Ethos-U85's readers dense)
    assert candidate_widths(16, 4) == [16, 12, 12, 8, 8]
    assert candidate_widths(32, 4) == [32, 28, 24, 20, 16]
    assert all(w % 4 == 0 for n in (16, 24, 32, 40, 64) for w in candidate_widths(n, 4))


@pytest.mark.parametrize("count, size, multiple, want", [
    (3, 64, 1, [64, 48, 32]), (3, 16, 1, [16, 12, 8]), (3, 6, 1, [6, 4, 2]), (3, 16, 4, [16, 12, 8]),
    (2, 64, 1, [64, 32]), (2, 12, 4, [12, 8]), (2, 1, 1, [1, 1]),
])
def test_coarser_grids_take_fewer_widths_of_the_same_steps(count, size, multiple, want):
    """``thin_candidates = 3`` or ``2``: 1, 3/4, 1/2 or 1, 1/2 of the width, on the NPU's steps as the five are."""
    assert candidate_widths(size, multiple, count) == want


@pytest.mark.parametrize("n, colours", [(N, 1), (N, 2), (N, 3), (N, N + 1), (3, 2), (3, 4), (2, 3)])
def test_orthogonal_rows_cover_every_pair(n, colours):
    rows = orthogonal_rows(colours, n)
    assert len(rows) == n * n and rows[0] == (0,) * colours
    for a, b in itertools.combinations(range(colours), 2):
        assert {(r[a], r[b]) for r in rows} == set(itertools.product(range(n), repeat=2))
    with pytest.raises(ValueError):
        orthogonal_rows(n + 2, n)


def test_colouring_separates_what_an_operator_reads_and_writes():
    edges = [("a", "b"), ("b", "c"), ("a", "c"), ("c", "c")]
    colours = colour_groups(["a", "b", "c", "d"], edges)
    assert all(colours[x] != colours[y] for x, y in edges if x != y)
    assert max(colours.values()) == 2


def _chain_stair():
    # two groups a -> b; operator 0 writes a, operator 1 reads a and writes b: cycles = width products
    widths = {"a": [64, 56, 48, 40, 32], "b": [64, 56, 48, 40, 32]}
    stair = Staircase(["a", "b"], widths, {"a": 0, "b": 1}, [(None, "a"), ("a", "b")])
    assignments = [{"a": r[0], "b": r[1]} for r in orthogonal_rows(2)]
    runs = []
    for v in assignments:
        wa, wb = widths["a"][v["a"]], widths["b"][v["b"]]
        rows = [100.0 * wa, 2.0 * wa * wb]
        runs.append({"npu_cycles": sum(rows) + 50, "rows": rows})
    learn(assignments, {"u55": runs}, stair)
    return stair


def test_learned_staircase_predicts_every_grid_point():
    stair = _chain_stair()
    assert stair.full["u55"] == 100 * 64 + 2 * 64 * 64 + 50
    assert stair.rest["u55"] == pytest.approx(50)
    assert stair.predict("u55", {"a": 4, "b": 2}) == pytest.approx(100 * 32 + 2 * 32 * 48 + 50)


def test_choose_meets_the_budget_where_the_loss_is_cheapest():
    stair = _chain_stair()
    budget = 0.75 * stair.full["u55"]
    cheap_b = {"a": [0, 1, 2, 3, 4], "b": [0, 0.01, 0.02, 0.03, 0.04]}
    values, _ = choose(stair, {"u55": budget}, cheap_b)
    assert stair.predict("u55", values) <= budget
    assert values["b"] > values["a"]  # b costs less accuracy per cycle bought
    met = [(cheap_b["a"][x] + cheap_b["b"][y]) for x in range(N) for y in range(N)
           if stair.predict("u55", {"a": x, "b": y}) <= budget]
    assert cheap_b["a"][values["a"]] + cheap_b["b"][values["b"]] == min(met)
    values, _ = choose(stair, {"u55": 10.0}, cheap_b)  # out of reach: the fewest cycles, everything narrowest
    assert values == {"a": N - 1, "b": N - 1}
    values, _ = choose(stair, {"u55": budget}, cheap_b, fixed={"a": 0})
    assert values["a"] == 0


@pytest.mark.parametrize("exhaustive", [True, False])
def test_a_three_width_grid_searches_only_its_own_widths(monkeypatch, exhaustive):
    """Groups of three candidate widths: every choice and every shortlisted one is among them, and the choice
    is the least expected loss within the budget."""
    from edgedeploy.optimize.techniques import thin_widths as thin_npu

    if not exhaustive:
        monkeypatch.setattr(thin_npu, "EXHAUSTIVE", 1)
    widths = {"a": [64, 48, 32], "b": [64, 48, 32]}
    stair = Staircase(["a", "b"], widths, {"a": 0, "b": 1}, [(None, "a"), ("a", "b")])
    assignments = [{"a": r[0], "b": r[1]} for r in orthogonal_rows(2, 3)]
    runs = [{"npu_cycles": 100.0 * widths["a"][v["a"]] + 2.0 * widths["a"][v["a"]] * widths["b"][v["b"]],
             "rows": [100.0 * widths["a"][v["a"]], 2.0 * widths["a"][v["a"]] * widths["b"][v["b"]]]}
            for v in assignments]
    learn(assignments, {"u55": runs}, stair)
    budget = {"u55": 0.75 * stair.full["u55"]}
    drops = {"a": [0, 1, 2], "b": [0, 0.01, 0.02]}
    values, _ = choose(stair, budget, drops)
    met = [drops["a"][x] + drops["b"][y] for x in range(3) for y in range(3)
           if stair.predict("u55", {"a": x, "b": y}) <= budget["u55"]]
    assert stair.predict("u55", values) <= budget["u55"] and drops["a"][values["a"]] + drops["b"][values["b"]] == min(met)
    options = shortlist(stair, budget, drops, slack=0.5)
    assert options[0] == values and 1 < len(options) <= 9
    assert all(0 <= o[g] < 3 for o in options for g in o)
    assert choose(stair, {"u55": 1.0}, drops)[0] == {"a": 2, "b": 2}  # out of reach: both narrowest


def test_a_coarser_grid_is_part_of_the_thinned_nodes_cache_key_the_default_leaves_it_as_it_was():
    from edgedeploy.config.recipe import load_recipe

    assert load_recipe().thin_candidates == 5 and "thin_candidates" not in load_recipe().node_params("thinned")
    coarse = load_recipe(overrides={"thin_candidates": 3})
    assert coarse.node_params("thinned")["thin_candidates"] == 3 and "thin_candidates" not in coarse.node_params("qat")


def test_greedy_search_of_many_groups_meets_the_budget(monkeypatch):
    from edgedeploy.optimize.techniques import thin_widths as thin_npu

    monkeypatch.setattr(thin_npu, "EXHAUSTIVE", 1)
    stair = _chain_stair()
    budget = 0.75 * stair.full["u55"]
    values, steps = choose(stair, {"u55": budget}, {"a": [0, 1, 2, 3, 4], "b": [0, 0.01, 0.02, 0.03, 0.04]})
    assert stair.predict("u55", values) <= budget and steps
    for g in values:  # nothing narrower than the budget needs
        if values[g]:
            assert stair.predict("u55", {**values, g: values[g] - 1}) > budget


@pytest.mark.parametrize("exhaustive", [True, False])
def test_shortlist_ranks_choices_near_the_budget_by_expected_loss(monkeypatch, exhaustive):
    from edgedeploy.optimize.techniques import thin_widths as thin_npu

    if not exhaustive:
        monkeypatch.setattr(thin_npu, "EXHAUSTIVE", 1)
    stair = _chain_stair()
    budget = 0.75 * stair.full["u55"]
    drops = {"a": [0, 0.1, 0.2, 0.3, 0.4], "b": [0, 0.01, 0.02, 0.03, 0.5]}
    options = shortlist(stair, {"u55": budget}, drops, count=5, slack=0.05)
    assert options[0] == choose(stair, {"u55": budget}, drops)[0]  # the prediction's own choice comes first
    assert 1 < len(options) <= 5 and len({tuple(o.values()) for o in options}) == len(options)
    losses = [drops["a"][o["a"]] + drops["b"][o["b"]] for o in options[1:]]
    assert losses == sorted(losses)
    assert all(stair.predict("u55", o) <= 1.05 * budget for o in options)
    # a choice over the budget by the prediction, within the slack, cheaper than the first: Vela may still take it
    assert any(stair.predict("u55", o) > budget and drops["a"][o["a"]] + drops["b"][o["b"]]
               < drops["a"][options[0]["a"]] + drops["b"][options[0]["b"]] for o in options)
    assert all(stair.predict("u55", o) <= budget for o in shortlist(stair, {"u55": budget}, drops, slack=0.0))


def test_channel_check_fails_on_a_changed_width():
    expected = {"conv": (8, 16), "dense": (64, 12)}
    assert not check_channels("thinned_pruned", "keras", expected, dict(expected)).failures
    verdict = check_channels("thinned_pruned", "keras", expected, {"conv": (8, 24), "dense": (64, 12)})
    assert verdict.failures == ["thinned_pruned (keras): layer conv: channels (in, out) (8, 24) != thinned (8, 16)"]
    assert check_channels("x", "int8", expected, {"conv": (8, 16)}).failures  # a kernel not found fails too


def test_int8_layouts_give_input_and_output_channels():
    found = [WeightStats("c", "Conv2D", (16, 3, 3, 8), 0, 1, 1, 16), WeightStats("d", "DepthwiseConv2D", (1, 3, 3, 16),
             0, 1, 1, 16), WeightStats("f", "Dense", (12, 64), 0, 1, 1, 12)]
    assert int8_channels(found) == {"c": (8, 16), "d": (None, 16), "f": (64, 12)}


def test_a_depthwise_kernel_with_a_depth_multiplier_is_checked_on_its_output_channels():
    """A depthwise kernel's int8 layout (1HWO) holds no input count: 16 inputs times multiplier 2 is 32 outputs."""
    found = int8_channels([WeightStats("dw", "DepthwiseConv2D", (1, 3, 3, 32), 0, 1, 1, 32)])
    assert not check_channels("thinned", "int8", {"dw": (16, 32)}, found).failures
    verdict = check_channels("thinned", "int8", {"dw": (16, 24)}, found)
    assert verdict.failures == ["thinned (int8): layer dw: channels (in, out) (None, 32) != thinned (16, 24)"]


def test_the_staircase_rows_add_up_to_the_npu_cycles_the_budget_holds():
    """Each operator row gives its share of the summary's NPU cycles (the per-layer CSV's NPU column), not its
    Op Cycles (the larger of NPU and memory cycles, which add up to the total cycles): recorded Vela 5.2 output
    of the MLPerf DS-CNN on Ethos-U55-128."""
    from pathlib import Path

    from edgedeploy.optimize.techniques.thin_vela import op_key_rows
    from edgedeploy.vela.outputs import parse_per_layer_csv, parse_summary_csv

    vela = Path(__file__).resolve().parents[2] / "data" / "vela"
    layers = parse_per_layer_csv((vela / "dscnn_u55_128_per-layer.csv").read_text(encoding="utf-8"))
    summary = parse_summary_csv((vela / "dscnn_u55_128_summary.csv").read_text(encoding="utf-8"))
    rows = op_key_rows(layers)
    assert sum(c for _, c in rows) == summary["cycles_npu"] == 88902
    assert sum(r["Op Cycles"] for r in layers) == summary["cycles_total"] == 89900
    assert len({key for key, _ in rows}) == len(rows)  # (every row keyed once)


def _three_group_stair():
    # a -> b -> c; each operator's cycles the product of the widths it reads and writes
    widths = {g: [64, 56, 48, 40, 32] for g in "abc"}
    stair = Staircase(list("abc"), widths, {"a": 0, "b": 1, "c": 2}, [(None, "a"), ("a", "b"), ("b", "c")])
    assignments = [{"a": r[0], "b": r[1], "c": r[2]} for r in orthogonal_rows(3)]
    runs = []
    for v in assignments:
        wa, wb, wc = (widths[g][v[g]] for g in "abc")
        rows = [100.0 * wa, 2.0 * wa * wb, 2.0 * wb * wc]
        runs.append({"npu_cycles": sum(rows), "rows": rows})
    learn(assignments, {"u55": runs}, stair)
    return stair


@pytest.mark.parametrize("exhaustive", [True, False])
def test_alternatives_give_every_group_another_width_within_the_budget(monkeypatch, exhaustive):
    from edgedeploy.optimize.techniques import thin_widths as thin_npu
    from edgedeploy.optimize.techniques.thin_widths import alternatives

    if not exhaustive:
        monkeypatch.setattr(thin_npu, "EXHAUSTIVE", 1)
    stair = _three_group_stair()
    budget = {"u55": 0.7 * stair.full["u55"]}
    # a is cheap to narrow one-shot, b and c dear: the search narrows a as far as it goes
    drops = {"a": [0, 0.01, 0.02, 0.03, 0.04], "b": [0, 0.2, 0.4, 0.6, 0.8], "c": [0, 0.25, 0.5, 0.75, 1.0]}
    first, _ = choose(stair, budget, drops)
    others = alternatives(stair, budget, drops, first, count=10)

    def loss(v):
        return sum(drops[g][v[g]] for g in v)

    assert others and first not in others
    assert all(stair.predict("u55", v) <= budget["u55"] for v in others)
    assert [loss(v) for v in others] == sorted(loss(v) for v in others)
    for g in "abc":  # each group at another width than the search's: the least loss that allows, among them
        moved = [v for v in itertools.product(range(N), repeat=3)
                 if v["abc".index(g)] != first[g] and stair.predict("u55", dict(zip("abc", v))) <= budget["u55"]]
        if moved:
            least = min(loss(dict(zip("abc", v))) for v in moved)
            assert any(v[g] != first[g] and loss(v) == pytest.approx(least) for v in others) or not exhaustive
    assert any(v["a"] != first["a"] for v in others)  # a narrowed less, the others more: fine-tuning may prefer it
    assert alternatives(stair, budget, drops, first, count=1) == others[:1]


def test_a_tried_choice_that_wins_takes_its_own_cycles_in_the_record():
    from edgedeploy.optimize.techniques.thin import _take

    widths = {"a": [64, 56, 48], "b": [32, 28, 24]}
    budget = {"u55": {"npu_cycles": 1000, "ptq_npu_cycles": 2000}, "u85": {"npu_cycles": 500, "ptq_npu_cycles": 800}}
    checks = [{"widths": {"a": 48, "b": 32}, "npu_cycles": {"u55": 990, "u85": 400}, "met": True},
              {"widths": {"a": 56, "b": 24}, "npu_cycles": {"u55": 900, "u85": 480}, "met": True}]
    npu = {"budget": budget, "checks": checks, "npu_cycles": checks[0]["npu_cycles"], "held_on": "u55",
           "cycles_vs_ptq": {"u55": 0.495, "u85": 0.5}}
    same = dict(npu)
    _take(same, {"a": 2, "b": 0}, {"a": 2, "b": 0}, widths)  # the search's own choice: nothing changes
    assert same == npu
    _take(npu, {"a": 1, "b": 2}, {"a": 2, "b": 0}, widths)
    assert npu["search_choice"] == {"a": 48, "b": 32}
    assert npu["npu_cycles"] == {"u55": 900, "u85": 480}
    assert npu["cycles_vs_ptq"] == {"u55": 0.45, "u85": 0.6}
    assert npu["held_on"] == "u85"  # 480 / 500 is the nearer to its budget


def test_without_a_hold_out_no_choice_is_tried_and_the_run_says_so():
    from types import SimpleNamespace

    from edgedeploy.config.recipe import load_recipe
    from edgedeploy.optimize.techniques.thin import _trials

    run = SimpleNamespace(recipe=load_recipe(overrides={"validation_fraction": 0.0, "thin_trials": 4}), warnings=[])
    assert _trials(run, None, None, {}, {}, [{"a": 0}, {"a": 1}], None) == ([], 0)
    assert len(run.warnings) == 1 and "selection.validation_fraction = 0" in run.warnings[0]


def test_a_shortlisted_choice_the_grid_compiled_is_not_compiled_again():
    """The shortlist's and the trials' choices that are rows of the grid take the grid's compile (the same model,
    converted and compiled alike); only the others are compiled, each in its place."""
    from edgedeploy.optimize.techniques.thin import _grid_or_new

    grid = {"u55": [{"npu_cycles": 100}, {"npu_cycles": 80}]}
    asked = []

    def compile_new(new):
        asked.append(new)
        return {"u55": [{"npu_cycles": 70 + i} for i in range(len(new))]}

    choices = [{"a": 1}, {"a": 2}, {"a": 0}, {"a": 3}]
    got = _grid_or_new(choices, [(56,), (48,), (64,), (40,)], [(64,), (56,)], grid, compile_new)
    assert asked == [[{"a": 2}, {"a": 3}]]
    assert [r["npu_cycles"] for r in got["u55"]] == [80, 70, 100, 71]
    assert _grid_or_new([{"a": 0}], [(64,)], [(64,), (56,)], grid, compile_new) == {"u55": [{"npu_cycles": 100}]}
    assert len(asked) == 1  # nothing new: nothing compiled
