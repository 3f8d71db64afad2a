"""`edgedeploy verify` and `compile --verify`: Vela's real output on the functional NPU model against TFLite's
reference kernels; a damaged command or weight stream is caught and named."""

from __future__ import annotations

import hashlib
import json
import struct
import time
from pathlib import Path

import pytest

from helpers import invoke_cli as cli, write_int8_tflite

TARGET = "ethos-u55-128"
VELA = Path("compile") / "dscnn_mlperf" / TARGET / "model_int8_vela.tflite"
U85 = "ethos-u85-256"
U85_VELA = Path("compile") / "dscnn_mlperf" / U85 / "model_int8_vela.tflite"


@pytest.fixture(scope="module")
def kws(shared_data):
    return {"model": shared_data / "kws" / "dscnn_mlperf_int8.tflite",
            "data": shared_data / "kws" / "speech_commands_v2_test_mfcc_mlperf.npz"}


@pytest.fixture(scope="module")
def compiled(kws, tmp_path_factory):
    run = tmp_path_factory.mktemp("npu") / "run"
    result = cli("compile", kws["model"], "-t", TARGET, "-o", run, "--verify")
    assert result.exit_code == 0, result.output
    assert "bit-exact on 8 cases" in result.output
    return run


def _copy_with(run: Path, dest: Path, change, vela: Path = VELA) -> Path:
    import shutil

    shutil.copytree(run, dest)
    path = dest / vela
    data = bytearray(path.read_bytes())
    change(data)
    path.write_bytes(data)
    manifest = json.loads((dest / "manifest.json").read_text())
    for stage in manifest["stages"]:
        for out in stage["outputs"]:
            if out["path"] == str(vela):
                out["sha256"], out["bytes"] = hashlib.sha256(data).hexdigest(), len(data)
    (dest / "manifest.json").write_text(json.dumps(manifest))
    return dest


def test_dscnn_is_bit_exact_on_evaluation_data(compiled, kws):
    result = cli("verify", compiled, "-t", TARGET, "--data", kws["data"], "--count", 6, "--json")
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert doc["status"] == "bit-exact" and doc["exact_cases"] == 6
    assert doc["operations"] == {"DMA": 11, "CONV": 7, "DEPTHWISE": 4, "POOL": 3, "ELEMENTWISE": 26}


def test_damaged_weights_are_named(compiled, kws, tmp_path):
    run = _copy_with(compiled, tmp_path / "damaged", _damage_weights(compiled))
    result = cli("verify", run, "-t", TARGET, "--data", kws["data"], "--count", 6)
    assert result.exit_code == 12, result.output
    # Vela, run again with its debug database, maps the operation to the TFLite operator and Keras layers
    assert "first at NPU operation 7 (CONV, word 174), which Vela compiled from TFLite operator 2 CONV_2D" in \
        result.output
    assert "Keras layers activation_2, batch_normalization_2, conv2d_1" in result.output


def _damage_weights(run: Path, vela: Path = VELA, count: int = 40):
    from edgedeploy.npu.leaf_layout import read_leaf

    weights = read_leaf(run / vela).weights

    def damage(data: bytearray) -> None:
        start = data.find(weights[:64])
        for i in range(start + 6000, start + 6000 + count):
            data[i] ^= 0x5A

    return damage


def test_a_compile_with_its_debug_database_names_the_operator_from_it(kws, tmp_path, monkeypatch):
    from edgedeploy.npu import verify

    run = tmp_path / "run"
    assert cli("compile", kws["model"], "-t", TARGET, "-o", run, "--debug-db").exit_code == 0
    monkeypatch.setattr(verify, "recompiled_tables", lambda *a: pytest.fail("Vela was run again"))
    damaged = _copy_with(run, tmp_path / "damaged", _damage_weights(run))
    result = cli("verify", damaged, "-t", TARGET, "--count", 4)
    assert result.exit_code == 12, result.output
    assert "which Vela compiled from TFLite operator 2 CONV_2D" in result.output


