"""`edgedeploy verify` on compiled models whose declared sizes would take memory or time without bound: each is
refused from the declared sizes, in one line naming the file, the operation and the field, before anything big is
allocated; and `--count` is bounded. The refusals run their command in the test process; the memory limit set in
the environment is read by the console script."""

from __future__ import annotations

import hashlib
import json
import re
import shutil
import struct
import time
from pathlib import Path

import pytest

from helpers import PAYLOAD32, one_error_line, run_cli, run_in_process, set_registers

EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "kws" / "dscnn_mlperf_int8.tflite"
TARGET = "ethos-u55-128"
VELA = Path("compile") / "dscnn_mlperf" / TARGET / "model_int8_vela.tflite"
DEBUG_DB = VELA.with_name("model_int8_debug.xml")
INT8 = Path("import") / "dscnn_mlperf" / "model_int8.tflite"
# register codes (Vela's ethos_u55_regs): 16-bit cmd0 and 32-bit cmd1 settings
OFM_WIDTH_M1, OFM_HEIGHT_M1, OFM_DEPTH_M1 = 0x111, 0x112, 0x113
KERNEL_WIDTH_M1, KERNEL_HEIGHT_M1 = 0x120, 0x121
IFM_STRIDE_X, IFM_STRIDE_Y, OFM_STRIDE_X, OFM_STRIDE_Y = 0x04, 0x05, 0x14, 0x15
SECONDS = 30  # a refusal comes before TensorFlow, the regions or any operation's arrays


@pytest.fixture(scope="module")
def compiled(tmp_path_factory) -> Path:
    run = tmp_path_factory.mktemp("bounds") / "run"
    proc = run_cli("compile", EXAMPLE, "-t", TARGET, "-o", run, "--debug-db")
    assert proc.returncode == 0, proc.stderr
    return run


def _hostile(run: Path, dest: Path, change, debug_db: str | None = None, int8_change=None) -> Path:
    """A copy of ``run`` whose compiled model ``change(bytes, leaf)`` rewrote (its int8 model ``int8_change(bytes)``
    and its debug database is ``debug_db``, if given), with the manifest's hashes to match: only the declared
    sizes stand between the files and the NPU model."""
    from edgedeploy.npu.leaf_layout import read_leaf

    shutil.copytree(run, dest)
    for path, edit in ((dest / VELA, lambda data: change(data, read_leaf(dest / VELA))), (dest / INT8, int8_change)):
        if edit is not None:
            data = bytearray(path.read_bytes())
            edit(data)
            path.write_bytes(data)
    if debug_db is not None:
        (dest / DEBUG_DB).write_text(debug_db)
    manifest = json.loads((dest / "manifest.json").read_text())
    for stage in manifest["stages"]:
        for out in stage["outputs"]:
            if out["path"] in (str(VELA), str(DEBUG_DB), str(INT8)):
                body = (dest / out["path"]).read_bytes()
                out["sha256"], out["bytes"] = hashlib.sha256(body).hexdigest(), len(body)
    (dest / "manifest.json").write_text(json.dumps(manifest))
    return dest


def _registers(*settings: tuple[int, int]):
    """Set the first setting of each register of the command stream to a value (16-bit codes below 0x4000,
    32-bit ones with PAYLOAD32 added)."""

    def change(data: bytearray, leaf) -> None:
        words = list(leaf.commands)
        start = data.find(struct.pack(f"<{len(words)}I", *words))
        assert start > 0
        data[start : start + 4 * len(words)] = struct.pack(f"<{len(words)}I", *set_registers(words, settings))

    return change


def _scratch(size: int):
    def change(data: bytearray, leaf) -> None:
        old = struct.pack("<Ii", 1, leaf.scratch_size)  # the scratch tensor's shape vector
        assert data.count(old) == 1
        data[data.find(old) : data.find(old) + 8] = struct.pack("<Ii", 1, size)

    return change


def _input_offset(offset: int):
    def change(data: bytearray, leaf) -> None:
        # OfflineMemoryAllocation of this model: its count, then command stream, weights, scratch, input, output
        old = struct.pack("<6i", 5, -1, -1, 0, leaf.inputs[0].address, leaf.outputs[0].address)
        assert data.count(old) == 1
        at = data.find(old)
        data[at : at + 24] = struct.pack("<6i", 5, -1, -1, 0, offset, leaf.outputs[0].address)

    return change


