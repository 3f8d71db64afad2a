"""A bundle's manifest is read back as input: every name, file and section checked before C, CMake or a path."""

from __future__ import annotations

import copy
import re
import json

import pytest

from edgedeploy.errors import InvalidInputError
from edgedeploy.export.bundle import cmake_path, read_bundle_manifest
from edgedeploy.core.manifest import Artifact, Manifest

SHA = "ab" * 32
GOOD = {
    "schema": "edgedeploy.firmware",
    "name": "kws",
    "files": {n: {"sha256": SHA, "bytes": 1} for n in
              ("kws.c", "kws.h", "kws_cpu.c", "kws_int8.tflite", "golden.npz", "CMakeLists.txt")},
    "model": {"c_source": "kws.c", "c_header": "kws.h", "section": ".rodata.nn_model"},
    "cpu_model": {"c_source": "kws_cpu.c", "model": "kws_int8.tflite"},
    "golden": {"count": 2, "npz": "golden.npz", "reference": {"model": "kws_int8.tflite"}},
    "inputs": [{"name": "in", "shape": [1, 49, 10, 1], "dtype": "int8", "scale": [0.5], "zero_point": [-128]}],
    "outputs": [{"name": "out", "shape": [1, 12], "dtype": "int8", "scale": [0.0039], "zero_point": [-128]}],
    "labels": ["yes", "no"],
}


def _set(d, dotted, value):
    keys = dotted.split(".")
    for k in keys[:-1]:
        d = d[int(k)] if isinstance(d, list) else d[k]
    if isinstance(d, list):
        d[int(keys[-1])] = value
    else:
        d[keys[-1]] = value


HOSTILE = [
    ("name", "kws\")\nexecute_process(COMMAND touch /tmp/pwned)\n#"),
    ("name", "x" * 100),
    ("name", "int"),
    ("name", 7),
    ("model.c_source", "../../etc/passwd"),
    ("model.c_source", "/etc/passwd"),
    ("model.c_header", "not_listed.h"),
    ("model.section", ".text\n} > FLASH"),
    ("model.section", "../x"),
    ("cpu_model.model", "/tmp/other.tflite"),
    ("golden.npz", "/home/user/secret.npz"),
    ("golden.npz", "sub/golden.npz"),
    ("golden.count", -1),
    ("golden.count", "2"),
    ("golden.reference.model", "../int8.tflite"),
    ("inputs.0.shape", [1, -49]),
    ("inputs.0.shape", [1 << 20, 1 << 20]),
    ("inputs.0.shape", "1x49"),
    ("inputs.0.dtype", "float64; rm -rf"),
    ("outputs.0.scale", [float("nan")]),
    ("outputs", []),
    ("labels", "yes,no"),
    ("files", ["kws.c"]),
]


def _write(tmp_path, manifest) -> None:
    (tmp_path / "manifest.json").write_text(json.dumps(manifest))


def test_a_bundle_export_writes_is_read(tmp_path):
    _write(tmp_path, GOOD)
    assert read_bundle_manifest(tmp_path)["name"] == "kws"


@pytest.mark.parametrize(("key", "value"), HOSTILE, ids=[f"{k}={str(v)[:20]!r}" for k, v in HOSTILE])
def test_a_hostile_manifest_value_is_one_error_naming_its_key(tmp_path, key, value):
    bad = copy.deepcopy(GOOD)
    _set(bad, key, value)
    _write(tmp_path, bad)
    with pytest.raises(InvalidInputError) as err:
        read_bundle_manifest(tmp_path)
    line = err.value.one_line()
    assert "\n" not in line and len(line) < 400 and key.split(".")[0] in line


def test_a_file_name_in_files_that_leaves_the_bundle_is_refused(tmp_path):
    bad = copy.deepcopy(GOOD)
    bad["files"]["../../x"] = {"sha256": SHA}
    _write(tmp_path, bad)
    with pytest.raises(InvalidInputError, match="plain file name"):
        read_bundle_manifest(tmp_path)


