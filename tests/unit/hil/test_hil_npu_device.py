"""``--edgedeploy-device npu`` without the NPU model running: the option, the bundle's ``model.tflite`` key, the
compiled model file checked as input, and the bundles the device refuses (each in one line)."""

from __future__ import annotations

import argparse
import json
import os

import pytest

from edgedeploy.errors import EdgeDeployError, InvalidInputError, NpuModelError
from edgedeploy.export.bundle import read_bundle_file, read_bundle_manifest
from edgedeploy.core.files import sha256_bytes
from edgedeploy.hil import testing as hil
from edgedeploy.hil.npu_device import bundle_target, npu_bundle_transport, npu_device

VELA = b"TFL3 not a real model, only bytes with a hash"  # never run here: every case is refused before the model
SHA = sha256_bytes(VELA)


def manifest(**target) -> dict:
    """A bundle manifest as export writes it (no golden vectors), its compiled model in kws_vela.tflite."""
    files = {"kws.c": b"c", "kws.h": b"h", "kws_vela.tflite": VELA}
    return {
        "schema": "edgedeploy.firmware",
        "name": "kws",
        "target": {"name": "ethos-u55-128", "npu_family": "ethos-u55", "accelerator_config": "ethos-u55-128", **target},
        "model": {"c_source": "kws.c", "c_header": "kws.h", "tflite": "kws_vela.tflite", "sha256": SHA,
                  "section": ".rodata.nn_model"},
        "inputs": [{"name": "in", "shape": [1, 4], "dtype": "int8", "scale": [0.5], "zero_point": [0]}],
        "outputs": [{"name": "out", "shape": [1, 3], "dtype": "int8", "scale": [0.25], "zero_point": [0]}],
        "golden": {"count": 0},
        "files": {n: {"sha256": sha256_bytes(b), "bytes": len(b)} for n, b in files.items()},
    }


def write(folder, m: dict, vela: bytes | None = VELA):
    folder.mkdir(parents=True, exist_ok=True)
    for name, data in (("kws.c", b"c"), ("kws.h", b"h")):
        (folder / name).write_bytes(data)
    if vela is not None:
        (folder / "kws_vela.tflite").write_bytes(vela)
    (folder / "manifest.json").write_text(json.dumps(m))
    return folder


# --------------------------------------------------------------------------- the option


@pytest.mark.parametrize("value", ["npu", "host", "qemu", "serial:/dev/ttyACM0@115200"])
def test_the_device_option_takes_npu_beside_the_others(value):
    assert hil._device_option(value) == value


@pytest.mark.parametrize("value", ["NPU", "npu:0", "ethos-u55", ""])
def test_a_device_that_is_not_one_of_them_lists_npu_among_the_choices(value):
    with pytest.raises(argparse.ArgumentTypeError, match=r"choose from host, qemu, npu, serial:PORT\[@BAUD\]"):
        hil._device_option(value)


# --------------------------------------------------------------------------- the manifest key and the file


def test_the_compiled_model_key_is_read_back(tmp_path):
    assert read_bundle_manifest(write(tmp_path, manifest()))["model"]["tflite"] == "kws_vela.tflite"


def test_a_bundle_exported_before_the_key_is_still_read(tmp_path):
    m = manifest()
    del m["model"]["tflite"]
    assert "tflite" not in read_bundle_manifest(write(tmp_path, m))["model"]


@pytest.mark.parametrize("value", ["../kws_vela.tflite", "/etc/passwd", "sub/kws_vela.tflite", "unlisted.tflite", 7])
def test_a_hostile_compiled_model_name_is_one_error_naming_the_key(tmp_path, value):
    m = manifest()
    m["model"]["tflite"] = value
    with pytest.raises(InvalidInputError) as err:
        read_bundle_manifest(write(tmp_path, m))
    line = err.value.one_line()
    assert "model.tflite" in line and "\n" not in line


def test_the_compiled_model_file_is_read_when_it_holds_what_the_manifest_records(tmp_path):
    folder = write(tmp_path, manifest())
    assert read_bundle_file(folder, read_bundle_manifest(folder), "kws_vela.tflite", "compiled model") == VELA


@pytest.mark.parametrize("damage", ["altered", "missing", "link", "fifo", "folder"])
def test_a_compiled_model_file_that_is_not_what_export_wrote_is_refused(tmp_path, damage):
    folder = write(tmp_path / "fw", manifest(), vela=None)
    path = folder / "kws_vela.tflite"
    if damage == "altered":
        path.write_bytes(VELA[:-1] + b"!")
    elif damage == "link":
        (tmp_path / "elsewhere.tflite").write_bytes(VELA)
        path.symlink_to(tmp_path / "elsewhere.tflite")
    elif damage == "fifo":
        os.mkfifo(path)
    elif damage == "folder":
        path.mkdir()
    with pytest.raises(InvalidInputError) as err:
        read_bundle_file(folder, read_bundle_manifest(folder), "kws_vela.tflite", "compiled model")
    line = err.value.one_line()
    assert "kws_vela.tflite" in line and "\n" not in line
    words = {"altered": "was changed after `edgedeploy export` wrote it", "missing": "is missing",
             "link": "is a link, not the file that was written", "fifo": "is not a regular file",
             "folder": "is not a regular file"}[damage]
    assert line.startswith(f"compiled model {path} {words}"), line  # the shared check's one message shape
    assert "manifest.json records sha256 " in line and "export the bundle again" in line