def test_damaged_command_stream_is_named(compiled, tmp_path):
    from edgedeploy.npu.leaf_layout import read_leaf

    words = read_leaf(compiled / VELA).commands

    def damage(data: bytearray) -> None:
        start = data.find(struct.pack("<4I", *words[:4]))
        data[start : start + 4] = struct.pack("<I", 0x3EE)  # no such command

    run = _copy_with(compiled, tmp_path / "damaged", damage)
    result = cli("verify", run, "-t", TARGET)
    assert result.exit_code == 11, result.output
    assert "word 0 is an unknown command 0x3ee" in result.output


def test_an_ethos_u85_leaf_is_bit_exact_and_damaged_weights_are_named(kws, tmp_path):
    run = tmp_path / "u85"
    result = cli("compile", kws["model"], "-t", U85, "-o", run, "--verify")  # compile --verify takes U85 leaves
    assert result.exit_code == 0, result.output
    assert "bit-exact on 8 cases" in result.output and U85 in result.output
    result = cli("verify", run, "-t", U85, "--data", kws["data"], "--count", 6, "--json")
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert doc["status"] == "bit-exact" and doc["exact_cases"] == 6 and doc["npu"] == U85
    assert doc["operations"] == {"DMA": 12, "CONV": 7, "DEPTHWISE": 4, "POOL": 3, "ELEMENTWISE": 25}
    damaged = _copy_with(run, tmp_path / "damaged", _damage_weights(run, U85_VELA, count=1), U85_VELA)  # one byte
    result = cli("verify", damaged, "-t", U85, "--data", kws["data"], "--count", 6)
    assert result.exit_code == 12, result.output
    assert "first at NPU operation" in result.output and "which Vela compiled from TFLite operator" in result.output
    assert "Keras layers" in result.output


def test_changed_model_is_refused(compiled, tmp_path):
    import shutil

    run = tmp_path / "changed"
    shutil.copytree(compiled, run)
    data = bytearray((run / VELA).read_bytes())
    data[-1] ^= 1
    (run / VELA).write_bytes(bytes(data))
    result = cli("verify", run, "-t", TARGET)
    assert result.exit_code == 3 and "changed after compile" in result.output


@pytest.mark.slow
@pytest.mark.requires_data("ic/resnet8_mlperf_int8.tflite", "ic/cifar10_jpeg_subset.npz")
@pytest.mark.parametrize("optimise", ["Performance", "Size"])
def test_hundred_cases_on_four_npus(shared_data, tmp_path, optimise):
    run = tmp_path / "run"
    targets = ["ethos-u55-128", "ethos-u55-256", "ethos-u65-256", "ethos-u65-512"]
    models = {"dscnn_mlperf": (shared_data / "kws" / "dscnn_mlperf_int8.tflite",
                               shared_data / "kws" / "speech_commands_v2_test_mfcc_mlperf.npz"),
              "resnet8_mlperf": (shared_data / "ic" / "resnet8_mlperf_int8.tflite",
                                 shared_data / "ic" / "cifar10_jpeg_subset.npz")}
    args = [m for m, _ in models.values()]
    for t in targets:
        args += ["-t", t]
    assert cli("compile", *args, "-o", run, "--optimise", optimise).exit_code == 0
    for leaf, (_, data) in models.items():
        for t in targets:
            t0 = time.perf_counter()
            result = cli("verify", run, "--leaf", leaf, "-t", t, "--data", data, "--count", 100, "--json")
            seconds = time.perf_counter() - t0
            assert result.exit_code == 0, result.output
            doc = json.loads(result.stdout)
            assert doc["status"] in ("bit-exact", "documented-difference")
            assert doc["exact_cases"] + doc["documented_cases"] == 100
            assert seconds < 60, f"{leaf} on {t}: {seconds:.1f} s"


