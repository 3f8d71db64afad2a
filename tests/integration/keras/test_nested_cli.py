"""The Keras 3 transfer-learning pattern (a keras.applications base called as a layer under a new head, saved as
.keras) through `edgedeploy optimize`, `compile`, `verify` and `export`, against its flat twin (input_tensor=)
with the same weights: one run of each per module, compared at every step. The commands run in this process, which
has TensorFlow and Keras 3 loaded already."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from helpers import infer, run_in_process
from zoo import settle_batch_norm

SIZE = 32  # the smallest input MobileNetV2 takes
TARGETS = ("ethos-u55-128", "ethos-u65-256", "ethos-u85-256")


def _head(L, x):
    x = L.GlobalAveragePooling2D(name="gap")(x)
    return L.Dense(10, activation="softmax", name="head")(x)


def _twins(keras, x, cut: str | None):
    """MobileNetV2 (alpha 0.35) nested in a Functional with a Rescaling input, and the same network built flat,
    with the same weights: random, but with the batch-norm statistics of the images ``x`` (with those of
    initialization the activations saturate and every image gets the same output). With ``cut``, the application
    ends at that layer in both: its first blocks as the Functional backbone a user takes from it."""
    L = keras.layers
    keras.utils.set_random_seed(3)
    inp = keras.Input((SIZE, SIZE, 3))
    base = keras.applications.MobileNetV2(input_shape=(SIZE, SIZE, 3), alpha=0.35, include_top=False, weights=None)
    if cut:
        base = keras.Model(base.input, base.get_layer(cut).output, name=base.name)
    nested = keras.Model(inp, _head(L, base(L.Rescaling(1 / 255, name="scale")(inp), training=False)),
                         name="classifier")
    settle_batch_norm(base, x / 255)
    inp = keras.Input((SIZE, SIZE, 3))
    twin = keras.applications.MobileNetV2(input_tensor=L.Rescaling(1 / 255, name="scale")(inp), alpha=0.35,
                                          include_top=False, weights=None)
    features = twin.get_layer(cut).output if cut else twin.output
    flat = keras.Model(inp, _head(L, features), name="classifier")  # the same scope in tensor names
    for layer in flat.layers:
        if layer.get_weights():
            source = nested if layer.name == "head" else base
            layer.set_weights(source.get_layer(layer.name).get_weights())
    return nested, flat


def _images(shared_data) -> tuple[np.ndarray, np.ndarray]:
    """64 fine-tune and 32 evaluation images: real CIFAR-10 (a seeded choice: the file is sorted by class) when
    the shared data has it, else seeded noise."""
    cifar = shared_data / "ic" / "cifar10_jpeg_subset.npz"
    rng = np.random.default_rng(4)
    if cifar.is_file():
        d = np.load(cifar)
        fit, ev = rng.choice(len(d["y_train"]), 64, replace=False), rng.choice(len(d["y_test"]), 32, replace=False)
        return (np.concatenate([d["x_train"][fit], d["x_test"][ev]]).astype("float32"),
                np.concatenate([d["y_train"][fit], d["y_test"][ev]]))
    return rng.integers(0, 256, (96, SIZE, SIZE, 3)).astype("float32"), rng.integers(0, 10, 96)


def _int8_outputs(model_path, x) -> np.ndarray:
    from edgedeploy.tflite.interpreter import make_interpreter

    interpreter = make_interpreter(model_path)
    inp, out = interpreter.get_input_details()[0], interpreter.get_output_details()[0]
    scale, zero = inp["quantization"]
    found = []
    for sample in x:
        interpreter.set_tensor(inp["index"], np.clip(np.round(sample / scale + zero), -128, 127).astype(np.int8)[None])
        interpreter.invoke()
        found.append(interpreter.get_tensor(out["index"])[0].copy())
    return np.array(found, dtype=np.int32)


# A tiny recipe for the ptq and QAT leaves: one step of fine-tuning, without a teacher or a validation split
TINY = ("--batch-size", "64", "--validation-fraction", "0", "--no-distill")


def _optimize(model: Path, data: Path, out: Path, leaves: str, *recipe: str) -> dict:
    proc = run_in_process("optimize", model, "--data", data, "--leaves", leaves, "-o", out, "--epochs", "1",
                          "--min-steps", "0", "--seed", "7", *recipe)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads((out / "manifest.json").read_text())


# Where the backbone ends: after the first inverted residual block (its convolution, batch-norm, ReLU6, depthwise
# and projection layers are the kinds of every later block), or the whole application (slow: seventeen times as many
# layers to build, train and convert). The later blocks' padding layers and Adds back to their input are the whole
# application's; in the default run a padding before a convolution goes through QAT in
# tests/integration/keras/test_input_affine.py, and nested blocks with an Add are flattened in test_flatten.py.
CUTS = [pytest.param("expanded_conv_project_BN", id="first_block"),
        pytest.param(None, id="whole", marks=pytest.mark.slow)]


@pytest.fixture(scope="module", params=CUTS)
def twins(request, shared_data, tmp_path_factory):
    """The nested model and its flat twin saved as .keras, the data file, and one `optimize` run (ptq, qat) of
    each."""
    from edgedeploy.keras import tfenv

    tfenv.load()  # TensorFlow with tf_keras as tf.keras first (the int8 outputs are read in this process)
    import keras  # Keras 3, as a user saves the model today

    tmp = tmp_path_factory.mktemp("nested")
    x, y = _images(shared_data)
    nested, flat = _twins(keras, x[:64], request.param)
    np.testing.assert_allclose(infer(nested, x[:8]), infer(flat, x[:8]), atol=1e-6)
    split = np.r_[np.zeros(64, int), np.ones(32, int)]
    np.savez(tmp / "d.npz", x=x, y=y, split=split)
    runs = {}
    for name, model in (("nested", nested), ("flat", flat)):
        model.save(tmp / f"{name}.keras")
        runs[name] = _optimize(tmp / f"{name}.keras", tmp / "d.npz", tmp / name, "ptq,qat", *TINY)
    return SimpleNamespace(tmp=tmp, data=tmp / "d.npz", evaluation=x[split == 1], manifests=runs,
                           base=nested.layers[2].name)


@pytest.fixture(scope="module")
def compiled(twins):
    """Both runs' leaves compiled for U55-128, U65-256 and U85-256: {run: {(leaf, target): compile record}}."""
    found = {}
    for name in ("nested", "flat"):
        proc = run_in_process("compile", twins.tmp / name, *[a for t in TARGETS for a in ("-t", t)])
        assert proc.returncode == 0, proc.stderr[-3000:]
        stages = json.loads((twins.tmp / name / "manifest.json").read_text())["stages"]
        found[name] = {(s["variant"], s["target"]): s for s in stages if s["stage"] == "compile"}
    return found


