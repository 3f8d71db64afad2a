"""The Vela runner with real Vela in real worker processes: one typed result per request, in order, and a run
Vela refuses reported with its own words."""

from __future__ import annotations

import pytest

from edgedeploy.config.targets import get_target, load_target_file
from edgedeploy.errors import ToolFailedError
from edgedeploy.vela.outputs import parse_per_layer_csv, parse_summary_csv
from edgedeploy.vela.runner import DEBUG_DB_FLAG, NEEDED, VelaRequest, run_all

pytestmark = pytest.mark.requires_data


def test_run_all_gives_each_request_its_parsed_result_in_order(dscnn_int8, tmp_path):
    requests = [VelaRequest(dscnn_int8, get_target("ethos-u55-128"), tmp_path / "u55", "Performance",
                            (DEBUG_DB_FLAG,)),
                VelaRequest(dscnn_int8, get_target("ethos-u85-256"), tmp_path / "u85", "Size")]
    for r in requests:
        r.output_dir.mkdir()
    u55, u85 = run_all(requests, need=NEEDED | {"per_layer_csv"})
    for request, result in zip(requests, (u55, u85)):
        assert result.request is request and result.args == request.args and result.seconds > 0
        assert result.summary == parse_summary_csv(result.files["summary_csv"].read_text())
        assert result.layers == parse_per_layer_csv(result.files["per_layer_csv"].read_text())
        assert result.metrics["npu_cycles"].value == result.summary["cycles_npu"]
        assert result.operator_counts["cpu"] == 0 and result.operator_counts["npu"] > 0
        assert result.files["vela_model"].parent == request.output_dir
    assert u55.debug_tables is not None and "perf_debug" in u55.debug_tables and "debug_db" in u55.files
    assert u85.debug_tables is None and "debug_db" not in u85.files
    assert u55.metrics["npu_cycles"].value != u85.metrics["npu_cycles"].value


def test_a_run_vela_refuses_is_a_tool_failure_with_vela_s_words(dscnn_int8, tmp_path):
    # A system config with a value Vela rejects when it compiles.
    (tmp_path / "broken.ini").write_text(
        "[System_Config.Broken]\ncore_clock=fast\naxi0_port=Sram\naxi1_port=OffChipFlash\n"
        "[Memory_Mode.Mode]\nconst_mem_area=Axi1\narena_mem_area=Axi0\ncache_mem_area=Axi0\n")
    (tmp_path / "broken.toml").write_text(
        'schema_version = 1\nname = "broken"\nkind = "npu"\n[npu]\naccelerator_config = "ethos-u55-128"\n'
        '[vela]\nconfig = "broken.ini"\nsystem_config = "Broken"\nmemory_mode = "Mode"\n'
        '[clocks]\nnpu_hz = 500_000_000\n')
    target = load_target_file(tmp_path / "broken.toml")
    (tmp_path / "out").mkdir()
    with pytest.raises(ToolFailedError) as err:
        run_all([VelaRequest(dscnn_int8, target, tmp_path / "out")], shown=["a candidate"], fix="read the log")
    assert err.value.message.startswith("Vela failed on a candidate for target broken (exit ")
    assert "fast" in err.value.message and err.value.hint == "read the log"