@pytest.mark.requires_data("kws/ds_cnn_s_arm_int8.tflite", "kws/speech_commands_v2_test_mfcc_arm.npz")
def test_cpu_operators_run_on_tflite(shared_data, tmp_path):
    run = tmp_path / "arm"
    model = shared_data / "kws" / "ds_cnn_s_arm_int8.tflite"
    assert cli("compile", model, "-t", TARGET, "-o", run, "--allow-cpu-ops").exit_code == 0
    no_data = cli("verify", run)
    assert no_data.exit_code == 2 and "takes float32 input" in no_data.output
    result = cli("verify", run, "--data", shared_data / "kws" / "speech_commands_v2_test_mfcc_arm.npz", "-n", 5,
                 "--json")
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["status"] == "bit-exact"


def test_a_mismatch_vela_cannot_map_says_why(compiled, kws, tmp_path, monkeypatch):
    from edgedeploy.npu import verify

    monkeypatch.setattr(verify, "recompiled_tables", lambda *a: (None, "target ethos-u55-128 changed since the "
                                                                         "compile; compile with --debug-db"))
    damaged = _copy_with(compiled, tmp_path / "damaged", _damage_weights(compiled))
    result = cli("verify", damaged, "-t", TARGET, "--count", 4)
    assert result.exit_code == 12, result.output
    assert ("first at NPU operation 7 (CONV, word 174) (no TFLite operator named: target ethos-u55-128 changed "
            "since the compile; compile with --debug-db)") in result.output


# A squeeze-and-excitation gate: GLOBAL average, Dense + relu, Dense + sigmoid, the input times the gate. Vela fuses
# the int8 LOGISTIC into the second Dense's convolution as a lookup table (on the U85, split by output depth in
# two), so TFLite's FULLY_CONNECTED rounding difference first shows at the LOGISTIC's output.
SE_SHAPE = (8, 8, 64)


@pytest.fixture(scope="module")
def se_gate(tmp_path_factory):
    from edgedeploy.keras import tfenv

    t = tfenv.load()
    keras, L = t.keras, t.keras.layers
    keras.utils.set_random_seed(0)
    inp = keras.Input(SE_SHAPE)
    gate = L.Dense(64, activation="sigmoid")(L.Dense(16, activation="relu")(L.GlobalAveragePooling2D()(inp)))
    folder = tmp_path_factory.mktemp("se")
    write_int8_tflite(keras.Model(inp, L.Multiply()([inp, L.Reshape((1, 1, 64))(gate)])), folder / "se.tflite")
    run = folder / "run"
    assert cli("compile", folder / "se.tflite", "-t", TARGET, "-t", U85, "-o", run).exit_code == 0
    return run


@pytest.mark.parametrize("target", [TARGET, U85])
def test_the_fully_connected_difference_through_a_fused_sigmoid_is_documented(se_gate, target):
    result = cli("verify", se_gate, "-t", target, "--count", 40, "--json")
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert doc["status"] == "documented-difference", doc
    assert doc["exact_cases"] + doc["documented_cases"] == 40 and doc["documented_cases"] >= 1
    assert any("fuses the LOGISTIC" in note and "through the table" in note for note in doc["documented"]), doc


def test_a_changed_sigmoid_table_is_still_a_mismatch(se_gate, tmp_path):
    from edgedeploy.npu.commands import decode
    from edgedeploy.npu.leaf_layout import read_leaf
    from edgedeploy.npu.machine import INTERNAL

    vela = Path("compile") / "se" / TARGET / "model_int8_vela.tflite"
    leaf = read_leaf(se_gate / vela)
    table = next(op for op in decode(leaf.commands) if op.kind == "DMA" and op.reg("DMA0_DST_REGION") & INTERNAL)
    start = table.reg32("DMA0_SRC") & ((1 << 40) - 1)

    def damage(data: bytearray) -> None:
        at = data.find(leaf.weights[:64]) + start
        for i in range(at + 96, at + 160):  # the sigmoid's middle entries, one step up
            data[i] = (data[i] + 1) & 0xFF

    damaged = _copy_with(se_gate, tmp_path / "damaged", damage, vela)
    result = cli("verify", damaged, "-t", TARGET, "--count", 40)
    assert result.exit_code == 12, result.output
    assert "TFLite LOGISTIC" in result.output and "FULLY_CONNECTED" in result.output
