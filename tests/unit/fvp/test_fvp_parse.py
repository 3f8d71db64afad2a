"""The FVP console parser on real recorded transcripts (tests/data/fvp, see SOURCE.md)."""

from __future__ import annotations

import base64
import json
from pathlib import Path

import pytest

from edgedeploy.fvp.parse import clean_lines, failure_lines, parse_fvp_log

DATA = Path(__file__).resolve().parents[2] / "data" / "fvp"

SUCCESSES = [
    "mlek_cs300_u55_img_class_pmu.txt",
    "mlek_cs320_u85_asr_conformer_pmu.txt",
    "mlek_cs300_u55_img_class_legacy_21.03.txt",
    "executorch_cs320_u85_mv2_pmu.txt",
    "mlek_cs300_u55_startup_banner.txt",
    "freertos_cs310_u55_kws_ansi_interleaved.txt",
    "toolsolutions_cs300_u55_hello_tflm_full.txt",
    "toolsolutions_cs300_u55_mobilenet_v2_full.txt",
    "tflm_cs300_cpu_benchmark_stat.txt",
    "tvm_cs300_u55_driver_debug_partial.txt",
]


def read(name: str) -> str:
    return (DATA / name).read_bytes().decode("utf-8", errors="replace")


def test_every_recorded_transcript_is_covered():
    names = {p.name for p in DATA.glob("*.txt")}
    limits = {"executorch_cs300_u55_add_timelimit.txt", "cmsis_cs300_hello_simlimit.txt"}
    failing = {n for n in names if "FAIL" in n} | limits
    assert names == set(SUCCESSES) | failing


# --------------------------------------------------------------------------- NPU counters


def test_mlek_24_05_profile():
    log = parse_fvp_log(read("mlek_cs300_u55_img_class_pmu.txt"))
    assert log.npu_active_cycles == 7345741
    assert log.npu_idle_cycles == 431
    assert log.npu_total_cycles == 7346172
    assert log.beats == {
        "AXI0_RD_DATA_BEAT_RECEIVED": 2468259,
        "AXI0_WR_DATA_BEAT_WRITTEN": 1151319,
        "AXI1_RD_DATA_BEAT_RECEIVED": 432351,
    }
    assert log.read_beats == 2468259 + 432351
    assert log.write_beats == 1151319
    assert log.inferences == 1
    assert log.profile.format == "mlek" and log.profile.derived == []
    assert log.failures == []


def test_mlek_26_profile_on_corstone_320():
    log = parse_fvp_log(read("mlek_cs320_u85_asr_conformer_pmu.txt"))
    assert (log.npu_active_cycles, log.npu_idle_cycles, log.npu_total_cycles) == (206205334, 722, 206206056)
    assert log.beats == {
        "SRAM_RD_DATA_BEAT_RECEIVED": 13858306,
        "SRAM_WR_DATA_BEAT_WRITTEN": 7968438,
        "EXT_RD_DATA_BEAT_RECEIVED": 26978241,
        "EXT_WR_DATA_BEAT_WRITTEN": 18985466,
    }
    assert log.profile.format == "mlek-26"
    assert log.ok


def test_mlek_21_03_legacy_profile_with_tabs():
    text = read("mlek_cs300_u55_img_class_legacy_21.03.txt")
    assert "\tActive NPU cycles" in text
    log = parse_fvp_log(text)
    assert log.npu_active_cycles == 7622641
    assert log.npu_idle_cycles == 525
    # This format prints no total; active + idle is the total in the other Kit formats.
    assert log.npu_total_cycles == 7622641 + 525
    assert log.profile.derived == ["total_cycles = active_cycles + idle_cycles"]
    assert log.beats == {}
    assert log.ok


def test_executorch_pmu_report_names_counters_from_events_line():
    log = parse_fvp_log(read("executorch_cs320_u85_mv2_pmu.txt"))
    assert log.npu_total_cycles == 5920305  # ethosu_pmu_cycle_cntr
    assert log.npu_idle_cycles == 503  # cntr3, the 4th event: ETHOSU_PMU_NPU_IDLE
    assert log.npu_active_cycles == 5920305 - 503
    assert log.profile.derived == ["active_cycles = total_cycles - idle_cycles"]
    assert log.beats == {
        "EXT0_RD_DATA_BEAT_RECEIVED": 359921,
        "EXT1_RD_DATA_BEAT_RECEIVED": 0,
        "EXT0_WR_DATA_BEAT_WRITTEN": 0,
    }
    assert log.inferences == 1
    assert log.memory["method_allocator_used_bytes"] == 1355722
    assert log.memory["method_allocator_pool_bytes"] == 62914560
    assert log.memory["temp_allocator_pool_bytes"] == 1048576
    assert log.memory["model_pte_loaded_bytes"] == 4425968
    assert log.profile.format == "executorch"
    assert log.ok