def test_a_file_the_manifest_does_not_list_is_not_read(tmp_path):
    folder = write(tmp_path, manifest())
    with pytest.raises(InvalidInputError, match="not listed"):
        read_bundle_file(folder, read_bundle_manifest(folder), "kws.cpp", "compiled model")


# --------------------------------------------------------------------------- what the npu device refuses


def test_the_target_comes_from_the_manifest():
    bundle = hil.GoldenBundle(None, manifest(), (), (), None)  # type: ignore[arg-type]
    assert bundle_target(bundle) == ("ethos-u55-128", "ethos-u55")
    bundle.manifest["target"] = {"name": "ethos-u85-256", "accelerator_config": "ethos-u85-256"}
    assert bundle_target(bundle) == ("ethos-u85-256", "ethos-u85")
    bundle.manifest["target"] = "ethos-u55-128"  # not a table: nothing read from it
    assert bundle_target(bundle) == ("an unrecorded target", "unknown")


def test_a_bundle_of_another_npu_is_refused_before_its_model_is_read(tmp_path):
    bundle = hil.load_bundle(write(tmp_path, manifest(name="arm-other-1", npu_family="arm-other"), vela=None))
    with pytest.raises(NpuModelError, match=r"compiled for arm-other-1 \(arm-other\); the NPU functional model "
                                            r"covers the Ethos-U55, Ethos-U65 and Ethos-U85"):
        npu_bundle_transport(bundle)


def test_an_ethos_u85_bundle_passes_the_family_check(tmp_path):
    """A U85 bundle gets past the family check to its compiled model file (here missing)."""
    bundle = hil.load_bundle(write(tmp_path, manifest(name="ethos-u85-256", npu_family="ethos-u85"), vela=None))
    with pytest.raises(EdgeDeployError, match=r"kws_vela.tflite is missing") as err:
        npu_bundle_transport(bundle)
    assert "covers the" not in str(err.value)


def test_a_bundle_exported_before_the_file_was_shipped_is_told_to_export_again(tmp_path):
    m = manifest()
    del m["model"]["tflite"]
    bundle = hil.load_bundle(write(tmp_path, m, vela=None))
    with pytest.raises(InvalidInputError) as err:
        npu_bundle_transport(bundle)
    line = err.value.one_line()
    assert str(tmp_path) in line and "kws_vela.tflite" in line and "export the bundle again" in line


def test_a_compiled_model_other_than_the_c_arrays_is_refused(tmp_path):
    m = manifest()
    m["model"]["sha256"] = "ab" * 32  # the file matches the files table, not the model the C array holds
    bundle = hil.load_bundle(write(tmp_path, m))
    with pytest.raises(InvalidInputError) as err:
        npu_bundle_transport(bundle)
    line = err.value.one_line()
    assert "kws_vela.tflite was changed after the C array was made from it" in line, line
    assert f"manifest.json (model.sha256, the C array's model) records sha256 {'ab' * 8}" in line


def test_the_fixture_side_fails_in_one_line_naming_the_option(tmp_path):
    bundle = hil.load_bundle(write(tmp_path, manifest(name="ethos-u85-256", npu_family="ethos-u85"), vela=None))
    with pytest.raises(pytest.fail.Exception) as err:
        npu_device(bundle)
    assert err.value.pytrace is False
    assert str(err.value).startswith("--edgedeploy-device npu: ") and "\n" not in str(err.value)


def test_an_altered_compiled_model_fails_the_fixture_in_one_line(tmp_path):
    bundle = hil.load_bundle(write(tmp_path, manifest(), vela=VELA + b"x"))
    with pytest.raises(pytest.fail.Exception, match=r"^--edgedeploy-device npu: compiled model .*kws_vela.tflite "
                                                    r"was changed after `edgedeploy export` wrote it"):
        npu_device(bundle)


def test_a_setting_the_model_does_not_implement_fails_the_running_test_in_one_line(tmp_path):
    """A real run-time refusal: the recorded DS-CNN stream with its first activation set to TANH."""
    import struct
    from pathlib import Path

    import numpy as np

    from edgedeploy.hil.npu_device import failing_in_one_line
    from edgedeploy.npu.leaf_layout import read_leaf
    from edgedeploy.npu.transport import npu_transport

    recorded = Path(__file__).resolve().parents[2] / "data" / "npu" / "dscnn_u55_128_vela.npz"
    words = read_leaf(recorded).commands
    with np.load(recorded, allow_pickle=False) as npz:
        arrays = {}
        for k in npz.files:
            try:
                arrays[k] = npz[k]
            except ValueError:  # object arrays: not needed to run the stream
                continue
    payload = bytearray(arrays["cmd_data"].tobytes())
    start = payload.find(struct.pack("<4I", *words[:4]))
    first = next(i for i, w in enumerate(words) if w & 0xFFFF == 0x125)  # NPU_SET_ACTIVATION
    payload[start + 4 * first : start + 4 * first + 4] = struct.pack("<I", 0x125 | (3 << 16))  # TANH
    arrays["cmd_data"] = np.frombuffer(bytes(payload), np.uint8)
    damaged = tmp_path / "damaged_vela.npz"
    np.savez(damaged, **arrays)
    device = failing_in_one_line(npu_transport(damaged))
    with pytest.raises(pytest.fail.Exception) as err:
        device(b"\0" * 490)
    assert err.value.pytrace is False
    line = str(err.value)
    assert line.startswith("--edgedeploy-device npu: ") and "activation TANH is not modelled" in line
    assert failing_in_one_line(npu_transport(recorded))(b"\0" * 490)  # the undamaged stream answers