def _compiled_figures(record: dict) -> dict:
    """A compile record's measures of the compiled model (its timings differ from run to run)."""
    return {k: v["value"] for k, v in record["metrics"].items() if "seconds" not in k}


def test_a_nested_keras3_application_gives_the_int8_outputs_of_its_flat_twin(twins):
    runs = twins.manifests
    record = runs["nested"]["info"]["optimize"]["flattened"]
    assert record["models"] == [twins.base]  # mobilenetv2_0.35_32
    assert record["checked_on"] == "32 evaluation samples of d.npz" and record["max_abs_difference"] <= 1e-5
    assert "flattened" not in runs["flat"]["info"]["optimize"]
    baseline = next(s for s in runs["nested"]["stages"] if s["id"] == "optimize/baseline")
    assert baseline["details"]["flattened"] == record["models"]
    for leaf, lsb in (("ptq", 0), ("qat", 1)):
        got = _int8_outputs(twins.tmp / "nested" / "convert" / leaf / "model_int8.tflite", twins.evaluation)
        want = _int8_outputs(twins.tmp / "flat" / "convert" / leaf / "model_int8.tflite", twins.evaluation)
        assert np.ptp(want, axis=0).max() > 0  # the outputs differ from sample to sample
        assert np.abs(got - want).max() <= lsb, leaf
    # the flat graph is the twin's, name for name: the ptq leaf is the same file
    assert ((twins.tmp / "nested" / "convert" / "ptq" / "model_int8.tflite").read_bytes()
            == (twins.tmp / "flat" / "convert" / "ptq" / "model_int8.tflite").read_bytes())