HOSTILE = {
    "a 65,536-deep feature map": (
        _registers((OFM_DEPTH_M1, 0xFFFF)),
        r"operation 1 \(CONV, word 82\): OFM is 25x5x65536 8-bit elements \(8,192,000 bytes; OFM_HEIGHT_M1, "
        r"OFM_WIDTH_M1, OFM_DEPTH_M1\), more than region 1 holds \(22,192 bytes\)"),
    "zero strides and a 1024x1024 output": (
        _registers((PAYLOAD32 | IFM_STRIDE_X, 0), (PAYLOAD32 | IFM_STRIDE_Y, 0), (PAYLOAD32 | OFM_STRIDE_X, 0),
                   (PAYLOAD32 | OFM_STRIDE_Y, 0), (OFM_HEIGHT_M1, 1023), (OFM_WIDTH_M1, 1023)),
        r"operation 1 \(CONV, word 82\): OFM is 1024x1024x16 8-bit elements"),
    "a 1024x1024 kernel": (
        _registers((KERNEL_HEIGHT_M1, 1023), (KERNEL_WIDTH_M1, 1023)),
        r"operation 1 \(CONV, word 82\): a 1024x1024 kernel \(KERNEL_HEIGHT_M1, KERNEL_WIDTH_M1\) has 1,048,576 "
        r"positions, over the limit of 65,536"),
    "a 2**31-byte scratch tensor": (
        _scratch(2**31 - 1),
        r"the scratch tensor declares 2,147,483,647 bytes .* over the NPU model's memory limit of 2,048 MiB"),
    "an input at arena offset 2**31 - 256": (
        _input_offset(2**31 - 256),
        r"input 'input_1' at arena offset 2,147,483,392 ends at 2,147,483,882"),
}


@pytest.mark.parametrize("case", list(HOSTILE))
def test_declared_sizes_are_bounded_before_use(compiled, tmp_path, case):
    change, message = HOSTILE[case]
    run = _hostile(compiled, tmp_path / "hostile", change)
    t0 = time.perf_counter()
    proc = run_in_process("verify", run, "-t", TARGET, "-n", 100, env={"EDGEDEPLOY_NPU_MEMORY_MIB": ""})
    seconds = time.perf_counter() - t0
    assert proc.returncode == 11, proc.stderr
    line = one_error_line(proc)
    assert str(run / VELA) in line
    assert re.search(message, line), line
    assert seconds < SECONDS, f"{case}: {seconds:.1f} s"


@pytest.mark.parametrize("option, message", [
    (("-n", 10**12), "--count is 1,000,000,000,000. pass a number of cases from 1 to 10,000"),
    (("-n", 0), "--count is 0. pass a number of cases from 1 to 10,000"),
    (("--seed", -1), "--seed is -1. pass a seed >= 0"),
])
def test_count_and_seed_are_checked(compiled, option, message):
    t0 = time.perf_counter()
    proc = run_in_process("verify", compiled, "-t", TARGET, *option)
    assert proc.returncode == 2 and one_error_line(proc) == f"error: {message}"
    assert time.perf_counter() - t0 < SECONDS


def test_count_over_the_memory_limit_says_how_many_fit(compiled):
    proc = run_in_process("verify", compiled, "-t", TARGET, "-n", 10_000, env={"EDGEDEPLOY_NPU_MEMORY_MIB": "64"})
    assert proc.returncode == 2
    line = one_error_line(proc)
    assert "--count 10,000: the NPU model of" in line and "over the memory limit of 64 MiB" in line
    assert "pass --count" in line and "or fewer, or raise EDGEDEPLOY_NPU_MEMORY_MIB" in line


def test_a_bad_limit_setting_is_named(compiled):
    proc = run_cli("verify", compiled, "-t", TARGET, env={"EDGEDEPLOY_NPU_MEMORY_MIB": "lots"})
    assert proc.returncode == 2
    assert one_error_line(proc) == "error: EDGEDEPLOY_NPU_MEMORY_MIB is 'lots'. set it to a whole number >= 1 " \
                                   "(default 2048)"


def _weights_damaged(data: bytearray, leaf) -> None:
    start = data.find(leaf.weights[:64])
    for i in range(start + 6000, start + 6040):
        data[i] ^= 0x5A


def test_a_debug_database_that_never_closes_is_named_in_the_mismatch(compiled, tmp_path):
    # 10 MB of CDATA that never closes, recorded as the compile's database (its hash updated to match)
    never = '<debug>\n<table name="queue">\n<![CDATA[\n' + "x" * 10_000_000
    run = _hostile(compiled, tmp_path / "hostile", _weights_damaged, debug_db=never)
    t0 = time.perf_counter()
    proc = run_in_process("verify", run, "-t", TARGET, "-n", 4)
    assert proc.returncode == 12, proc.stderr
    line = one_error_line(proc)
    assert f"(no TFLite operator named: Vela's debug database {run / DEBUG_DB}: the CDATA of table 'queue' " \
           "(byte 8) is never closed. re-run the compile with --debug-db)" in line
    assert time.perf_counter() - t0 < 120


def test_an_int8_model_declaring_a_huge_input_is_refused_before_inputs_are_drawn(compiled, tmp_path):
    def wide_input(data: bytearray) -> None:
        old = struct.pack("<5i", 4, 1, 49, 10, 1)  # the input tensor's shape vector [1, 49, 10, 1]
        assert data.count(old) == 1
        at = data.find(old)
        data[at : at + 20] = struct.pack("<5i", 4, 1, 49, 10, 1 << 24)

    run = _hostile(compiled, tmp_path / "hostile", lambda data, leaf: None, int8_change=wide_input)
    t0 = time.perf_counter()
    proc = run_in_process("verify", run, "-t", TARGET, "-n", 10)
    assert proc.returncode == 3, proc.stderr
    line = one_error_line(proc)
    assert f"{run / INT8}: its tensors declare" in line and "(the largest 'input_1'), over the NPU model's memory " \
        "limit of 2,048 MiB" in line
    assert time.perf_counter() - t0 < SECONDS
