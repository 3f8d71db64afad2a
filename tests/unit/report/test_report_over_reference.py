"""The judge's flag on a leaf that costs more than ptq on a target, on recorded Vela output: a small CNN whose
``Rescaling(1/255)`` input the ptq converter folds away and an unfolded QAT model keeps as a MUL (see
tests/data/vela/SOURCE.md)."""

from __future__ import annotations

from pathlib import Path

import pytest

from edgedeploy.report.judge import flag_over_reference, pick, recommend
from edgedeploy.report.limits import Requirements
from edgedeploy.vela.compute import layer_bounds
from edgedeploy.vela.outputs import parse_per_layer_csv, parse_summary_csv

DATA = Path(__file__).resolve().parents[2] / "data" / "vela"
T = "ethos-u55-128"


def recorded(leaf: str) -> tuple[int, list]:
    summary = parse_summary_csv((DATA / f"rescaling_cnn_{leaf}_u55_128_summary.csv").read_text())
    layers = layer_bounds(parse_per_layer_csv((DATA / f"rescaling_cnn_{leaf}_u55_128_per-layer.csv").read_text()))
    return int(summary["cycles_npu"]), layers


def cell(value, unit=""):
    return {"value": value, "unit": unit, "mode": "estimated"}


def row(leaf, level, cycles, flash, acc=90.0, meets=None):
    return {"leaf": leaf, "level": level, "target": T, "requirements": {}, "meets_requirements": meets,
            "recommended": False, "values": {"npu_cycles": cell(cycles, "cycles"), "total_cycles": cell(cycles),
                                             "compiled_model_bytes": cell(flash, "B"),
                                             "int8_accuracy_pct": cell(acc, "%")}}


@pytest.fixture
def facts():
    (ptq_cycles, ptq_layers), (qat_cycles, qat_layers) = recorded("ptq"), recorded("qat")
    rows = [row("ptq", 0, ptq_cycles, 4528), row("qat", 1, qat_cycles, 4528, acc=91.0)]
    return rows, {("ptq", T): ptq_layers, ("qat", T): qat_layers}


def test_a_leaf_slower_than_ptq_is_flagged_with_the_layer_that_accounts_for_it(facts):
    rows, layers = facts
    notes = flag_over_reference(rows, layers)
    ptq, qat = rows
    assert ptq["over_reference"] is None
    flag = qat["over_reference"]
    assert flag["npu_cycles"] == {"value": 16986, "reference": 15146, "ratio": 1.1215}
    assert "compiled_model_bytes" not in flag  # same flash: only the cycles are over
    # the MUL the QAT model kept over the input is the one layer named: its cycles alone cover the excess
    assert [(e["operator"], e["layer"], e["reference_npu_cycles"]) for e in flag["layers"]] == [
        ("Mul", "model/quant_rescaling/mul", None)]
    assert flag["layers"][0]["extra_cycles"] == 2304 >= 16986 - 15146
    assert notes == [flag["text"]]
    assert flag["text"].startswith("qat costs more than ptq on ethos-u55-128: NPU cycles 16,986, 1.121x ptq's 15,146")
    assert "Mul model/quant_rescaling/mul (+2,304 cycles, not in ptq)" in flag["text"]


@pytest.mark.parametrize("cycles,flash,over", [
    (15146, 4528, []),  # as ptq: nothing to flag
    (14000, 4000, []),  # cheaper on both
    (15146, 4600, ["compiled_model_bytes"]),  # larger only
    (16986, 4600, ["npu_cycles", "compiled_model_bytes"]),
])
def test_only_what_exceeds_ptq_is_flagged(facts, cycles, flash, over):
    rows, layers = facts
    rows[1] = row("qat", 1, cycles, flash)
    flag_over_reference(rows, layers)
    got = rows[1]["over_reference"]
    assert (got is None) == (not over)
    if over:
        assert [k for k in ("npu_cycles", "compiled_model_bytes") if k in got] == over


def test_a_flagged_leaf_is_never_recommended_over_a_ptq_that_meets(facts):
    """qat is better on accuracy, and ptq would be passed over were it beaten: a flagged leaf never beats it, and
    with ptq meeting the requirements neither the report nor the walk picks the flagged one."""
    rows, layers = facts
    flag_over_reference(rows, layers)
    for r in rows:
        r["meets_requirements"] = True
    assert recommend(rows, T, Requirements())["leaf"] == "ptq"
    assert pick({"rows": rows}, ["ptq", "qat"], [T])[0] == "ptq"
    # ptq misses a requirement: the flagged leaf may be recommended, and the message says what it costs
    rows[0]["meets_requirements"] = False
    rec = recommend(rows, T, Requirements())
    assert rec["leaf"] == "qat" and "qat costs more than ptq" in rec["message"] and "Mul" in rec["message"]


def test_without_a_ptq_on_the_target_nothing_is_flagged(facts):
    rows, layers = facts
    rows[0]["target"] = "other"
    assert flag_over_reference(rows, layers) == [] and rows[1]["over_reference"] is None


def cpu_row(leaf, level, cycles, cpu_ops):
    r = row(leaf, level, cycles, 4528)
    r["values"]["cpu_operators"] = cell(len(cpu_ops), "count")
    r["cpu_operator_list"] = [{"op": op, "name": name, "reason": "Unsupported opType"} for op, name in cpu_ops]
    return r


@pytest.mark.parametrize("leaf_ops,flagged", [
    ([], None),  # none on the CPU, as ptq
    ([("DEQUANTIZE", "model/quantize_layer/fq"), ("QUANTIZE", "tfl.quantize")],
     ["DEQUANTIZE 'model/quantize_layer/fq'", "QUANTIZE 'tfl.quantize'"]),
    ([("CUSTOM", "user_op"), ("DEQUANTIZE", "model/quantize_layer/fq")], ["DEQUANTIZE 'model/quantize_layer/fq'"]),
])
def test_a_leaf_with_more_cpu_operators_than_ptq_is_flagged_naming_them(facts, leaf_ops, flagged):
    """Same NPU cycles and flash as ptq, but operators left to the CPU: their time is in no cycle count, so the
    flag names the operators ptq does not have (a CUSTOM op ptq has too is not named)."""
    _, layers = facts
    ptq = cpu_row("ptq", 0, 15146, [("CUSTOM", "user_op")] if any(o == "CUSTOM" for o, _ in leaf_ops) else [])
    rows = [ptq, cpu_row("qat", 1, 15146, leaf_ops)]
    notes = flag_over_reference(rows, layers)
    got = rows[1]["over_reference"]
    if flagged is None:
        assert got is None and notes == []
        return
    assert list(got) == ["reference", "cpu_operators", "layers", "text"]  # not over on cycles nor flash
    assert (got["cpu_operators"]["value"], got["cpu_operators"]["reference"]) == (
        len(leaf_ops), len(ptq["cpu_operator_list"]))
    assert notes == [got["text"]]
    assert got["text"].startswith(f"qat costs more than ptq on {T}: {len(leaf_ops)} operators on the CPU (ptq ")
    for name in flagged:
        assert name in got["text"]
    assert "CUSTOM" not in got["text"]