def test_the_nested_model_compiles_as_its_flat_twin_on_three_npus(compiled):
    assert set(compiled["nested"]) == set(compiled["flat"]) == {(leaf, t) for leaf in ("ptq", "qat") for t in TARGETS}
    for key, flat in compiled["flat"].items():
        nested = compiled["nested"][key]
        assert flat["status"] == nested["status"] == "ok", key
        assert _compiled_figures(nested) == _compiled_figures(flat), key
        assert _compiled_figures(flat)["npu_cycles"] > 0
    ptq = compiled["flat"][("ptq", "ethos-u55-128")]
    assert _compiled_figures(compiled["flat"][("qat", "ethos-u55-128")])["npu_cycles"] <= 1.01 * _compiled_figures(
        ptq)["npu_cycles"]  # the Rescaling input costs the QAT leaf nothing either


def test_the_nested_model_verifies_as_its_flat_twin(twins, compiled):
    found = {}
    for name in ("nested", "flat"):
        proc = run_in_process("verify", twins.tmp / name, "--leaf", "ptq", "-t", "ethos-u55-128", "--data",
                              twins.data, "--json")
        assert proc.returncode == 0, proc.stderr[-3000:]
        found[name] = json.loads(proc.stdout)
    assert found["flat"]["status"] == "bit-exact", found["flat"]
    for doc in found.values():
        del doc["seconds"]
    assert found["nested"] == found["flat"]


def test_the_nested_model_exports_the_golden_vectors_of_its_flat_twin(twins, compiled):
    bundles = {}
    for name in ("nested", "flat"):
        fw = twins.tmp / f"fw_{name}"
        proc = run_in_process("export", twins.tmp / name, "--leaf", "ptq", "-t", "ethos-u55-128", "-o", fw,
                              "--golden", 4)
        assert proc.returncode == 0, proc.stderr[-3000:]
        bundles[name] = {p.relative_to(fw).as_posix(): p.read_bytes() for p in fw.rglob("*")
                         if p.is_file() and p.name != "manifest.json"}
    assert sorted(bundles["nested"]) == sorted(bundles["flat"])
    golden = [n for n in bundles["flat"] if "golden" in n]
    assert golden, sorted(bundles["flat"])
    for rel in bundles["flat"]:
        assert bundles["nested"][rel] == bundles["flat"][rel], rel


@pytest.mark.slow
@pytest.mark.parametrize("twins", [None], ids=["whole"], indirect=True)  # every inverted residual block
def test_the_thinned_leaf_of_the_nested_model_is_its_flat_twins(twins):
    """The thinned branch on the flattened graph: the same channel groups (the inverted residuals' project
    layers tied across their Adds), the same widths, the same int8 outputs and NPU cycles."""
    found = {}
    for name in ("nested", "flat"):
        out = twins.tmp / f"thin_{name}"
        _optimize(twins.tmp / f"{name}.keras", twins.data, out, "thinned")
        proc = run_in_process("compile", out, "-t", "ethos-u55-128")
        assert proc.returncode == 0, proc.stderr[-3000:]
        stages = {s["id"]: s for s in json.loads((out / "manifest.json").read_text())["stages"]}
        found[name] = {"optimize": stages["optimize/thinned"], "compile": stages["compile/thinned/ethos-u55-128"]}
    thinning = {name: found[name]["optimize"]["details"]["thinning"] for name in found}
    for key in ("full_widths", "coupled", "not_thinned", "widths", "kernel_channels"):
        assert thinning["nested"][key] == thinning["flat"][key], key
    assert any("project" in " ".join(producers) for producers in thinning["flat"]["coupled"].values())
    assert thinning["flat"]["npu"]["met"]  # within thin_speedup of ptq on U55-128
    assert thinning["nested"]["npu"]["cycles_vs_ptq"] == thinning["flat"]["npu"]["cycles_vs_ptq"]
    got = _int8_outputs(twins.tmp / "thin_nested" / "convert" / "thinned" / "model_int8.tflite", twins.evaluation)
    want = _int8_outputs(twins.tmp / "thin_flat" / "convert" / "thinned" / "model_int8.tflite", twins.evaluation)
    assert np.ptp(want, axis=0).max() > 0 and np.abs(got - want).max() <= 1
    assert _compiled_figures(found["nested"]["compile"]) == _compiled_figures(found["flat"]["compile"])
