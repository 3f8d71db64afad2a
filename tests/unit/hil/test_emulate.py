"""edgedeploy.hil.emulate without building: output parsing on recorded QEMU runs, the linker script, kernel selection,
the comparison, and the clean failures when a piece is missing."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from edgedeploy.cli.app import app
from edgedeploy.hil.emulate import firmware, qemu, tflm, toolchain
from edgedeploy.hil.emulate.golden_run import EmulationResult, compare_vectors, decode_outputs, record_measurement
from edgedeploy.errors import InvalidInputError, ToolFailedError, ToolMissingError, UsageError

DATA = Path(__file__).resolve().parents[2] / "data" / "emulate"
REPO = Path(__file__).resolve().parents[3]
TREE = Path(os.environ.get("EDGEDEPLOY_TFLM_DIR") or REPO.parent / "shared" / "third_party" / "tflm-cortex-m55")
needs_tree = pytest.mark.skipif(not (TREE / "tensorflow").is_dir(), reason=f"no TFLM tree at {TREE} (set EDGEDEPLOY_TFLM_DIR)")


def test_parse_output_of_a_good_run():
    rep = qemu.parse_output((DATA / "dscnn_ok.stdout.txt").read_text())
    assert rep.started and rep.done
    assert rep.cases == 4 and rep.cases_ok == [0, 1, 2, 3]
    assert rep.arena_used_bytes == 27348 and rep.arena_bytes == 40656
    assert rep.stack_used_bytes == 1456
    assert rep.fault is None and rep.error is None


def test_parse_output_of_a_lockup_keeps_what_ran():
    rep = qemu.parse_output((DATA / "dscnn_stack1k_lockup.stdout.txt").read_text())
    assert rep.started and not rep.done and rep.cases_ok == []
    assert rep.arena_used_bytes == 27348
    fatal = qemu._QEMU_FATAL.search((DATA / "dscnn_stack1k_lockup.stderr.txt").read_text())
    assert fatal and fatal.group(1).startswith("Lockup")


def test_parse_output_fault_and_error_lines():
    rep = qemu.parse_output("EDGEDEPLOY start model=10 arena=64\n\nEDGEDEPLOY fault UsageFault cfsr=0x00100000 hfsr=0x0\n")
    assert rep.fault == "UsageFault cfsr=0x00100000 hfsr=0x0"
    rep = qemu.parse_output("EDGEDEPLOY start model=10 arena=64\nEDGEDEPLOY error AllocateTensors failed (arena 64 bytes)\n")
    assert rep.error == "AllocateTensors failed (arena 64 bytes)"


def test_parse_output_keeps_tflm_messages_in_order():
    rep = qemu.parse_output("EDGEDEPLOY start model=10 arena=64\nEDGEDEPLOY tflm Failed to allocate tail memory.\n"
                            "EDGEDEPLOY tflm \nEDGEDEPLOY tflm Node CONV_2D (number 0) failed to prepare\n"
                            "EDGEDEPLOY error AllocateTensors failed (arena 64 bytes)\n")
    assert rep.tflm_messages == ["Failed to allocate tail memory.", "Node CONV_2D (number 0) failed to prepare"]
    assert rep.error == "AllocateTensors failed (arena 64 bytes)"


def test_last_lines_is_one_line():
    assert qemu.last_lines("a\n\nb\nc\nd\n") == "b | c | d"
    assert qemu.last_lines("") == "(no output)"


def test_qemu_argv_names_the_board_and_semihosting(tmp_path):
    argv = qemu.qemu_argv("/usr/bin/qemu-system-arm", tmp_path / "fw.elf")
    assert argv[argv.index("-M") + 1] == "mps3-an547"
    assert "enable=on,target=native" in argv


@needs_tree
def test_linker_script_from_the_arm_template():
    text = firmware.linker_script((TREE / firmware.LINKER_TEMPLATE).read_text(), "nn_model", 4096)
    assert "__ROM_SIZE = 0x00080000;" in text and "__RAM_SIZE = 0x00080000;" in text
    assert "__STACK_SIZE = 0x00001000;" in text
    assert "KEEP(*(nn_model))" in text.split("} > FLASH")[0]
    assert "KEEP(*(.rodata" not in firmware.linker_script((TREE / firmware.LINKER_TEMPLATE).read_text(), ".rodata.nn_model")


def test_linker_script_refuses_an_unknown_template():
    with pytest.raises(InvalidInputError, match="__ROM_SIZE"):
        firmware.linker_script("MEMORY {}\n", "nn_model")


@needs_tree
def test_op_kernels_pick_cmsis_nn_and_common_sources():
    ks = {k.op: k for k in tflm.op_kernels(TREE, ["CONV_2D", "RESHAPE", "AVERAGE_POOL_2D", "MAX_POOL_2D", "RESIZE_NEAREST_NEIGHBOR"])}
    assert ks["RESIZE_NEAREST_NEIGHBOR"].method == "AddResizeNearestNeighbor"
    assert ks["CONV_2D"].method == "AddConv2D"
    assert ks["CONV_2D"].sources == (
        "tensorflow/lite/micro/kernels/cmsis_nn/conv.cc", "tensorflow/lite/micro/kernels/conv_common.cc",
    )  # fmt: skip
    assert ks["RESHAPE"].sources[0] == "tensorflow/lite/micro/kernels/reshape.cc"
    assert ks["MAX_POOL_2D"].sources == ks["AVERAGE_POOL_2D"].sources
    for k in ks.values():
        assert all((TREE / s).is_file() for s in k.sources)


@needs_tree
def test_every_builtin_of_the_resolver_has_a_kernel_source():
    methods = tflm.resolver_methods(TREE)
    assert len(methods) > 90
    assert all(tflm.op_kernels(TREE, [op]) for op in methods)


@needs_tree
def test_op_kernels_refuse_an_operator_tflm_lacks():
    with pytest.raises(UsageError, match="NOT_AN_OP"):
        tflm.op_kernels(TREE, ["NOT_AN_OP"])


@needs_tree
def test_runtime_sources_leave_out_test_helpers_and_exist():
    srcs = tflm.runtime_sources(TREE)
    assert "tensorflow/lite/micro/micro_interpreter.cc" in srcs
    assert not any(s.endswith(("test_helpers.cc", "fake_micro_context.cc")) for s in srcs)
    assert all((TREE / s).is_file() for s in srcs)


@needs_tree
def test_the_library_compiles_only_the_cmsis_nn_files_its_kernels_call():
    cmsis = "third_party/cmsis_nn/Source/"
    reshape = tflm.library_sources(TREE, tflm.op_kernels(TREE, ["RESHAPE"]))
    assert not [s for s in reshape if s.startswith(cmsis)]  # the runtime and a reference kernel call no CMSIS-NN
    conv = tflm.library_sources(TREE, tflm.op_kernels(TREE, ["CONV_2D"]))
    assert cmsis + "ConvolutionFunctions/arm_convolve_wrapper_s8.c" in conv  # called by cmsis_nn/conv.cc
    assert cmsis + "NNSupportFunctions/arm_nn_mat_mult_nt_t_s8.c" in conv  # called by arm_convolve_s8.c in turn
    assert cmsis + "SoftmaxFunctions/arm_softmax_s8.c" not in conv and set(tflm.runtime_sources(TREE)) < conv
    # closed: every CMSIS-NN function or table a chosen file names has a chosen file defining it
    defined, mentions = tflm._cmsis_nn_index(TREE)
    chosen = {s for s in conv if s.startswith(cmsis)}
    for rel in chosen:
        for name in mentions[rel] & defined.keys():
            assert defined[name] & chosen, (rel, name)
    everything = tflm.library_sources(TREE, tflm.op_kernels(TREE, tflm.resolver_methods(TREE)))
    assert {s for s in everything if s.startswith(cmsis)} < set(mentions)  # all operators: still not all of it


C_FILES = {  # a tree's C files, and whether each must compile alone (outside CMake's unity files)
    "a/plain.c": ("#include \"x.h\"\nint arm_a(int v) { return v; }\n", False),
    "a/table.c": ("static const int lut[4] = {0};\nint arm_t(int i) { return lut[i]; }\n", False),
    "a/macro.c": ("#define ACC 12\nint arm_m(void) { return ACC; }\n", True),
    "b/pool_s8.c": ("static void\nclamp_output(int *p) { (void)p; }\nvoid arm_p8(void) {}\n", True),
    "b/pool_s16.c": ("static void clamp_output(short *p, int n);\nvoid arm_p16(void) {}\n", True),
    "b/other.c": ("static int helper_x(void) { return 1; }\nint arm_o(void) { return helper_x(); }\n", False),
}


def test_c_files_with_their_own_macro_or_a_shared_static_name_compile_alone(tmp_path):
    for rel, (text, _) in C_FILES.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text)
    sources = [*C_FILES, "k/conv.cc", "gone/missing.c"]  # C++ files are not its business; a missing file stays alone
    expected = sorted([rel for rel, (_, alone) in C_FILES.items() if alone] + ["gone/missing.c"])
    assert tflm.compiled_alone(tmp_path, sources) == expected
    assert tflm.compiled_alone(tmp_path, ["a/plain.c", "b/pool_s8.c"]) == []  # a name shared with a file not built


def test_cache_root_follows_xdg(monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert tflm.cache_root() == tmp_path / "edgedeploy" / "tflm"


def test_compare_vectors_names_the_first_difference():
    exp = [np.array([[1, 2, 3], [4, 5, 6]], dtype=np.int8)]
    got = [np.array([[1, 2, 3], [4, 7, 9]], dtype=np.int8)]
    v = compare_vectors(exp, got, rows=[10, 11], labels=[0, 1])
    assert v[0].ok and not v[1].ok
    assert v[1].first_difference == {"output": 0, "element": 1, "expected": 5, "got": 7}
    assert v[1].elements_differing == 2 and v[1].row == 11
    assert "vector 1: DIFFERS" in v[1].line()


def test_decode_outputs_checks_the_size():
    outs = [{"dtype": "int8", "bytes": 3, "shape": [1, 3]}, {"dtype": "int16", "bytes": 4, "shape": [1, 2]}]
    data = bytes([1, 2, 3]) + np.array([7, -8], dtype=np.int16).tobytes()
    a, b = decode_outputs(data * 2, outs, 2)
    assert a.shape == (2, 3) and b.tolist() == [[7, -8], [7, -8]]
    with pytest.raises(ToolFailedError, match="wrote 7 output bytes"):
        decode_outputs(data, outs, 2)


def _result(**kw) -> EmulationResult:
    base = dict(bundle=Path("fw"), name="kws", vectors=compare_vectors([np.zeros((1, 2))], [np.zeros((1, 2))]),
                arena_used_bytes=100, header_arena_bytes=200, npu_arena_bytes=150, stack_used_bytes=10,
                stack_size_bytes=1024, board={"machine": "m", "qemu": "7.2", "compiler": "gcc"}, run_seconds=0.1)  # fmt: skip
    base.update(kw)
    return EmulationResult(**base)


def test_check_fails_when_the_header_arena_is_too_small():
    _result().check()
    with pytest.raises(ToolFailedError, match="KWS_CPU_TENSOR_ARENA_SIZE"):
        _result(arena_used_bytes=300).check()


def test_check_fails_on_a_differing_vector():
    bad = compare_vectors([np.zeros((2, 3), np.int8)], [np.array([[0, 0, 0], [0, 0, 4]], np.int8)])
    with pytest.raises(ToolFailedError, match="golden vector 1 differs.*element 2 is 4, expected 0"):
        _result(vectors=bad).check()


def test_record_measurement_rewrites_only_the_measured_block(tmp_path):
    m = {"schema": "edgedeploy.firmware", "name": "kws", "cpu_model": {"tensor_arena_bytes": 200, "measured": None}, "x": [1]}
    (tmp_path / "manifest.json").write_text(json.dumps(m))
    record_measurement(tmp_path, _result())
    after = json.loads((tmp_path / "manifest.json").read_text())
    assert after["cpu_model"]["measured"]["arena_used_bytes"] == 100
    assert after["cpu_model"]["measured"]["mode"] == "measured"
    assert after["x"] == [1] and after["cpu_model"]["tensor_arena_bytes"] == 200
    assert [p.name for p in tmp_path.iterdir()] == ["manifest.json"]  # no temp file left


def test_missing_qemu_names_the_debian_package(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(ToolMissingError) as exc:
        toolchain.find_qemu()
    assert exc.value.exit_code == 5 and "apt-get install qemu-system-arm" in exc.value.hint


def test_missing_cross_compiler_names_the_debian_package(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(ToolMissingError, match="arm-none-eabi-gcc") as exc:
        toolchain.find_toolchain()
    assert "gcc-arm-none-eabi" in exc.value.hint


def test_no_tflm_tree_is_a_missing_tool(monkeypatch, tmp_path):
    monkeypatch.delenv(toolchain.TFLM_ENV, raising=False)
    with pytest.raises(ToolMissingError, match="no TensorFlow Lite Micro source tree"):
        toolchain.find_tflm(None)
    with pytest.raises(ToolMissingError, match="micro_interpreter.cc is missing"):
        toolchain.find_tflm(tmp_path)


def test_cli_on_a_folder_that_is_not_a_bundle(tmp_path):
    result = CliRunner().invoke(app, ["emulate", str(tmp_path)])
    assert result.exit_code == 3
    assert "not a firmware bundle" in result.stderr and "Traceback" not in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


def test_cli_on_a_bundle_without_cpu_path(tmp_path):
    sha = {"sha256": "ab" * 32, "bytes": 1}
    tensor = [{"name": "t", "shape": [1, 4], "dtype": "int8"}]
    (tmp_path / "manifest.json").write_text(json.dumps({
        "schema": "edgedeploy.firmware", "name": "kws", "cpu_model": None, "files": {"kws.c": sha, "kws.h": sha},
        "model": {"c_source": "kws.c", "c_header": "kws.h", "section": ".rodata"}, "inputs": tensor, "outputs": tensor}))
    result = CliRunner().invoke(app, ["emulate", str(tmp_path)])
    assert result.exit_code == 3 and "no CPU path" in result.stderr and "--golden N" in result.stderr


def test_doctor_lists_each_emulation_piece_with_its_package(monkeypatch, tmp_path):
    from edgedeploy.pipeline.environment import emulation_checks

    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.delenv(toolchain.TFLM_ENV, raising=False)
    checks = {c.name: c for c in emulation_checks(have_gcc=False)}
    assert checks["newlib (arm-none-eabi)"].hint == "apt-get install libnewlib-arm-none-eabi"
    assert checks["libstdc++ (arm-none-eabi)"].hint == "apt-get install libstdc++-arm-none-eabi-newlib"
    assert checks["qemu-system-arm"].hint == "apt-get install qemu-system-arm"
    assert not any(c.found for c in checks.values())
    assert "--tflm-dir" in checks["TFLM tree ($EDGEDEPLOY_TFLM_DIR)"].hint


@needs_tree
def test_doctor_finds_the_tree_from_the_environment(monkeypatch):
    from edgedeploy.pipeline.environment import emulation_checks

    monkeypatch.setenv(toolchain.TFLM_ENV, str(TREE))
    tree = {c.name: c for c in emulation_checks(have_gcc=False)}["TFLM tree ($EDGEDEPLOY_TFLM_DIR)"]
    assert tree.found and tree.path == str(TREE.resolve())
