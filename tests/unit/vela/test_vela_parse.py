"""Vela output parsers, on real Vela 5.2 output recorded in tests/data/vela."""

from __future__ import annotations

from pathlib import Path

import pytest

from edgedeploy.errors import ToolFailedError
from edgedeploy.config.targets import get_target
from edgedeploy.vela.outputs import (
    build_vela_args,
    parse_cpu_operators,
    parse_operator_counts,
    parse_per_layer_csv,
    parse_summary_csv,
    summary_metrics,
)

DATA = Path(__file__).resolve().parents[2] / "data" / "vela"


def test_summary_csv_units_converted_where_parsed():
    summary = parse_summary_csv((DATA / "dscnn_u55_128_summary.csv").read_text())
    assert summary["accelerator_configuration"] == "Ethos_U55_128"
    assert summary["sram_memory_used"] == pytest.approx(21.671875)  # KiB, as Vela writes it
    layers = parse_per_layer_csv((DATA / "dscnn_u55_128_per-layer.csv").read_text())
    m = summary_metrics(summary, get_target("ethos-u55-128"), layers)
    assert m["sram_bytes"].value == 22192 and m["sram_bytes"].unit == "B"  # 21.671875 KiB
    assert m["off_chip_flash_bytes"].value == 31104  # 30.375 KiB
    assert m["flash_bytes"].value == 31104
    assert m["dram_bytes"].value == 0
    assert m["npu_cycles"].value == 88902 and m["total_cycles"].value == 89900
    assert m["original_weights_bytes"].value == 22016 and m["encoded_weights_bytes"].value == 24032
    assert m["macs"].value == 2664792
    assert m["latency_ms"].value == pytest.approx(89900 / 500e6 * 1e3)
    assert m["inferences_per_second"].value == pytest.approx(500e6 / 89900)
    # Vela's own figure at the same clock agrees with ours
    assert m["vela_inferences_per_second"].value == pytest.approx(m["inferences_per_second"].value, rel=1e-3)
    assert m["mac_utilization"].value == pytest.approx(100 * 2664792 / (89900 * 128))
    assert all(metric.mode == "estimated" for metric in m.values())
    assert len(layers) == m["layers"].value == 49
    assert layers[0]["Original Operator"] == "Conv2D" and layers[0]["MAC Count"] == 320000


def test_nan_becomes_unavailable_not_nan():
    text = (DATA / "dscnn_u55_128_summary.csv").read_text().splitlines()
    header, row = text[0].split(","), text[1].split(",")
    row[header.index("inferences_per_second")] = "nan"
    row[header.index("nn_macs")] = "nan"
    summary = parse_summary_csv(",".join(header) + "\n" + ",".join(row) + "\n")
    assert summary["inferences_per_second"] is None
    m = summary_metrics(summary, get_target("ethos-u55-128"), [])
    assert m["vela_inferences_per_second"].value is None
    assert "nan" in m["vela_inferences_per_second"].to_dict()["unavailable"]
    assert m["mac_utilization"].value is None


def test_summary_requires_exactly_one_row():
    with pytest.raises(ToolFailedError):
        parse_summary_csv("a,b\n")


def test_cpu_operators_with_vela_reasons():
    stdout = (DATA / "ds_cnn_s_arm_u85_256_stdout.txt").read_text()
    ops = parse_cpu_operators(stdout)
    assert [(o.op, o.name) for o in ops] == [("QUANTIZE", "input_int8"), ("DEQUANTIZE", "Identity")]
    assert "unsupported DataType Float32" in ops[0].reason
    assert ops[1].reason == "Unsupported opType"
    assert parse_operator_counts(stdout) == {"cpu": 2, "npu": 48}


def test_no_cpu_operators_on_an_all_npu_model():
    stdout = "CPU operators = 0 (0.0%)\nNPU operators = 49 (100.0%)\n   NPU: Conv2D = x (outputs [1, 5, 25, 64])\n"
    assert parse_cpu_operators(stdout) == []
    assert parse_operator_counts(stdout) == {"cpu": 0, "npu": 49}


def test_vela_args_name_the_target_settings(tmp_path):
    t = get_target("corstone-320-u85-256")
    args = build_vela_args(Path("m.tflite"), t, tmp_path, "Size")
    assert args[0] == "m.tflite"
    pairs = dict(zip(args[1::2], args[2::2]))
    assert pairs["--accelerator-config"] == "ethos-u85-256"
    assert pairs["--system-config"] == "Ethos_U85_SYS_DRAM_Mid"
    assert pairs["--memory-mode"] == "Dedicated_Sram_384KB"
    assert pairs["--optimise"] == "Size"
    assert Path(pairs["--config"]) == t.vela_ini_path()
    assert "--verbose-performance" in args and "--show-cpu-operations" in args