def test_mlia_metrics_line():
    # MLIA's generic inference runner prints base64 JSON between <metrics> tags; no recorded
    # transcript of it exists here, so the line is built in the structure MLIA's own parser reads.
    groups = [{"samples": [{"name": "NPU ACTIVE", "value": [33145]}, {"name": "NPU IDLE", "value": [1033]},
                           {"name": "NPU TOTAL", "value": [34178]},
                           {"name": "NPU AXI0_RD_DATA_BEAT_RECEIVED", "value": [9332]}]}]
    line = "<metrics>" + base64.b64encode(json.dumps(groups).encode()).decode() + "</metrics>"
    log = parse_fvp_log(f"INFO - start\n{line}\n")
    assert (log.npu_active_cycles, log.npu_idle_cycles, log.npu_total_cycles) == (33145, 1033, 34178)
    assert log.beats == {"AXI0_RD_DATA_BEAT_RECEIVED": 9332}
    assert parse_fvp_log("<metrics>not base64!</metrics>").profiles == []


# --------------------------------------------------------------------------- other facts


def test_startup_banner():
    log = parse_fvp_log(read("mlek_cs300_u55_startup_banner.txt"))
    assert log.npu_macs_per_cc == 128
    assert log.npu_arch == "1.0.6"
    assert log.npu_driver == "0.16.0"
    assert log.platform == "Arm Corstone-300 - AN552"
    assert log.profiles == [] and log.npu_total_cycles is None
    assert log.ok


def test_ansi_nul_and_interleaved_lines():
    text = read("freertos_cs310_u55_kws_ansi_interleaved.txt")
    assert "\x1b[" in text and "<NUL>" in text
    lines = clean_lines(text)
    assert not any("\x1b" in line or "<NUL>" in line for line in lines)
    assert "Booting TF-M v2.0.0" in lines
    log = parse_fvp_log(text)
    assert log.npu_macs_per_cc == 256
    assert log.npu_arch == "1.1.0"
    assert log.arena_used_bytes == 104508
    assert log.failures == []  # FVP "[warning ]" lines and "[WARN]" task logs are not failures


def test_full_run_with_stat_block():
    log = parse_fvp_log(read("toolsolutions_cs300_u55_hello_tflm_full.txt"))
    assert log.arena_used_bytes == 1596
    assert log.npu_macs_per_cc == 128  # "Creating Ethos-U55 with config H128"
    assert log.app_exit_code == 0
    s = log.stats
    times = (s.simulated_time_s, s.user_time_s, s.system_time_s, s.wall_time_s)
    assert times == (0.066055, 0.157169, 0.008168, 0.165018)
    assert s.performance_index == 0.40
    assert s.cpus == {"FVP_MPS3_Corstone_SSE_300.cpu0": {"mips": 7.08, "instructions": 1171181}}
    assert s.instructions == 1171181
    assert log.npu_total_cycles is None
    assert "fvp-stat" in log.formats
    assert log.ok


def test_five_jobs_with_driver_debug():
    log = parse_fvp_log(read("toolsolutions_cs300_u55_mobilenet_v2_full.txt"))
    assert log.arena_used_bytes == 482348
    assert log.optimizer_macs_per_cc == 128  # "macs_per_cc: 7" is log2
    assert log.npu_macs_per_cc == 128
    assert log.stats.wall_time_s == 186.247928
    assert log.stats.instructions == 5735052
    assert log.app_exit_code == 0
    assert log.ok


def test_long_tflm_log_with_memory_highwater():
    log = parse_fvp_log(read("tflm_cs300_cpu_benchmark_stat.txt"))
    assert log.stats.memory_highwater_bytes == 0x11935000
    assert log.stats.simulated_time_s == 2.958458
    assert log.stats.cpus == {"cpu0": {"mips": 36.57, "instructions": 73961463}}
    assert log.app_exit_code == 0
    assert log.ok


def test_core_driver_debug_lines():
    log = parse_fvp_log(read("tvm_cs300_u55_driver_debug_partial.txt"))
    assert log.optimizer_macs_per_cc == 256  # "macs_per_cc=8"
    assert log.npu_arch is None
    assert log.ok


@pytest.mark.parametrize("name", SUCCESSES)
def test_successful_runs_have_no_failure_lines(name):
    assert parse_fvp_log(read(name)).failures == []


# --------------------------------------------------------------------------- failures


def test_npu_config_mismatch():
    log = parse_fvp_log(read("mlek_cs300_u55_npu_config_mismatch_FAIL.txt"))
    assert log.failures == [
        "NPU config mismatch: npu.macs_per_cc=8 optimizer.macs_per_cc=7",
        "NPU config mismatch: npu.shram_size=48 optimizer.shram_size=24",
        "ERROR - Invoke failed.",
        "ERROR - Inference failed.",
    ]
    assert (log.npu_macs_per_cc, log.optimizer_macs_per_cc) == (256, 128)
    assert not log.ok


