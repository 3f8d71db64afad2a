"""Compute- vs memory-bound layers and MAC totals from real recorded Vela 5.2 per-layer CSVs."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

from edgedeploy.vela.compute import compute_facts, layer_bounds, leaf_npu_rows
from edgedeploy.vela.outputs import parse_per_layer_csv

DATA = Path(__file__).resolve().parents[2] / "data"
U85 = DATA / "report/run_u55_u85/compile/resnet8_mlperf/ethos-u85-256/model_int8_per-layer.csv"
U55 = DATA / "vela/dscnn_u55_128_per-layer.csv"


def test_bounds_follow_the_longest_of_compute_and_memory_cycles():
    rows = layer_bounds(parse_per_layer_csv(U85.read_text()))
    first, second = rows[0], rows[1]
    # recorded: Op Cycles 11718 = DRAM AC 11718 > NPU 8788; then Op Cycles 13037 = NPU 13037 > DRAM AC 3124
    assert (first["op_cycles"], first["npu_cycles"], first["bound"], first["memory"]) == (11718, 8788, "memory", "DRAM")
    assert (second["op_cycles"], second["npu_cycles"], second["bound"]) == (13037, 13037, "compute")
    assert first["macs"] == 442368 and first["name"].endswith("Conv2D1")
    assert all(r["op_cycles"] == max(r["npu_cycles"], r["memory_cycles"]) for r in rows)


def test_totals_add_up_to_the_layers():
    layers = parse_per_layer_csv(U55.read_text())
    facts = compute_facts(layers)
    rows = facts["layers"]
    assert facts["compute_bound_layers"] + facts["memory_bound_layers"] == len(rows) > 0
    assert facts["compute_bound_cycles"] + facts["memory_bound_cycles"] == sum(r["op_cycles"] for r in rows)
    assert facts["compute_bound_macs"] + facts["memory_bound_macs"] == sum(int(r.get("MAC Count") or 0)
                                                                           for r in layers if r.get("Target") == "NPU")
    assert 0 <= facts["compute_bound_fraction"] <= 1


def test_leaf_rows_give_ratios_to_ptq_on_the_same_target():
    def rec(v, t, macs, cycles):
        return SimpleNamespace(variant=v, target=t, metrics={"macs": {"value": macs}, "npu_cycles": {"value": cycles}},
                               details={})
    rows = leaf_npu_rows([rec("ptq", "u85", 100, 1000), rec("pcqat", "u85", 52, 640), rec("pcqat", "u55", 100, 900)])
    by = {(r["leaf"], r["target"]): r for r in rows}
    assert by[("pcqat", "u85")]["macs_vs_ptq"] == 0.52 and by[("pcqat", "u85")]["cycles_vs_ptq"] == 0.64
    assert by[("pcqat", "u55")]["cycles_vs_ptq"] is None  # no ptq on that target


def test_with_a_latency_requirement_fewer_cycles_come_before_a_smaller_flash():
    from edgedeploy.report.judge import recommend
    from edgedeploy.report.limits import Requirements

    def row(leaf, cycles, flash):
        return {"leaf": leaf, "level": 3, "meets_requirements": True, "requirements": {}, "recommended": False,
                "values": {"int8_accuracy_pct": {"value": 75.0}, "total_cycles": {"value": cycles},
                           "compiled_model_bytes": {"value": flash}}}

    def pick(req):
        return recommend([row("unstructured", 99_000, 40_000), row("two_of_four", 68_000, 52_000)], "u85", req)

    assert pick(Requirements())["leaf"] == "unstructured"  # no latency requirement: the smaller flash
    chosen = pick(Requirements(max_latency_ms=1.0))
    assert chosen["leaf"] == "two_of_four" and "fewest cycles" in chosen["message"]


def test_the_report_note_names_each_multiplying_layer_compute_or_memory_bound():
    from edgedeploy.vela.compute import bound_layers_note

    facts = compute_facts(parse_per_layer_csv(U85.read_text()))
    note = bound_layers_note("ethos-u85-256", [("ptq", facts), ("none", {})])
    compute, memory = note.split("ptq: compute ")[1].split("; memory ")
    # recorded: model/conv2d/Conv2D1 waits on DRAM (11718 > NPU 8788), model/conv2d_1/Conv2D1 on the NPU
    assert "conv2d" in memory.split(", ") and "conv2d_1" in compute.split(", ")
    assert "none:" not in note and bound_layers_note("ethos-u85-256", [("ptq", {})]) is None
