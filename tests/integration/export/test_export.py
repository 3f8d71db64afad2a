"""`edgedeploy export` on a real compiled model: golden vectors, a real Cortex-M55 compile, CMake, HIL, bad input."""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from helpers import invoke_cli as cli, pytest_argv

from edgedeploy.pipeline.compile import compile_tflite

pytestmark = pytest.mark.requires_data

REPO = Path(__file__).resolve().parents[3]
TARGETS = ["ethos-u55-128", "corstone-300-u55-128"]
BOARD = "corstone-300-u55-128"
NAME = "dscnn_mlperf"
ARM_GCC = "arm-none-eabi-gcc"
ARM_HINT = "apt-get install gcc-arm-none-eabi binutils-arm-none-eabi"


@pytest.fixture(scope="module")
def kws(shared_data):
    return {
        "model": shared_data / "kws" / "dscnn_mlperf_int8.tflite",
        "data": shared_data / "kws" / "speech_commands_v2_test_mfcc_mlperf.npz",
    }


@pytest.fixture(scope="module")
def run_dir(kws, tmp_path_factory):
    out = tmp_path_factory.mktemp("export") / "run"
    compile_tflite([kws["model"]], TARGETS, out)
    return out


@pytest.fixture(scope="module")
def bundle(run_dir, kws, tmp_path_factory):
    fw = tmp_path_factory.mktemp("fw") / "fw"
    result = cli("export", run_dir, "--target", BOARD, "--out", fw, "--data", kws["data"], "--golden", 8, "--json")
    assert result.exit_code == 0, result.output
    manifest = json.loads(result.stdout)  # stdout is only JSON
    assert manifest["schema"] == "edgedeploy.firmware"
    return fw


def vela_model(run_dir: Path, target: str = BOARD) -> Path:
    (path,) = (run_dir / "compile" / NAME / target).glob("*_vela.tflite")
    return path


def tflm_outputs(model: Path, inputs: np.ndarray) -> np.ndarray:
    from tflite_micro.python.tflite_micro import runtime

    interp = runtime.Interpreter.from_file(str(model))
    outs = []
    for x in inputs:
        interp.set_input(x[None, ...], 0)
        interp.invoke()
        outs.append(np.array(interp.get_output(0))[0])
    return np.stack(outs)


# --------------------------------------------------------------------------- golden vectors


def test_golden_outputs_equal_a_fresh_tflm_run(bundle, run_dir):
    golden = np.load(bundle / "golden.npz")
    assert golden["input_0"].shape == (8, 49, 10, 1) and golden["input_0"].dtype == np.int8
    expected = tflm_outputs(run_dir / "import" / NAME / "model_int8.tflite", golden["input_0"])
    assert expected.dtype == np.int8
    assert np.array_equal(golden["output_0"], expected)  # bit for bit
    assert golden["argmax"].tolist() == expected.argmax(axis=1).tolist()


def test_golden_inputs_are_quantized_eval_rows(bundle, kws):
    golden = np.load(bundle / "golden.npz")
    data = np.load(kws["data"])
    rows = golden["row"]
    assert (data["split"][rows] == 1).all()  # evaluation split only
    assert golden["label"].tolist() == data["y"][rows].tolist()
    assert len(set(golden["label"].tolist())) == 8  # one class per case first
    x = data["x"][rows].astype(np.float32) / np.float32(0.5847029089927673)
    rounded = np.where(x >= 0, np.floor(x + 0.5), np.ceil(x - 0.5))  # half away from zero
    assert np.array_equal(golden["input_0"], np.clip(rounded + 83, -128, 127).astype(np.int8))
    assert golden["labels"].tolist() == data["labels"].tolist()