def test_planned_buffer_allocation_failure():
    log = parse_fvp_log(read("executorch_cs320_u85_alloc_planned_buffer_FAIL.txt"))
    assert len(log.failures) == 2
    assert log.failures[0].startswith(
        "E [executorch:memory_allocator.h:105 allocate()] Memory allocation failed: 6144000B"
    )
    assert log.failures[1].startswith(
        "F [executorch:arm_executor_runner.cpp:287 main()] In function main(), assert failed"
    )


def test_scratch_allocation_failure():
    log = parse_fvp_log(read("executorch_cs320_u85_alloc_scratch_FAIL.txt"))
    assert [f.split("]", 1)[0] for f in log.failures] == [
        "E [executorch:memory_allocator.h:105 allocate()",
        "E [executorch:EthosUBackend.cpp:173 execute()",
    ]
    assert "Failed to allocate scratch buffer of 8197520 bytes" in log.failures[1]


def test_hang_ended_by_cpu_time_limit():
    log = parse_fvp_log(read("executorch_cs300_u55_semihosting_timeout_FAIL_partial.txt"))
    assert log.failures == ["Info: Simulation is stopping. Reason: CPU time has been exceeded."]
    assert log.stop_reason == "CPU time has been exceeded"
    assert log.app_exit_code is None


def test_cpu_time_exceeded_after_exit_code_zero_is_a_failure():
    log = parse_fvp_log(read("executorch_cs300_u55_add_timelimit.txt"))
    assert log.app_exit_code == 0
    assert log.stop_reason == "CPU time has been exceeded"
    assert log.failures == ["Info: Simulation is stopping. Reason: CPU time has been exceeded."]
    assert not log.ok


def test_simulated_time_limit_is_a_failure():
    log = parse_fvp_log(read("cmsis_cs300_hello_simlimit.txt"))
    assert log.stop_reason == "Simulated time has been exceeded"
    assert log.failures == ["Info: Simulation is stopping. Reason: Simulated time has been exceeded."]


def test_failure_rules_do_not_match_ordinary_lines_starting_with_e_or_f():
    lines = ["EXITTHESIM", "Ethos-U version: 1.0.6", "Finished running job: x", "FreeRTOS_connect: 1",
             "Application exit code: 0.", "Received inference job response. status=0"]
    assert failure_lines(lines) == []
    assert failure_lines(["Application exit code: 1.", "Received inference job response. status=1",
                          "E: NPU error", "[critical] x", "Hard fault."]) == [
        "Application exit code: 1.", "Received inference job response. status=1", "E: NPU error", "[critical] x",
        "Hard fault.",
    ]


# --------------------------------------------------------------------------- text forms


@pytest.mark.parametrize("name", ["mlek_cs300_u55_img_class_pmu.txt", "executorch_cs320_u85_mv2_pmu.txt",
                                  "mlek_cs300_u55_npu_config_mismatch_FAIL.txt"])
def test_crlf_bare_cr_and_colour_give_the_same_result(name):
    text = read(name)
    plain = parse_fvp_log(text).to_dict()
    crlf = text.replace("\n", "\r\n")
    cr = text.replace("\n", "\r")
    coloured = "\n".join(f"\x1b[0;32m{line}\x1b[0m" for line in text.split("\n"))
    for variant in (crlf, cr, coloured):
        assert parse_fvp_log(variant).to_dict() == plain


def test_interleaved_simulator_lines_do_not_break_a_profile():
    lines = read("mlek_cs300_u55_img_class_pmu.txt").splitlines()
    lines.insert(lines.index("INFO - NPU ACTIVE cycles: 7345741"), "[warning ][main@0][3706 ns] TA0 is not enabled!")
    log = parse_fvp_log("\n".join(lines))
    assert (log.npu_active_cycles, log.npu_total_cycles) == (7345741, 7346172)
    assert log.ok


def test_two_profiles_report_the_last():
    one = read("mlek_cs300_u55_img_class_pmu.txt")
    two = one + "\n" + one.replace("NPU ACTIVE cycles: 7345741", "NPU ACTIVE cycles: 7345000").replace(
        "NPU TOTAL cycles: 7346172", "NPU TOTAL cycles: 7345431")
    log = parse_fvp_log(two)
    assert len(log.profiles) == 2
    assert log.profiles[0].active_cycles == 7345741
    assert (log.npu_active_cycles, log.npu_total_cycles) == (7345000, 7345431)


def test_empty_output():
    log = parse_fvp_log("")
    assert log.profiles == [] and log.failures == [] and log.stats is None
    assert log.npu_total_cycles is None and log.read_beats is None
