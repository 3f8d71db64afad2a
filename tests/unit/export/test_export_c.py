"""Firmware export without TensorFlow or Vela: C text, defines, attributes, CMake, data selection, the output folder."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import zipfile

import numpy as np
import pytest

from edgedeploy import export as ex
from edgedeploy.errors import InvalidInputError, UsageError
from edgedeploy.tflite.reader import TensorInfo

INT8_IN = TensorInfo("input_1", (1, 49, 10, 1), "int8", (0.5847029089927673,), (83,))
INT8_OUT = TensorInfo("Identity", (1, 12), "int8", (0.00390625,), (-128,))
FLOAT_IN = TensorInfo("input", (1, 490), "float32", (), ())


def spec(**kw) -> ex.BundleSpec:
    base = dict(
        name="kws", leaf="dscnn", target="corstone-300-u55-128", accelerator_config="ethos-u55-128",
        section="nn_model", alignment=16, model_size=40, model_sha256="ab" * 32, vela_version="5.2.0",
        memory_mode="Shared_Sram", vela_sram_bytes=22192, vela_dram_bytes=0, runtime_margin_bytes=16384,
        tensor_arena_bytes=ex.arena_size(22192, 16384), fast_memory_bytes=None, inputs=(INT8_IN,),
        outputs=(INT8_OUT,), labels=("yes", 'say "no"'),
    )  # fmt: skip
    base.update(kw)
    return ex.BundleSpec(**base)


# --------------------------------------------------------------------------- literals


@pytest.mark.parametrize(
    "value", [0.00390625, 1.0, -2.0, 0.5847029089927673, 1e-10, 3.0e38, 123456.78, -7.5e-5, 0.1]
)
def test_c_float_round_trips_as_float32(value):
    text = ex.c_float(value)
    assert text.endswith("f")
    body = text[:-1]
    assert re.fullmatch(r"-?\d+\.\d+(e[-+]?\d+)?|-?\d+(\.\d+)?e[-+]?\d+", body), text  # valid C, never "1f"
    assert np.float32(float(body)) == np.float32(value)


def test_c_float_rejects_non_finite():
    with pytest.raises(InvalidInputError):
        ex.c_float(float("nan"))


def test_c_float_known_spellings():
    assert ex.c_float(0.00390625) == "0.00390625f"
    assert ex.c_float(1) == "1.0f"


def test_negative_integers_are_parenthesized_for_macros():
    assert ex.c_int(-128) == "(-128)"
    assert ex.c_int(83) == "83"


def test_c_string_escapes():
    assert ex.c_string('a"b\\c') == '"a\\"b\\\\c"'
    assert ex.c_string("??=") == '"\\077\\077="'  # no trigraph
    assert ex.c_string("é") == '"\\303\\251"'  # UTF-8 bytes as octal escapes
    assert ex.c_string("line\n") == '"line\\012"'


def test_c_bytes_formats_every_byte_twelve_per_line():
    data = bytes(np.random.default_rng(1).integers(0, 256, size=100, dtype=np.uint8))
    text = ex.c_bytes(data)
    lines = text.splitlines()
    assert len(lines) == 9  # ceil(100 / 12)
    assert all(line.startswith("    0x") and line.endswith(",") for line in lines)
    assert all(len(line.split()) == 12 for line in lines[:-1]) and len(lines[-1].split()) == 4
    assert bytes(int(h, 16) for h in re.findall(r"0x([0-9a-f]{2}),", text)) == data


def test_c_numbers_ints_and_floats():
    assert ex.c_numbers([1, -2, 3], "int8_t", per_line=2) == "    1, -2,\n    3,"
    assert ex.c_numbers([0.5, 1.0], "float") == "    0.5f, 1.0f,"


# --------------------------------------------------------------------------- attributes, sizes, names


def test_model_attribute_alignment_and_section():
    assert ex.model_attribute("nn_model") == '__attribute__((aligned(16), section("nn_model")))'
    assert ex.model_attribute(".rodata.nn_model", 64) == '__attribute__((aligned(64), section(".rodata.nn_model")))'
    with pytest.raises(UsageError):
        ex.model_attribute("nn_model", 24)
    with pytest.raises(UsageError):
        ex.model_attribute('nn"model')


@pytest.mark.parametrize(
    "planned, margin, expected", [(22192, 16384, 38576), (1, 0, 16), (0, 0, 0), (100, 5, 112), (16, 16, 32)]
)
def test_arena_size_adds_margin_and_rounds_to_16(planned, margin, expected):
    assert ex.arena_size(planned, margin) == expected


def test_names_and_sections():
    assert ex.check_c_name("kws_model") == "kws_model"
    for bad in ("9x", "a-b", "int", "", "x" * 64, "__x", "_Model", "_kws"):
        with pytest.raises(UsageError):
            ex.check_c_name(bad)
    assert ex.default_name("pruned-clustered") == "pruned_clustered"
    assert ex.default_name("8bit") == "m_8bit"
    assert ex.check_c_name(ex.default_name("_x")) == "m_x"
    assert ex.check_c_name(ex.default_name("int")) == "m_int"
    assert ex.check_section("$nn.model_1") == "$nn.model_1"
    for bad in ("a b", "", "x;y"):
        with pytest.raises(UsageError):
            ex.check_section(bad)


def test_resolve_section_board_default_and_override():
    board = {"name": "b", "memory": {"model_section": "nn_model"}}
    assert ex.resolve_section(None, board)[0] == "nn_model"
    assert ex.resolve_section(None, {"name": "n", "memory": None}) == (ex.DEFAULT_SECTION, "edgedeploy default for NPU-only targets")
    assert ex.resolve_section("my_sec", board) == ("my_sec", "--section")


# --------------------------------------------------------------------------- defines and files


def test_tensor_defines_quantized_int8():
    lines = ex.tensor_defines("KWS", "INPUT", 0, INT8_IN)
    text = "\n".join(lines)
    assert "#define KWS_INPUT_0_DIMS {1, 49, 10, 1}" in text
    assert "#define KWS_INPUT_0_ELEMENTS 490" in text
    assert "#define KWS_INPUT_0_BYTES 490" in text
    assert "#define KWS_INPUT_0_CTYPE int8_t" in text
    assert "#define KWS_INPUT_0_SCALE 0.5847029f" in text
    assert "#define KWS_INPUT_0_ZERO_POINT 83" in text
    out = "\n".join(ex.tensor_defines("KWS", "OUTPUT", 0, INT8_OUT))
    assert "#define KWS_OUTPUT_0_ZERO_POINT (-128)" in out


def test_tensor_defines_float_has_no_scale():
    text = "\n".join(ex.tensor_defines("M", "INPUT", 0, FLOAT_IN))
    assert "#define M_INPUT_0_QUANTIZED 0" in text
    assert "#define M_INPUT_0_BYTES 1960" in text  # 490 float32
    assert "SCALE" not in text and "ZERO_POINT" not in text


def test_unsupported_tensor_type_is_refused():
    with pytest.raises(InvalidInputError, match="int4"):
        ex.c_type_of("int4")


def test_header_has_guards_extern_c_and_sizes():
    h = ex.render_model_header(spec())
    assert h.count("#ifdef __cplusplus") == 2 and 'extern "C" {' in h
    assert "#ifndef EDGEDEPLOY_KWS_H" in h and h.rstrip().endswith("#endif /* EDGEDEPLOY_KWS_H */")
    assert "#define KWS_MODEL_SIZE 40u" in h
    assert "#define KWS_MODEL_ALIGNMENT 16" in h
    assert '#define KWS_MODEL_SECTION "nn_model"' in h
    assert "#define KWS_TENSOR_ARENA_SIZE 38576u" in h
    assert "#define KWS_VELA_SRAM_BYTES 22192u" in h and "#define KWS_RUNTIME_MARGIN_BYTES 16384u" in h
    assert '#define KWS_LABELS {"yes", "say \\"no\\""}' in h
    assert "extern const uint8_t kws_model[KWS_MODEL_SIZE];" in h
    assert "extern const char *const kws_labels[KWS_NUM_LABELS];" in h
    assert "FAST_MEMORY" not in h


def test_header_dedicated_sram_gives_fast_memory():
    h = ex.render_model_header(spec(memory_mode="Dedicated_Sram_384KB", fast_memory_bytes=22048, vela_dram_bytes=31600))
    assert "#define KWS_FAST_MEMORY_SIZE 22048u" in h
    assert "#define KWS_VELA_DRAM_BYTES 31600u" in h


def test_source_places_model_in_section_and_checks_size():
    model = bytes(range(40))
    c = ex.render_model_source(spec(), model)
    assert 'const uint8_t kws_model[KWS_MODEL_SIZE] __attribute__((aligned(16), section("nn_model"))) = {' in c
    assert '#include "kws.h"' in c
    assert "const char *const kws_labels[KWS_NUM_LABELS] = KWS_LABELS;" in c
    assert bytes(int(h, 16) for h in re.findall(r"0x([0-9a-f]{2}),", c)) == model
    with pytest.raises(InvalidInputError):
        ex.render_model_source(spec(), model + b"x")


def test_no_timestamps_in_generated_text():
    s = spec()
    golden = ex.GoldenSet(
        inputs=(np.zeros((2, 49, 10, 1), np.int8),), outputs=(np.zeros((2, 12), np.int8),),
        argmax=np.zeros(2, np.int32), label=np.array([0, -1], np.int32), row=np.array([3, 4]),
    )  # fmt: skip
    texts = [
        ex.render_model_header(s), ex.render_model_source(s, bytes(40)), ex.render_golden_header(s, golden, "ref"),
        ex.render_golden_source(s, golden), ex.render_cmakelists(s, True), ex.render_cmake_module("/x/bin"),
    ]  # fmt: skip
    for t in texts:
        assert not re.search(r"20\d\d-\d\d-\d\d|\d\d:\d\d:\d\d", t)


def test_golden_source_shapes():
    s = spec()
    golden = ex.GoldenSet(
        inputs=(np.arange(2 * 490).reshape(2, 49, 10, 1).astype(np.int8),),
        outputs=(np.array([[1] * 12, [-3] * 12], np.int8),),
        argmax=np.array([0, 5], np.int32), label=np.array([0, -1], np.int32), row=np.array([3, 4]),
    )  # fmt: skip
    h = ex.render_golden_header(s, golden, "TFLM reference")
    assert "#define KWS_GOLDEN_COUNT 2" in h and '#include "kws.h"' in h
    assert "extern const KWS_INPUT_0_CTYPE kws_golden_input_0[KWS_GOLDEN_COUNT][KWS_INPUT_0_ELEMENTS];" in h
    c = ex.render_golden_source(s, golden)
    body = c.split("kws_golden_output_0")[1].split("};")[0]
    assert re.findall(r"-?\d+(?=,)", body) == ["1"] * 12 + ["-3"] * 12
    assert "kws_golden_label[KWS_GOLDEN_COUNT] = {\n    0, -1,\n};" in c


def test_cmakelists_and_module():
    cm = ex.render_cmakelists(spec(), True)
    assert "add_library(edgedeploy_kws STATIC ${CMAKE_CURRENT_SOURCE_DIR}/kws.c)" in cm
    assert "add_library(edgedeploy::kws ALIAS edgedeploy_kws)" in cm
    assert "edgedeploy::kws_golden" in cm
    assert "golden" not in ex.render_cmakelists(spec(), False).split("\n", 2)[2]
    mod = ex.render_cmake_module("/venv/bin")
    assert "function(edgedeploy_add_model)" in mod
    assert 'find_program(EDGEDEPLOY_EXECUTABLE edgedeploy HINTS "/venv/bin"' in mod
    assert re.search(r"add_custom_command\(\s*OUTPUT \$\{outputs\}.*DEPENDS \$\{deps\} \"\$\{stamp\}\"", mod, re.S)
    for arg in ("TARGET", "RUN_DIR", "LEAF", "NPU", "NAME", "SECTION"):
        assert arg in mod.split("cmake_parse_arguments", 1)[1].split("\n", 1)[0]


# --------------------------------------------------------------------------- data: selection and quantization


def test_select_cases_takes_each_class_in_turn():
    y = np.array([2, 2, 0, 1, 0, 2, 1, 1])
    assert ex.select_cases(y, 3) == [2, 3, 0]  # first of class 0, 1, 2
    assert ex.select_cases(y, 6) == [2, 3, 0, 4, 6, 1]
    assert sorted(ex.select_cases(y, 100)) == list(range(len(y)))  # more than there are: every row once
    assert ex.select_cases(y, 0) == []


def test_quantize_rounds_half_away_from_zero_and_clamps():
    x = np.array([0.5, -0.5, 1.5, 2.5, -2.5, 200.0, -200.0, 0.49], np.float32)
    assert ex.quantize(x, 1.0, 0, "int8").tolist() == [1, -1, 2, 3, -3, 127, -128, 0]
    assert ex.quantize(np.array([0.0, 1.0]), 0.5, 83, "int8").tolist() == [83, 85]
    assert ex.quantize(np.array([-1.0]), 1.0, 0, "uint8").tolist() == [0]
    q = ex.quantize(np.array([0.3]), 0.1, -128, "int8")
    assert q.dtype == np.int8 and ex.dequantize(q, 0.1, -128)[0] == pytest.approx(0.3, abs=1e-6)


def test_npz_bytes_is_deterministic_and_loadable(tmp_path):
    arrays = {"a": np.arange(6, dtype=np.int8).reshape(2, 3), "labels": np.array(["yes", "no"])}
    one, two = ex.npz_bytes(arrays), ex.npz_bytes(dict(arrays))
    assert one == two
    (tmp_path / "g.npz").write_bytes(one)
    with np.load(tmp_path / "g.npz", allow_pickle=False) as npz:
        assert npz["a"].tolist() == [[0, 1, 2], [3, 4, 5]] and npz["labels"].tolist() == ["yes", "no"]
    with zipfile.ZipFile(tmp_path / "g.npz") as zf:
        assert {i.date_time for i in zf.infolist()} == {(1980, 1, 1, 0, 0, 0)}


def test_compare_outputs_counts_differences():
    a = [np.array([[1, 2, 3], [4, 5, 6]], np.int8)]
    b = [np.array([[1, 2, 5], [4, 5, 6]], np.int8)]
    r = ex.compare_outputs(a, b)
    assert r["max_abs_diff"] == 2 and r["elements_differing"] == 1 and r["fraction_differing"] == pytest.approx(1 / 6)
    assert r["argmax_agreement"] == 1.0


# --------------------------------------------------------------------------- the output folder


def bundle_manifest(files: dict[str, bytes]) -> str:
    import hashlib

    return json.dumps({"schema": ex.BUNDLE_SCHEMA,
                       "files": {f: {"sha256": hashlib.sha256(b).hexdigest()} for f, b in files.items()}})


def test_out_dir_new_empty_and_own(tmp_path):
    assert ex.inspect_out_dir(tmp_path / "new").exists is False
    (tmp_path / "empty").mkdir()
    assert ex.inspect_out_dir(tmp_path / "empty").foreign == []
    own = tmp_path / "own"
    own.mkdir()
    (own / "m.c").write_text("x")
    (own / "manifest.json").write_text(bundle_manifest({"m.c": b"x"}))
    state = ex.inspect_out_dir(own)
    assert state.foreign == [] and state.owned == {"m.c", "manifest.json"}
    (own / "m.c").write_text("changed since")  # no longer what the export wrote: not ours to replace
    assert ex.inspect_out_dir(own).foreign == ["m.c"]


def test_out_dir_foreign_files_refused_unless_force_and_never_deleted(tmp_path):
    out = tmp_path / "fw"
    out.mkdir()
    (out / "main.c").write_text("int main(void) { return 0; }\n")
    (out / "old.c").write_text("x")
    (out / "manifest.json").write_text(bundle_manifest({"old.c": b"x"}))
    state = ex.inspect_out_dir(out)
    assert state.foreign == ["main.c"]
    with pytest.raises(UsageError, match="main.c"):
        ex._write_bundle(out, {"m.c": b"1", "manifest.json": b"{}"}, state, force=False)
    ex._write_bundle(out, {"m.c": b"1", "manifest.json": b"{}"}, state, force=True)
    assert (out / "main.c").read_text() == "int main(void) { return 0; }\n"  # left as it was
    assert (out / "m.c").read_bytes() == b"1"
    assert not (out / "old.c").exists()  # an earlier export's file that is no longer part of the bundle
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no staging folder left behind


def test_out_dir_force_never_overwrites_a_foreign_file(tmp_path):
    out = tmp_path / "fw"
    out.mkdir()
    (out / "m.c").write_text("mine")
    state = ex.inspect_out_dir(out)
    with pytest.raises(UsageError, match="would overwrite"):
        ex._write_bundle(out, {"m.c": b"1", "manifest.json": b"{}"}, state, force=True)
    assert (out / "m.c").read_text() == "mine"


def test_out_dir_that_is_a_file(tmp_path):
    (tmp_path / "f").write_text("x")
    with pytest.raises(UsageError, match="is a file"):
        ex.inspect_out_dir(tmp_path / "f")


def test_replacing_an_earlier_bundle(tmp_path):
    out = tmp_path / "fw"
    ex._write_bundle(out, {"a.c": b"1", "manifest.json": bundle_manifest({"a.c": b"1"}).encode()}, ex.inspect_out_dir(out), False)
    ex._write_bundle(out, {"b.c": b"2", "manifest.json": bundle_manifest({"b.c": b"2"}).encode()}, ex.inspect_out_dir(out), False)
    assert sorted(p.name for p in out.iterdir()) == ["b.c", "manifest.json"]


# --------------------------------------------------------------------------- import cost


def test_export_and_testing_modules_do_not_import_tensorflow():
    code = (
        "import sys, edgedeploy.export, edgedeploy.hil.testing, edgedeploy.cli.export;"
        "print(sorted(m for m in ('tensorflow', 'tflite_micro', 'ethosu') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_cpu_path_in_header_source_and_cmake():
    cpu = ex.CpuModel(size=24, sha256="cd" * 32, tensor_arena_bytes=ex.arena_size(24272, 16384), host_arena_bytes=24272)
    s = spec(cpu=cpu)
    h = ex.render_model_header(s)
    assert "#define KWS_CPU_MODEL_SIZE 24u" in h and "#define KWS_CPU_TENSOR_ARENA_SIZE 40656u" in h
    assert "extern const uint8_t kws_cpu_model[KWS_CPU_MODEL_SIZE];" in h
    assert "host TFLM interpreter's arena total (24272 bytes)" in h
    c = ex.render_cpu_source(s, bytes(range(24)))
    assert "const uint8_t kws_cpu_model[KWS_CPU_MODEL_SIZE] __attribute__((aligned(16), section(\"nn_model\")))" in c
    assert "${CMAKE_CURRENT_SOURCE_DIR}/kws.c ${CMAKE_CURRENT_SOURCE_DIR}/kws_cpu.c)" in ex.render_cmakelists(s, True)
    assert "CPU" not in ex.render_model_header(spec()) and "kws_cpu.c" not in ex.render_cmakelists(spec(), True)
    with pytest.raises(InvalidInputError):
        ex.render_cpu_source(s, bytes(23))


@pytest.mark.skipif(shutil.which("gcc") is None, reason="no host gcc to compile the headers")
def test_bundles_whose_names_differ_only_in_case_both_declare_their_model(tmp_path):
    # C is case-sensitive: bundles `kws` and `KWS` are two models; one translation unit includes both headers
    for name in ("kws", "KWS"):
        (tmp_path / f"{name}.h").write_text(ex.render_model_header(spec(name=name)))
        g = ex.GoldenSet(inputs=(np.zeros((1, 49, 10, 1), np.int8),), outputs=(np.zeros((1, 12), np.int8),),
                         argmax=np.zeros(1, np.int32), label=np.zeros(1, np.int32), row=np.zeros(1, np.int64))
        (tmp_path / f"{name}_golden.h").write_text(ex.render_golden_header(spec(name=name), g, "ref"))
    (tmp_path / "main.c").write_text(
        '#include "kws.h"\n#include "KWS.h"\n#include "kws_golden.h"\n#include "KWS_golden.h"\n'
        "const void *both[] = {kws_model, KWS_model, kws_golden_input_0, KWS_golden_input_0};\n"
    )
    done = subprocess.run(["gcc", "-std=c99", "-Wall", "-Werror", "-fsyntax-only", "main.c"], cwd=tmp_path,
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert ex.guard_name("kws") == "EDGEDEPLOY_KWS_H"  # lower-case names keep their guard text (same bytes as before)
    assert len({ex.guard_name(n, s) for n in ("kws", "KWS", "Kws") for s in ("H", "GOLDEN_H")}) == 6