def test_a_manifest_that_is_a_fifo_is_refused_without_blocking(tmp_path):
    import os

    os.mkfifo(tmp_path / "manifest.json")
    with pytest.raises(InvalidInputError, match="FIFO"):
        read_bundle_manifest(tmp_path)


@pytest.mark.parametrize("name", ['a"b', "a\nb", "a$b", "a;b", "a\\b", "a@b"])
def test_a_path_cmake_would_read_as_syntax_is_refused(tmp_path, name):
    with pytest.raises(InvalidInputError, match="CMake"):
        cmake_path(tmp_path / name, "the bundle folder")
    assert cmake_path(tmp_path / "plain dir", "the bundle folder").endswith("plain dir")


@pytest.mark.parametrize("recorded", ["/etc/passwd", "../outside.tflite", "compile/../../x", "", "link/model.tflite"])
def test_a_run_manifest_path_outside_the_run_folder_is_refused(tmp_path, recorded):
    run = tmp_path / "run"
    run.mkdir()
    (tmp_path / "elsewhere").mkdir()
    (run / "link").symlink_to(tmp_path / "elsewhere")
    manifest = Manifest(run)
    with pytest.raises(InvalidInputError, match="outside the run folder"):
        manifest.resolve(Artifact("vela_model", recorded, SHA, 1))
    assert manifest.resolve(Artifact("vela_model", "compile/v/t/m.tflite", SHA, 1)) == run / "compile/v/t/m.tflite"


@pytest.mark.parametrize(("key", "value"), [
    ("id", "compile/../../etc/ethos-u55-128"), ("id", "/abs/compile"), ("variant", "<script>alert(1)</script>"),
    ("variant", "a/b"), ("target", "ethos u55\n128"), ("parent", "convert/.."), ("id", 7)])
def test_a_run_manifest_record_with_a_name_that_is_not_checked_is_damaged(tmp_path, key, value):
    record = {"id": "compile/v/ethos-u55-128", "stage": "compile", "status": "ok", "variant": "v",
              "target": "ethos-u55-128", "parent": "import/v", key: value}
    (tmp_path / "manifest.json").write_text(json.dumps(
        {"schema": "edgedeploy.manifest", "schema_version": 1, "stages": [record]}))
    with pytest.raises(InvalidInputError, match="damaged") as err:
        Manifest.load(tmp_path)
    assert "\n" not in err.value.one_line()


def _bundle_with_files(tmp_path):
    import hashlib

    files = {"kws.c": b"const int x;\n", "golden.npz": b"PK\x03\x04"}
    manifest = {"files": {n: {"sha256": hashlib.sha256(b).hexdigest(), "bytes": len(b)} for n, b in files.items()}}
    for name, data in files.items():
        (tmp_path / name).write_bytes(data)
    return manifest


@pytest.mark.parametrize(("change", "names", "why"), [
    (lambda d: (d / "kws.c").write_bytes(b"const int y;\n"), None,
     "kws.c was changed after `edgedeploy export` wrote it"),
    (lambda d: (d / "golden.npz").unlink(), None, "golden.npz is missing"),
    (lambda d: ((d / "kws.c").rename(d / "real.c"), (d / "kws.c").symlink_to("real.c")), None, "kws.c is a link"),
    (None, ["other.c"], "'other.c' is not a file"),
    (None, [["kws.c"]], "is not a file"),
])
def test_a_bundle_file_is_checked_against_the_manifest(tmp_path, change, names, why):
    from edgedeploy.export.bundle import check_bundle_files

    manifest = _bundle_with_files(tmp_path)
    check_bundle_files(tmp_path, manifest)  # as written: accepted
    if change is not None:
        change(tmp_path)
    with pytest.raises(InvalidInputError, match=re.escape(why)) as err:
        check_bundle_files(tmp_path, manifest, names)
    assert "\n" not in err.value.one_line() and "export the bundle again" in err.value.one_line()