def test_manifest_records_reference_and_tflite_distance(bundle, run_dir, kws):
    m = json.loads((bundle / "manifest.json").read_text())
    g = m["golden"]
    assert g["reference"]["interpreter"] == "tflite-micro" and g["reference"]["kernels"] == "reference"
    assert "before Vela" in g["reference"]["description"]
    cmp = g["tflite_comparison"]
    assert cmp["available"] is True and "XNNPACK" in cmp["interpreter"]
    assert 0 <= cmp["fraction_differing"] <= 1 and cmp["elements"] == 8 * 12
    assert cmp["elements_differing"] == round(cmp["fraction_differing"] * 96)
    assert cmp["reference_kernels"]["max_abs_diff"] == 0  # TFLite's reference kernels agree with TFLM's
    assert m["tools"]["tflite-micro"] and m["tools"]["ai-edge-litert"] == "2.3.0"
    vela = vela_model(run_dir)
    assert m["model"]["bytes"] == vela.stat().st_size and m["model"]["section"] == "nn_model"
    rec = json.loads((run_dir / "manifest.json").read_text())
    (compiled,) = [s for s in rec["stages"] if s["id"] == f"compile/{NAME}/{BOARD}"]
    sram = compiled["metrics"]["sram_bytes"]["value"]
    assert m["memory"]["tensor_arena_bytes"] == -(-(sram + 16384) // 16) * 16
    assert g["data"]["path"] == str(kws["data"].resolve())
    assert m["files"]["golden.npz"]["sha256"] and "manifest.json" not in m["files"]


def test_header_numbers_match_the_model(bundle, run_dir):
    from edgedeploy.tflite.reader import read_tflite

    h = (bundle / f"{NAME}.h").read_text()
    model = read_tflite(run_dir / "import" / NAME / "model_int8.tflite")
    inp, out = model.inputs[0], model.outputs[0]
    assert f"#define DSCNN_MLPERF_MODEL_SIZE {vela_model(run_dir).stat().st_size}u" in h
    assert f"#define DSCNN_MLPERF_INPUT_0_ZERO_POINT {inp.zero_point[0]}" in h
    scale = float(re.search(r"#define DSCNN_MLPERF_INPUT_0_SCALE (\S+)f", h).group(1))
    assert np.float32(scale) == np.float32(inp.scale[0])
    assert f"#define DSCNN_MLPERF_OUTPUT_0_ZERO_POINT ({out.zero_point[0]})" in h
    assert "#define DSCNN_MLPERF_NUM_LABELS 12" in h and '"_silence_"' in h


def test_export_is_deterministic(bundle, run_dir, kws, tmp_path):
    again = tmp_path / "again"
    result = cli("export", run_dir, "--target", BOARD, "--out", again, "--data", kws["data"], "--golden", 8)
    assert result.exit_code == 0, result.output
    names = sorted(p.name for p in bundle.iterdir())
    assert names == sorted(p.name for p in again.iterdir())
    for name in names:
        assert (bundle / name).read_bytes() == (again / name).read_bytes(), name


def test_single_variant_needs_no_leaf_and_npu_target_uses_default_section(run_dir, tmp_path):
    result = cli("export", run_dir, "--target", "ethos-u55-128", "--out", tmp_path / "fw", "--golden", 0)
    assert result.exit_code == 0, result.output
    m = json.loads((tmp_path / "fw" / "manifest.json").read_text())
    assert m["source"]["leaf"] == NAME and m["model"]["section"] == ".rodata.nn_model"
    assert m["memory"]["runtime_margin_source"].startswith("edgedeploy default")
    assert not (tmp_path / "fw" / "golden.npz").exists()
    result = cli("export", run_dir, "--target", "ethos-u55-128", "--out", tmp_path / "fw2", "--golden", 0,
                 "--section", "my_models", "--name", "kws")  # fmt: skip
    assert result.exit_code == 0, result.output
    assert '__attribute__((aligned(16), section("my_models")))' in (tmp_path / "fw2" / "kws.c").read_text()


# --------------------------------------------------------------------------- a real Cortex-M55 compile


@pytest.fixture(scope="module")
def arm_gcc():
    if shutil.which(ARM_GCC) is None:
        pytest.skip(f"{ARM_GCC} not installed ({ARM_HINT})")
    return ARM_GCC


def arm(tool: str, *args, cwd=None) -> str:
    proc = subprocess.run([f"arm-none-eabi-{tool}", *map(str, args)], capture_output=True, text=True, cwd=cwd)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def test_bundle_compiles_for_cortex_m55_with_model_in_its_section(arm_gcc, bundle, run_dir, tmp_path):
    flags = ["-mcpu=cortex-m55", "-mthumb", "-O2", "-Wall", "-Wextra", "-Werror", "-c"]
    obj = tmp_path / "model.o"
    arm("gcc", *flags, bundle / f"{NAME}.c", "-o", obj)
    arm("gcc", *flags, bundle / f"{NAME}_golden.c", "-o", tmp_path / "golden.o")
    size = vela_model(run_dir).stat().st_size
    sections = arm("readelf", "-S", "-W", obj)
    line = next(ln for ln in sections.splitlines() if re.search(r"\]\s+nn_model\s", ln))
    fields = line.split("]", 1)[1].split()
    # Name Type Addr Off Size ES Flg Lk Inf Al
    assert int(fields[4], 16) == size
    assert int(fields[-1]) == 16
    symbols = arm("readelf", "-s", "-W", obj)
    sym = next(ln.split() for ln in symbols.splitlines() if ln.rstrip().endswith(f" {NAME}_model"))
    section_index = line.split("]")[0].strip(" [")
    assert int(sym[2]) == size and sym[6] == section_index
    assert "2**4" in next(ln for ln in arm("objdump", "-h", obj).splitlines() if " nn_model " in ln)
    arm("objcopy", "-O", "binary", "--only-section=nn_model", obj, tmp_path / "model.bin")
    assert (tmp_path / "model.bin").read_bytes() == vela_model(run_dir).read_bytes()


def test_header_is_usable_from_cpp(arm_gcc, bundle, tmp_path):
    src = tmp_path / "use.cpp"
    src.write_text(
        f'#include "{NAME}_golden.h"\n'
        f"int first() {{ return {NAME}_model[4] + {NAME}_golden_output_0[0][0] + {NAME}_golden_argmax[1]; }}\n"
        f"int centred(int q) {{ return q - DSCNN_MLPERF_OUTPUT_0_ZERO_POINT; }}\n"
        f"static_assert(sizeof({NAME}_labels) / sizeof({NAME}_labels[0]) == DSCNN_MLPERF_NUM_LABELS, \"labels\");\n"
    )
    arm("g++", "-mcpu=cortex-m55", "-mthumb", "-O2", "-std=c++17", f"-I{bundle}", "-c", src, "-o", tmp_path / "use.o")
    undefined = arm("nm", "-u", tmp_path / "use.o")
    assert f"{NAME}_model" in undefined.split() and f"{NAME}_golden_output_0" in undefined.split()  # C linkage


# --------------------------------------------------------------------------- CMake


TOOLCHAIN = """\
set(CMAKE_SYSTEM_NAME Generic)
set(CMAKE_SYSTEM_PROCESSOR arm)
set(CMAKE_C_COMPILER arm-none-eabi-gcc)
set(CMAKE_TRY_COMPILE_TARGET_TYPE STATIC_LIBRARY)
set(CMAKE_C_FLAGS_INIT "-mcpu=cortex-m55 -mthumb")
"""


@pytest.fixture(scope="module")
def cmake():
    if shutil.which("cmake") is None:
        pytest.skip("cmake not installed (apt-get install cmake)")
    return "cmake"


def cmake_configure(cmake, src: Path, build: Path) -> subprocess.CompletedProcess:
    args = [cmake, "-S", str(src), "-B", str(build)]
    if shutil.which(ARM_GCC):
        (src / "toolchain.cmake").write_text(TOOLCHAIN)
        args.append(f"-DCMAKE_TOOLCHAIN_FILE={src / 'toolchain.cmake'}")
    return subprocess.run(args, capture_output=True, text=True)


def cmake_build(cmake, build: Path) -> subprocess.CompletedProcess:
    return subprocess.run([cmake, "--build", str(build)], capture_output=True, text=True)


def test_add_subdirectory_builds_the_library(cmake, bundle, tmp_path):
    src = tmp_path / "proj"
    src.mkdir()
    (src / "CMakeLists.txt").write_text(
        "cmake_minimum_required(VERSION 3.18)\nproject(fw C)\n"
        f'add_subdirectory("{bundle}" model)\n'
        "add_library(app STATIC app.c)\n"
        f"target_link_libraries(app PRIVATE edgedeploy::{NAME} edgedeploy::{NAME}_golden)\n"
    )
    (src / "app.c").write_text(f'#include "{NAME}_golden.h"\nint app(void) {{ return {NAME}_model[0] + {NAME}_golden_argmax[0]; }}\n')
    configured = cmake_configure(cmake, src, tmp_path / "build")
    assert configured.returncode == 0, configured.stdout + configured.stderr
    built = cmake_build(cmake, tmp_path / "build")
    assert built.returncode == 0, built.stdout + built.stderr
    assert list((tmp_path / "build" / "model").glob(f"libedgedeploy_{NAME}.a"))
    assert list((tmp_path / "build" / "model").glob(f"libedgedeploy_{NAME}_golden.a"))


def test_edgedeploy_add_model_regenerates_when_settings_or_model_change(cmake, bundle, run_dir, tmp_path):
    src = tmp_path / "proj"
    src.mkdir()
    body = (
        "cmake_minimum_required(VERSION 3.18)\nproject(fw C)\n"
        f'include("{bundle}/edgedeploy.cmake")\n'
        f'edgedeploy_add_model(TARGET kws RUN_DIR "{run_dir}" LEAF {NAME} NPU {BOARD} NAME kws_model SECTION_ARG)\n'
        "add_library(app STATIC app.c)\ntarget_link_libraries(app PRIVATE kws)\n"
    )
    (src / "CMakeLists.txt").write_text(body.replace(" SECTION_ARG", ""))
    (src / "app.c").write_text('#include "kws_model.h"\nint app(void) { return kws_model_model[0] + KWS_MODEL_TENSOR_ARENA_SIZE; }\n')
    build = tmp_path / "build"
    configured = cmake_configure(cmake, src, build)
    assert configured.returncode == 0, configured.stdout + configured.stderr
    first = cmake_build(cmake, build)
    assert first.returncode == 0, first.stdout + first.stderr
    assert "edgedeploy: exporting" in first.stdout
    header = build / "edgedeploy" / "kws" / "kws_model.h"
    assert '#define KWS_MODEL_MODEL_SECTION "nn_model"' in header.read_text()
    assert "edgedeploy: exporting" not in cmake_build(cmake, build).stdout  # nothing changed: nothing regenerated
    (src / "CMakeLists.txt").write_text(body.replace("SECTION_ARG", "SECTION .rodata.kws"))
    assert cmake_configure(cmake, src, build).returncode == 0
    changed = cmake_build(cmake, build)
    assert changed.returncode == 0 and "edgedeploy: exporting" in changed.stdout
    assert '#define KWS_MODEL_MODEL_SECTION ".rodata.kws"' in header.read_text()
    os.utime(vela_model(run_dir))  # a newer compiled model
    assert "edgedeploy: exporting" in cmake_build(cmake, build).stdout


# --------------------------------------------------------------------------- the sample HIL test


def run_hil(test_dir: Path, bundle: Path, *more: str) -> subprocess.CompletedProcess:
    args = pytest_argv("-q", str(test_dir), "--edgedeploy-bundle", str(bundle), *more)
    return subprocess.run(args, capture_output=True, text=True, cwd=test_dir)


def test_sample_hil_test_passes_against_the_host_reference(bundle):
    proc = run_hil(REPO / "examples" / "hil", bundle)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "9 passed" in proc.stdout  # 8 golden cases + the top-1 test


def test_qemu_device_without_its_tools_says_so_in_one_line(bundle, tmp_path):
    """No TFLM tree (or no toolchain): each test errors with one line naming the fix, not a traceback."""
    proc = run_hil(REPO / "examples" / "hil", bundle, "--edgedeploy-device", "qemu", "--edgedeploy-tflm-dir", str(tmp_path))
    assert proc.returncode == 1 and "9 errors" in proc.stdout, proc.stdout[-3000:]
    assert "Traceback" not in proc.stdout and "ToolMissingError" not in proc.stdout, proc.stdout[-3000:]
    lines = {line for line in proc.stdout.splitlines() if line.startswith("--edgedeploy-device qemu: ")}
    assert len(lines) == 1, proc.stdout[-3000:]
    tools = ("arm-none-eabi-gcc", "cmake", "qemu-system-arm")
    if all(shutil.which(t) for t in tools):  # else the first missing tool is named
        assert "--edgedeploy-tflm-dir" in lines.pop()


def test_sample_hil_test_fails_on_a_one_element_change(bundle, tmp_path):
    hil = tmp_path / "hil"
    hil.mkdir()
    shutil.copy(REPO / "examples" / "hil" / "test_device.py", hil)
    (hil / "conftest.py").write_text(
        "import pytest\n"
        "from edgedeploy.hil.testing import host_reference_transport\n\n"
        "@pytest.fixture(scope='session')\n"
        "def device(golden_bundle):\n"
        "    real = host_reference_transport(golden_bundle)\n"
        "    first = golden_bundle[0].input_bytes()\n"
        "    def changed(data):\n"
        "        out = bytearray(real(data))\n"
        "        if data == first:\n"
        "            out[5] = (out[5] + 1) % 256  # one element of one case, one step\n"
        "        return bytes(out)\n"
        "    return changed\n"
    )
    proc = run_hil(hil, bundle)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "1 failed, 8 passed" in proc.stdout
    assert "case0-down" in proc.stdout and "1 of 12 output elements differ by more than 0" in proc.stdout
    assert re.search(r"\s0\s+\[5\]\s+-?\d+\s+-?\d+\s+1\n", proc.stdout), proc.stdout


def test_hil_without_a_bundle_skips_with_a_reason():
    args = pytest_argv("-q", "-rs", str(REPO / "examples" / "hil"))
    env = {k: v for k, v in os.environ.items() if k != "EDGEDEPLOY_BUNDLE"}
    proc = subprocess.run(args, capture_output=True, text=True, env=env)
    assert proc.returncode == 0 and "2 skipped" in proc.stdout
    assert "pass --edgedeploy-bundle FWDIR" in proc.stdout


# --------------------------------------------------------------------------- bad input


def test_unknown_leaf_lists_the_variants(run_dir, tmp_path):
    result = cli("export", run_dir, "--leaf", "pruned", "--target", BOARD, "--out", tmp_path / "fw")
    assert result.exit_code == 2
    assert "has no variant 'pruned'" in result.stderr and NAME in result.stderr
    assert not (tmp_path / "fw").exists()


def test_target_not_compiled_lists_the_compiled_ones(run_dir, tmp_path):
    result = cli("export", run_dir, "--target", "ethos-u85-256", "--out", tmp_path / "fw")
    assert result.exit_code == 4
    assert "ethos-u55-128, corstone-300-u55-128" in result.stderr and "edgedeploy compile" in result.stderr


def test_two_targets_need_a_target(run_dir, tmp_path):
    result = cli("export", run_dir, "--out", tmp_path / "fw")
    assert result.exit_code == 2 and "pass --target" in result.stderr


def test_missing_compiled_model_names_the_command(run_dir, tmp_path):
    copy = tmp_path / "run"
    shutil.copytree(run_dir, copy)
    vela_model(copy).unlink()
    result = cli("export", copy, "--target", BOARD, "--out", tmp_path / "fw")
    assert result.exit_code == 3
    assert "is missing" in result.stderr and "edgedeploy compile" in result.stderr and f"-t {BOARD}" in result.stderr


def test_not_a_run_folder(tmp_path):
    result = cli("export", tmp_path, "--target", BOARD, "--out", tmp_path / "fw")
    assert result.exit_code == 3 and "manifest.json" in result.stderr


def test_golden_without_data(run_dir, tmp_path):
    result = cli("export", run_dir, "--target", BOARD, "--out", tmp_path / "fw", "--golden", 4)
    assert result.exit_code == 2 and "--data" in result.stderr


def test_folder_with_other_files_needs_force_and_keeps_them(run_dir, tmp_path):
    fw = tmp_path / "fw"
    fw.mkdir()
    (fw / "main.c").write_text("int main(void) { return 0; }\n")
    result = cli("export", run_dir, "--target", BOARD, "--out", fw, "--golden", 0)
    assert result.exit_code == 2 and "main.c" in result.stderr and "--force" in result.stderr
    assert sorted(p.name for p in fw.iterdir()) == ["main.c"]
    result = cli("export", run_dir, "--target", BOARD, "--out", fw, "--golden", 0, "--force")
    assert result.exit_code == 0, result.output
    assert (fw / "main.c").read_text() == "int main(void) { return 0; }\n"
    assert (fw / f"{NAME}.c").is_file()
    result = cli("export", run_dir, "--target", BOARD, "--out", fw, "--golden", 0, "--force", "--name", "main")
    assert result.exit_code == 2 and "would overwrite" in result.stderr
    assert (fw / "main.c").read_text() == "int main(void) { return 0; }\n"


def test_reexport_into_own_folder_replaces_it(run_dir, kws, tmp_path):
    fw = tmp_path / "fw"
    assert cli("export", run_dir, "--target", BOARD, "--out", fw, "--data", kws["data"], "--golden", 2).exit_code == 0
    assert (fw / "golden.npz").exists()
    assert cli("export", run_dir, "--target", BOARD, "--out", fw, "--golden", 0).exit_code == 0
    assert not (fw / "golden.npz").exists() and not (fw / f"{NAME}_golden.c").exists()


def test_a_second_export_into_one_folder_waits_for_the_first_and_says_so(run_dir, tmp_path):
    from edgedeploy.export import BUNDLE_SCHEMA
    from edgedeploy.core.files import lock_run_dir, release_run_dirs

    fw = tmp_path / "fw"
    lock_run_dir(fw)  # as an export writing the folder holds it
    err_path = tmp_path / "err.txt"
    with err_path.open("w") as err:
        p = subprocess.Popen([sys.executable, "-m", "edgedeploy", "export", str(run_dir), "--target", BOARD,
                              "--out", str(fw), "--golden", "0", "--name", "second"],
                             stdout=subprocess.DEVNULL, stderr=err, text=True, env={**os.environ, "NO_COLOR": "1"})
    try:
        for _ in range(6000):
            if "waiting" in err_path.read_text() or p.poll() is not None:
                break
            time.sleep(0.05)
        assert p.poll() is None, err_path.read_text()  # still waiting, nothing written
        assert "is being written by another edgedeploy command; waiting for it to finish" in err_path.read_text()
        assert not (fw / "second.c").exists()
        # the first export finishes its bundle while the second waits
        (fw / "first.c").write_text("/* first */\n")
        first = hashlib.sha256((fw / "first.c").read_bytes()).hexdigest()  # what that export wrote, recorded
        (fw / "manifest.json").write_text(json.dumps({"schema": BUNDLE_SCHEMA, "files": {"first.c": {"sha256": first}}}))
    finally:
        release_run_dirs()
    p.wait(timeout=300)
    assert p.returncode == 0, err_path.read_text()
    # the second saw the first's bundle as an earlier export and replaced it whole: no mix of the two
    names = sorted(n.name for n in fw.iterdir() if n.name != ".edgedeploy.lock")
    assert "first.c" not in names and "second.c" in names and "second.h" in names
    assert set(json.loads((fw / "manifest.json").read_text())["files"]) == set(names) - {"manifest.json"}


def test_a_clean_export_prints_no_tflite_notice_on_stderr(run_dir, kws, tmp_path):
    done = subprocess.run([sys.executable, "-m", "edgedeploy", "export", str(run_dir), "--target", BOARD, "--out",
                           str(tmp_path / "fw"), "--data", str(kws["data"]), "--golden", "2"],
                          capture_output=True, text=True, env={**os.environ, "NO_COLOR": "1"}, timeout=300)
    assert done.returncode == 0, done.stderr
    assert "XNNPACK" not in done.stderr and "INFO:" not in done.stderr, done.stderr
