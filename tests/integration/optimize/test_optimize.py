"""The deployment tree on the real MLPerf DS-CNN with real Speech Commands features (few epochs).

The DS-CNN's tree is the run's shared one (``trained_tree``, tests/integration/conftest.py: the bundled example's
900 fine-tune and 400 evaluation clips, 2 epochs), whose leaves are a representative set of the default ones; the
slow run trains the others (qat, pqat, cqat) on a copy of it and checks them the same way. The tests of other
model shapes run their own trees on small committed float models (tests/data/models/make_models.py).

Sparsity and cluster counts are checked here independently of edgedeploy's own preservation table: on the
int8 kernels read straight from each leaf's .tflite, and on the Keras kernels of the saved node models.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from helpers import TREE_LEAVES, input_models, one_error_line, run_cli, run_in_process

from edgedeploy.config.recipe import Recipe, load_recipe
from edgedeploy.tflite.reader import read_tflite, read_weight_tensors

LEAVES = Recipe().leaves  # the default leaves (the palette-aware ones are asked for by name)

pytestmark = pytest.mark.requires_data

SPARSITY, CLUSTERS = 0.5, 16
# the ptq leaf of each tree this module trains itself calibrates on this many fine-tune samples (the recipe's default
# is 500): these trees check kernels, operators and refusals, not the calibration
CALIBRATION = 64


@pytest.fixture(scope="session")
def kws_data(shared_data, tmp_path_factory, stratified) -> Path:
    """The real fine-tune split cut to 1,536 clips (to keep training short; a seeded class-balanced choice, as the
    file is sorted by class) and the whole evaluation split."""
    d = np.load(shared_data / "kws" / "speech_commands_v2_test_mfcc_mlperf.npz")
    fit = np.sort(stratified(np.where(d["split"] == 0)[0], d["y"], 1536, seed=0))
    ev = np.where(d["split"] == 1)[0]
    idx = np.concatenate([fit, ev])
    path = tmp_path_factory.mktemp("kws") / "kws.npz"
    np.savez(path, x=d["x"][idx], y=d["y"][idx], split=d["split"][idx], labels=d["labels"])
    return path


@pytest.fixture(scope="session")
def small_kws(shared_data, tmp_path_factory, stratified) -> Path:
    """512 fine-tune and 256 evaluation clips (seeded, class-balanced): for tests of a tree's structure (kernels,
    operators), which need trained models, not accurate figures, and of a command's outcome (a refusal, a leaf
    built)."""
    d = np.load(shared_data / "kws" / "speech_commands_v2_test_mfcc_mlperf.npz")
    idx = np.concatenate([np.sort(stratified(np.where(d["split"] == s)[0], d["y"], n, seed=0))
                          for s, n in ((0, 512), (1, 256))])
    path = tmp_path_factory.mktemp("kws-small") / "kws_small.npz"
    np.savez(path, x=d["x"][idx], y=d["y"][idx], split=d["split"][idx], labels=d["labels"])
    return path


@pytest.fixture(scope="module")
def kws_tree(trained_tree):
    """The shared tree, at this module's sparsity and cluster count."""
    assert (trained_tree.settings["sparsity"], trained_tree.settings["clusters"]) == (SPARSITY, CLUSTERS)
    return trained_tree.outcome


# the leaves the shared tree does not hold: quantization-aware training, as its pcqat leaf's (which also preserves
# pruning and clusters), alone or preserving one of the two, and the palette leaf; checked in the slow run
OTHER_LEAVES = [leaf for leaf in (*LEAVES, "pcqat_palette") if leaf not in TREE_LEAVES]


@pytest.fixture(scope="module")
def full_tree(trained_tree, tmp_path_factory):
    """Every default leaf: :data:`OTHER_LEAVES` trained on a copy of the shared tree (its stages reused)."""
    from edgedeploy.pipeline.driver import drive
    from edgedeploy.pipeline.run_plan import Plan

    run = trained_tree.copy(tmp_path_factory.mktemp("full-tree") / "run")
    recipe = trained_tree.recipe(leaves=[*trained_tree.outcome.leaves, *OTHER_LEAVES])
    return drive(Plan(trained_tree.model, trained_tree.data, run, recipe)).tree


def _leaf_param(leaf):
    return pytest.param(leaf, marks=pytest.mark.slow) if leaf in OTHER_LEAVES else leaf


def _tree_of(request, kws_tree, leaf):
    """The tree that holds ``leaf``: the shared one, or (for :data:`OTHER_LEAVES`) :func:`full_tree`."""
    return request.getfixturevalue("full_tree") if leaf in OTHER_LEAVES else kws_tree


PRUNED_LEAVES = [_leaf_param(leaf) for leaf in ("pruned", "pqat", "pruned_clustered", "pcqat")]
CLUSTERED_LEAVES = [_leaf_param(leaf) for leaf in ("clustered", "pruned_clustered")]


def _int8_kernels(outcome, leaf):
    path = outcome.run_dir / outcome.leaves[leaf].output("int8_model").path
    return {t.name: (t.op, t.values(), t.quantized_dimension) for t in read_weight_tensors(path)}


@pytest.mark.parametrize("leaf", [_leaf_param(leaf) for leaf in [*LEAVES, "pcqat_palette"]])
def test_every_leaf_is_a_full_int8_model(request, kws_tree, leaf):
    tree = _tree_of(request, kws_tree, leaf)
    rec = tree.leaves[leaf]
    model = read_tflite(tree.run_dir / rec.output("int8_model").path)
    assert model.is_integer(), leaf
    assert model.inputs[0].dtype == "int8" and model.outputs[0].dtype == "int8", leaf
    assert model.inputs[0].shape[0] == 1, "fixed batch size 1"
    assert rec.metric("gzip_bytes") < rec.metric("tflite_bytes")
    assert rec.details["calibration"] is None or "fine-tune split" in rec.details["calibration"]


@pytest.mark.parametrize("leaf", PRUNED_LEAVES)
def test_pruned_leaves_keep_sparsity_in_int8(request, kws_tree, leaf):
    kernels = _int8_kernels(_tree_of(request, kws_tree, leaf), leaf)
    checked = 0
    for name, (op, values, _) in kernels.items():
        if op in ("CONV_2D", "FULLY_CONNECTED"):
            assert np.mean(values == 0) >= SPARSITY - 0.02, (leaf, name, np.mean(values == 0))
            checked += 1
    assert checked == 6  # 5 Conv2D + 1 Dense in the DS-CNN


@pytest.mark.parametrize("leaf", CLUSTERED_LEAVES)
def test_clustered_leaves_have_at_most_16_values_per_kernel(request, kws_tree, leaf):
    from edgedeploy.keras import tfenv

    keras = tfenv.load().keras
    tree = _tree_of(request, kws_tree, leaf)
    node = tree.nodes[leaf]
    model = keras.models.load_model(tree.run_dir / node.outputs[0].path, compile=False)
    counted = 0
    for layer in model.layers:
        if type(layer).__name__ in ("Conv2D", "Dense"):
            kernel = layer.get_weights()[0]
            assert len(np.unique(kernel)) <= CLUSTERS + (1 if "pruned" in leaf else 0), (leaf, layer.name)
            counted += 1
    assert counted == 6
    # int8: per-channel scales may spread the values of a tensor, but each output channel keeps <= 16
    for name, (op, values, qdim) in _int8_kernels(tree, leaf).items():
        if op in ("CONV_2D", "FULLY_CONNECTED"):
            per_channel = [len(np.unique(c)) for c in np.moveaxis(values, qdim, 0)]
            assert max(per_channel) <= CLUSTERS + 1, (leaf, name)


def test_ptq_is_within_1_5_points_of_float(kws_tree, trained_tree):
    rec = kws_tree.leaves["ptq"]
    assert rec.metric("float_accuracy") > 85  # the published model: 92.2% on the full test set
    # 1.5 points on the 1,824-clip evaluation split of ../shared/data; the paired difference's sampling error
    # grows as 1/sqrt(clips), so the bundled 400-clip subset the shared tree scores on gets the same bound in SEs.
    n_eval = int((np.load(trained_tree.data)["split"] == 1).sum())
    assert abs(rec.metric("int8_accuracy") - rec.metric("float_accuracy")) <= 1.5 * max(1.0, (1824 / n_eval) ** 0.5)


def test_manifest_holds_the_tree(kws_tree, trained_tree):
    # every leaf asked for, and with the slow run's, every default leaf
    asked = sorted(trained_tree.recipe().leaves)
    assert sorted(kws_tree.leaves) == sorted(r["leaf"] for r in trained_tree.optimize_json["leaves"]) == asked
    assert sorted({*LEAVES, "pcqat_palette"}) == sorted({*asked, *OTHER_LEAVES})
    data = json.loads((kws_tree.run_dir / "manifest.json").read_text())
    stages = {s["id"]: s for s in data["stages"]}
    assert stages["convert/pcqat"]["parent"] == "optimize/pcqat"
    assert stages["optimize/pcqat"]["parent"] == "optimize/pruned_clustered"
    assert stages["optimize/pruned_clustered"]["parent"] == "optimize/pruned"
    info = data["info"]["optimize"]
    assert info["data"]["n_eval"] == int((np.load(trained_tree.data)["split"] == 1).sum())  # the whole split
    assert info["loss"]["source"].startswith("inferred")
    rows = stages["optimize/pruned"]["details"]["preservation"]
    dw = [r for r in rows if r["kind"] == "DepthwiseConv2D"]
    assert dw and all(r["status"] == "not optimized" and "TFMOT" in r["note"] for r in dw)
    for leaf in kws_tree.leaves:
        m = stages[f"convert/{leaf}"]["metrics"]
        assert m["int8_accuracy"]["unit"] == "%" and m["int8_accuracy"]["mode"] == "measured"


def test_rerun_reuses_every_stage(kws_tree, trained_tree, tmp_path):
    """The same recipe in Python over a copy of the folder `edgedeploy optimize` wrote: nothing is redone."""
    from edgedeploy.pipeline.driver import drive
    from edgedeploy.pipeline.run_plan import Plan

    before = {k: v.started for k, v in kws_tree.leaves.items()}
    again = drive(Plan(trained_tree.model, trained_tree.data, trained_tree.copy(tmp_path / "run"),
                       trained_tree.recipe())).tree
    assert {k: v.started for k, v in again.leaves.items()} == before


def test_a_leaf_converted_again_on_its_own_is_the_same_file(kws_tree, trained_tree, tmp_path):
    """In one process a leaf stage converts the very model its node stage saved (``optimize.handoff``), and each
    stage counts Keras's automatic layer names from the start. So the pcqat leaf converted again later, from its
    node's files, in a process that has built other models since, is the same file, byte for byte; and the
    process that ran the tree gets its own count of names back."""
    import shutil

    from edgedeploy.core.manifest import Manifest
    from edgedeploy.keras import tfenv
    from edgedeploy.pipeline.driver import drive
    from edgedeploy.pipeline.run_plan import Plan

    keras = tfenv.load().keras
    run = trained_tree.copy(tmp_path / "run")
    manifest = Manifest.load(run)
    del manifest.records["convert/pcqat"]
    manifest.save()
    shutil.rmtree(run / "convert" / "pcqat")
    counted = keras.backend.get_uid("dense")  # this process's count of automatic "dense" names (one more)
    again = drive(Plan(trained_tree.model, trained_tree.data, run, trained_tree.recipe(leaves=["pcqat"]))).tree
    assert keras.backend.get_uid("dense") == counted + 1  # the stage's own count was not left behind here
    assert again.nodes["pcqat"].started == kws_tree.nodes["pcqat"].started  # the node reused, not trained again
    first, second = kws_tree.leaves["pcqat"], again.leaves["pcqat"]
    assert second.started != first.started
    assert second.output("int8_model").sha256 == first.output("int8_model").sha256
    assert second.metric("int8_accuracy") == first.metric("int8_accuracy")


def test_compile_consumes_optimize_output(kws_tree, trained_tree, tmp_path):
    """`edgedeploy compile RUN_DIR` compiles every leaf optimize converted into that folder, into the same folder."""
    run_dir = trained_tree.copy(tmp_path / "run")
    proc = run_cli("compile", run_dir, "-t", "ethos-u55-128", "--json")
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert doc["run_dir"] == str(run_dir)
    enc = {r["variant"]: r["metrics"]["encoded_weights_bytes"]["value"] for r in doc["results"]}
    assert sorted(enc) == sorted(kws_tree.leaves)
    assert enc["pruned_clustered"] < enc["ptq"] and enc["pruned"] < enc["ptq"]
    for r in doc["results"]:
        assert (run_dir / r["outputs"]["vela_model"]).is_file()
    # compiled into the run folder itself: the report sets each leaf's int8 accuracy beside its NPU figures
    manifest = json.loads((run_dir / "manifest.json").read_text())
    stages = {s["id"]: s for s in manifest["stages"]}
    assert stages["compile/pcqat/ethos-u55-128"]["parent"] == "convert/pcqat"


# --------------------------------------------------------------------------- bad input (no training)


def _optimize_cli(*args):
    """``edgedeploy optimize ARGS`` in this process: these tests check what it says and exits with, and the TensorFlow
    a new process would import first is loaded here already."""
    return run_in_process("optimize", *args)


def _one_line_error(proc, code, *needles):
    assert proc.returncode == code, proc.stderr
    line = one_error_line(proc)
    for n in needles:
        assert n in line, line


def test_model_that_does_not_load(tmp_path, small_kws):
    bad = tmp_path / "bad.h5"
    bad.write_bytes(b"not hdf5 at all")
    _one_line_error(_optimize_cli(bad, "--data", small_kws, "-o", tmp_path / "o"), 3, "bad.h5", "not a readable HDF5")
    assert not (tmp_path / "o").exists()


@pytest.mark.requires_data("ic/cifar10_jpeg_subset.npz")
def test_data_that_does_not_fit_the_model(tmp_path, shared_data):
    _one_line_error(_optimize_cli(shared_data / "kws" / "dscnn_mlperf_float.h5", "--data",
                                  shared_data / "ic" / "cifar10_jpeg_subset.npz", "-o", tmp_path / "o"),
                    3, "cifar10_jpeg_subset.npz", "[32, 32, 3]", "[49, 10, 1]")
    assert not (tmp_path / "o").exists()


# Keras 3 models trained and saved by Keras 3 itself (TF_USE_LEGACY_KERAS unset), with Keras 3's probabilities on
# the evaluation split of the data they were trained on: tests/data/models/make_keras3_models.py made them.
KERAS3 = Path(__file__).resolve().parents[2] / "data" / "models" / "keras3"
KERAS3_DATA = Path(__file__).resolve().parents[3] / "examples" / "kws_tree" / "speech_commands_subset.npz"


@pytest.fixture(scope="module")
def keras3_models() -> Path:
    return KERAS3


@pytest.mark.parametrize("name", ["functional.keras", "functional.h5", "sequential.keras", "sequential.h5"])
def test_keras3_models_are_rebuilt_in_tf_keras_with_their_weights(keras3_models, name):
    from edgedeploy.keras import tfenv
    from edgedeploy.keras.model import load_model

    model, _ = load_model(keras3_models / name)
    assert isinstance(model, tfenv.load().keras.Model)  # tf_keras, which TFMOT can wrap
    d = np.load(KERAS3_DATA)
    probs = model.predict(d["x"][d["split"] == 1], verbose=0)
    ref = np.load(keras3_models / (name.split(".")[0] + "_ref.npz"))["probs"]
    np.testing.assert_allclose(probs, ref, atol=1e-5)


# The rebuilt model's pointwise kernels pruned and clustered (the pruned_clustered leaf), and in the slow run also
# pruning- and cluster-preserving QAT of it (pcqat). The default run checks QAT of rebuilt Keras 3 models in
# tests/integration/keras/test_nested_cli.py (the qat leaf of a .keras application against its flat twin), and PCQAT
# of this model's shapes (a ReLU6 after a 1x1 convolution, a Concatenate fed by a convolution, a SeparableConv2D) on
# the committed kws_shapes model below.
@pytest.mark.parametrize("leaf", ["pruned_clustered", pytest.param("pcqat", marks=pytest.mark.slow)])
def test_keras3_model_through_the_tree(keras3_models, tmp_path, leaf):
    from edgedeploy.pipeline.driver import drive
    from edgedeploy.pipeline.run_plan import Plan

    recipe = load_recipe(overrides={"epochs": 1, "min_steps": 0, "sparsity": SPARSITY, "clusters": CLUSTERS, "seed": 7,
                                    "calibration_samples": CALIBRATION, "leaves": [leaf]})
    outcome = drive(Plan(keras3_models / "functional.keras", KERAS3_DATA, tmp_path / "run", recipe)).tree
    ref = float(np.load(keras3_models / "functional_ref.npz")["accuracy"])
    # the rebuilt float model as the tree scored it (its baseline node; a ptq leaf's float figure is the same model's)
    assert outcome.nodes["baseline"].metric("float_accuracy") == pytest.approx(ref, abs=0.26)  # one clip is 0.25
    assert not outcome.nodes[leaf].warnings
    kernels = {name: v for name, (op, v, _) in _int8_kernels(outcome, leaf).items() if op == "CONV_2D"}
    pointwise = [v for v in kernels.values() if v.shape[1:3] == (1, 1)]  # pw, branch and sep's pointwise half
    assert len(pointwise) == 3
    for v in pointwise:
        assert np.mean(v == 0) >= SPARSITY - 0.02
        assert max(len(np.unique(ch)) for ch in v) <= CLUSTERS + 1  # per output channel (int8 scales)


@pytest.mark.parametrize("name, needles", [("ops.keras", ("Keras 3 operation", "Rescaling")),
                                           ("lora.keras", ("head", "lora_rank = 2"))])
def test_what_tf_keras_cannot_rebuild_is_refused_with_the_layer(keras3_models, tmp_path, name, needles):
    _one_line_error(_optimize_cli(keras3_models / name, "--data", KERAS3_DATA, "-o", tmp_path / "o"), 3, name,
                    *needles)
    assert not (tmp_path / "o").exists()


def test_lambda_layers_need_trust(tmp_path, small_kws):
    from edgedeploy.keras import tfenv

    keras = tfenv.load().keras
    inp = keras.Input((49, 10, 1))
    x = keras.layers.Lambda(lambda t: t * 0.5, name="halve")(inp)
    out = keras.layers.Dense(12, activation="softmax")(keras.layers.Flatten()(x))
    path = tmp_path / "lam.h5"
    keras.Model(inp, out).save(path)
    _one_line_error(_optimize_cli(path, "--data", small_kws, "-o", tmp_path / "o"), 3, "Lambda layers (halve)",
                    "--trust-lambda")
    ok = _optimize_cli(path, "--data", small_kws, "-o", tmp_path / "o", "--trust-lambda", "--leaves", "ptq", "--json")
    assert ok.returncode == 0, ok.stderr
    assert json.loads(ok.stdout)["leaves"][0]["leaf"] == "ptq"


def _committed(name: str) -> Path:
    """A committed float model of the real KWS features (tests/data/models/make_models.py, ``KWS_MODELS``: fitted
    for 6 epochs on the bundled subset's fine-tune clips)."""
    return input_models().HERE / f"{name}.h5"


def _optimize(model: Path, data, tmp_path, leaves, **recipe_keys):
    """The tree of ``model`` on ``data`` (1 epoch a stage, the ptq leaf calibrated on :data:`CALIBRATION` samples)."""
    from edgedeploy.pipeline.driver import drive
    from edgedeploy.pipeline.run_plan import Plan

    recipe = load_recipe(overrides={"epochs": 1, "min_steps": 0, "sparsity": SPARSITY, "clusters": CLUSTERS, "seed": 7,
                                    "calibration_samples": CALIBRATION, "leaves": list(leaves), **recipe_keys})
    return drive(Plan(model, data, tmp_path / "run", recipe)).tree


# The TFMOT QAT leaf: pqat (pruned, then prune-preserving QAT) in the default run, the palette leaf clustering the
# kernels; pcqat (TFMOT's sparsity-preserving clustering, then pruning- and cluster-preserving QAT) with -m slow. The
# QAT stage is the same for both (edgedeploy.optimize.techniques.qat.qat_node; the scheme differs), and so is what the
# Conv1D rewrite gives it: a Conv2D with TFMOT's QAT config.
@pytest.mark.parametrize("qat_leaf", ["pqat", pytest.param("pcqat", marks=pytest.mark.slow)])
def test_conv1d_layers_are_pruned_clustered_and_quantization_aware_trained(tmp_path, kws_data, qat_leaf):
    """TFMOT has no QAT config for Conv1D and the palette leaves know 2-D kernels. The baseline node rewrites each
    Conv1D as the Conv2D the converter writes for it (between two reshapes; a batch norm and ReLU after it move
    with it), so its kernel is pruned, clustered and palette-trained, and the QAT leaves' int8 graph is the ptq
    leaf's: no separate RELU or requantizing QUANTIZE around the max pooling. The model: Conv1D -> BatchNorm -> ReLU,
    max pooling, a dilated causal Conv1D (``kws_conv1d``)."""
    d = np.load(kws_data)
    data = tmp_path / "kws1d.npz"
    np.savez(data, x=d["x"][..., 0], y=d["y"], split=d["split"])
    # the ptq leaf is the reference of the accuracy check below: calibrated as the recipe's default does
    outcome = _optimize(_committed("kws_conv1d"), data, tmp_path, ["ptq", qat_leaf, "pcqat_palette"],
                        calibration_samples=Recipe().calibration_samples)
    assert outcome.nodes["baseline"].details["conv1d_as_conv2d"] == ["c1", "c2"]
    # TFMOT has no config for the max pooling either, which only picks values: recorded, not warned about
    assert outcome.nodes[qat_leaf].details["qat_unquantized_layers"] == ["max_pooling1d"]
    assert not outcome.nodes[qat_leaf].warnings
    for leaf in (qat_leaf, "pcqat_palette"):
        convs = [v for op, v, _ in _int8_kernels(outcome, leaf).values() if op == "CONV_2D"]
        assert sorted(v.shape for v in convs) == [(24, 5, 1, 10), (32, 3, 1, 24)], leaf
        assert all(np.mean(v == 0) >= SPARSITY - 0.02 for v in convs), leaf
        if leaf == "pcqat_palette":
            assert all(len(np.unique(v)) <= 32 for v in convs)
        ops = [o.op for o in read_tflite(outcome.run_dir / outcome.leaves[leaf].output("int8_model").path).operators]
        ptq_ops = read_tflite(outcome.run_dir / outcome.leaves["ptq"].output("int8_model").path).operators
        assert ops == [o.op for o in ptq_ops], leaf
    ptq = outcome.leaves["ptq"].metric("int8_accuracy")
    print("int8 accuracy:", {k: outcome.leaves[k].metric("int8_accuracy") for k in outcome.leaves})
    for leaf in (qat_leaf, "pcqat_palette"):  # working int8 models (chance is 8.3%), near the ptq leaf
        assert outcome.leaves[leaf].metric("int8_accuracy") > max(ptq - 10, 2 * 100 / 12), (leaf, ptq)


@pytest.fixture(scope="module")
def shapes_tree(small_kws, tmp_path_factory):
    """The ptq and pcqat leaves of one model holding four shapes TFMOT's QAT mishandles (each test below reads its
    own): a Concatenate fed by convolutions, a SeparableConv2D followed by batch norm and ReLU, a ReLU6 layer after
    a 1x1 convolution, and an ``Activation("relu")`` layer after another one, which the recipe leaves unfolded
    (``fuse_relu = false``; ``kws_shapes``)."""
    outcome = _optimize(_committed("kws_shapes"), small_kws, tmp_path_factory.mktemp("shapes"), ["ptq", "pcqat"],
                        fuse_relu=False)
    # the only layer fuse_relu would fold: every other shape is what the default recipe makes of it
    assert outcome.nodes["baseline"].details["separate_relu"] == ["out"]
    assert "fused_relu" not in outcome.nodes["baseline"].details
    return outcome


def _kept_zeros_and_clusters(kernel):
    assert np.mean(kernel == 0) >= SPARSITY - 0.02
    assert max(len(np.unique(ch)) for ch in kernel) <= CLUSTERS + 1  # per output channel (int8 scales)


def _ops(outcome, leaf):
    return [o.op for o in read_tflite(outcome.run_dir / outcome.leaves[leaf].output("int8_model").path).operators]


def test_layers_feeding_a_concatenate_keep_their_zeros_and_clusters_in_pcqat(shapes_tree):
    """TFMOT's QAT transform for Concatenate gives the layers feeding one its default registry's plain config,
    whatever the scheme, so PCQAT trained them without the preserving quantizers and the stage failed its
    preservation check (zeros gone). A linear Activation between each such layer and the Concatenate keeps them
    in the scheme; checked on the pcqat leaf's int8 kernels."""
    kernels = [v for op, v, _ in _int8_kernels(shapes_tree, "pcqat").values() if op == "CONV_2D"]
    branches = [v for v in kernels if v.shape[0] == 16 and v.shape[-1] == 16]  # the two 16 -> 16 branches
    assert len(branches) == 2
    for v in branches:
        _kept_zeros_and_clusters(v)
    ops = _ops(shapes_tree, "pcqat")
    assert "CONCATENATION" in ops and "DEQUANTIZE" not in ops


def test_separable_convs_are_pruned_clustered_and_keep_both_in_pcqat(shapes_tree):
    """TFMOT prunes and clusters a SeparableConv2D's pointwise kernel but has no QAT config for it, so PCQAT would
    train it unquantized and lose its zeros and clusters. The tree splits each one into the DepthwiseConv2D and
    1x1 Conv2D it computes (the two operators the converter writes), so the 1x1 half is pruned, clustered and
    quantization-aware trained like any convolution; checked here on the pcqat leaf's int8 kernels."""
    assert shapes_tree.nodes["baseline"].details["split_separable"] == {"sep": "sep_depthwise"}
    assert "qat_unquantized_layers" not in shapes_tree.nodes["pcqat"].details
    kernels = _int8_kernels(shapes_tree, "pcqat")
    pointwise = [v for op, v, _ in kernels.values() if op == "CONV_2D" and v.shape == (32, 1, 1, 48)]
    assert len(pointwise) == 1
    _kept_zeros_and_clusters(pointwise[0])
    assert sum(op == "DEPTHWISE_CONV_2D" for op, _, _ in kernels.values()) == 1
    assert read_tflite(shapes_tree.run_dir / shapes_tree.leaves["ptq"].output("int8_model").path).is_integer()


def _relu_after_a_convolution(outcome, channels: int, name: str):
    pointwise = [v for op, v, _ in _int8_kernels(outcome, "pcqat").values()
                 if op == "CONV_2D" and v.shape == (channels, 1, 1, v.shape[-1])]
    assert len(pointwise) == 1, name
    _kept_zeros_and_clusters(pointwise[0])
    # the graph from the separable convolution's depthwise half on (its 1x1 half, the 1x1 convolutions followed by
    # the ReLU6 and the ReLU) is the ptq leaf's: no RELU, RELU6 or requantizing QUANTIZE beside a convolution (the
    # Concatenate may requantize before it)
    ops = {leaf: _ops(outcome, leaf) for leaf in ("ptq", "pcqat")}
    tail = {leaf: o[max(i for i, op in enumerate(o) if op == "DEPTHWISE_CONV_2D") + 1:] for leaf, o in ops.items()}
    assert tail["pcqat"] == tail["ptq"] and tail["ptq"].count("CONV_2D") == 3, ops
    assert not {"RELU", "RELU6"} & set(ops["pcqat"]), ops


def test_a_relu6_layer_after_a_convolution_keeps_its_zeros_and_clusters_in_pcqat(shapes_tree):
    """TFMOT's QAT transform for a ReLU layer after a Conv/Dense gives the convolution a no-op quantize config. A
    ReLU6 cannot be folded into it (TFMOT's QAT has no relu6 activation), so PCQAT trained the convolution freely
    and the stage failed its preservation check (zeros gone). An identity layer between the two keeps the
    scheme's config; the int8 model is the ptq leaf's graph, the ReLU6 fused into its convolution."""
    _relu_after_a_convolution(shapes_tree, 24, "relu6")


def test_an_unfused_relu_layer_after_a_convolution_keeps_its_zeros_and_clusters_in_pcqat(shapes_tree):
    """The same for a ReLU layer the recipe does not fold into the convolution (``fuse_relu = false``): a 1x1
    convolution and an ``Activation("relu")`` layer after it."""
    _relu_after_a_convolution(shapes_tree, 20, "unfused relu")


def test_qat_of_dense_batch_norm_relu_blocks_converts_to_the_model_it_trained(tmp_path, kws_data):
    """An MLP of Dense -> BatchNorm -> ReLU blocks. TFMOT starts each activation range at [-6, 6] and moves it by
    0.1% a step, so after a short QAT a ReLU's range still reaches far below zero; for such a range before a
    Dense the converter (TF 2.21) quantizes the next layer's bias for another input scale, and the int8 QAT leaf
    lost 14 points against its own QAT model. The tree starts QAT's ranges from the float parent instead
    (recipe qat_ranges = "calibrated", the default); with TFMOT's start the conversion is refused."""
    import shutil

    from edgedeploy.errors import ToolFailedError
    from edgedeploy.pipeline.driver import drive
    from edgedeploy.pipeline.run_plan import Plan

    model = _committed("kws_mlp")  # two Dense (64) -> BatchNorm -> ReLU blocks
    outcome = _optimize(model, kws_data, tmp_path, ["qat"],
                        calibration_samples=Recipe().calibration_samples)  # what the recipe's default does
    assert "activation ranges started from the float parent" in outcome.nodes["qat"].details["qat_ranges"]
    qat = outcome.leaves["qat"]
    int8_model = read_tflite(outcome.run_dir / qat.output("int8_model").path)
    assert [o.op for o in int8_model.operators].count("FULLY_CONNECTED") == 3
    assert all(o.bias_scale_ratio() in (None, pytest.approx(1.0, abs=0.02)) for o in int8_model.operators)
    print("qat float / int8:", qat.metric("float_accuracy"), qat.metric("int8_accuracy"))
    assert abs(qat.metric("int8_accuracy") - qat.metric("float_accuracy")) < 2.0

    recipe = load_recipe(table={"training": {"qat_ranges": "tfmot"}},
                         overrides={"epochs": 1, "min_steps": 0, "seed": 7, "leaves": ["qat"]})
    run = shutil.copytree(outcome.run_dir, tmp_path / "run_tfmot")  # its baseline node reused
    with pytest.raises(ToolFailedError, match="quantized the bias of .* for another input scale"):
        drive(Plan(model, kws_data, run, recipe))


def test_recurrent_layers_the_converter_cannot_take_are_refused_before_training(tmp_path, small_kws):
    """A GRU that is not unrolled becomes a loop whose int8 calibration crashes TFLite's converter (a segmentation
    fault), and an LSTM's QAT model does not convert: refused with one line before anything is written. An LSTM
    itself converts to one operator, so its ptq leaf is built."""
    from edgedeploy.keras import tfenv

    keras = tfenv.load().keras

    def save(name, rnn):
        inp = keras.Input((49, 10, 1))
        x = rnn(keras.layers.Reshape((49, 10))(inp))
        keras.Model(inp, keras.layers.Dense(12, activation="softmax")(x)).save(tmp_path / f"{name}.h5")
        return tmp_path / f"{name}.h5"

    gru = save("gru", keras.layers.Bidirectional(keras.layers.GRU(8, name="g"), name="bigru"))
    _one_line_error(_optimize_cli(gru, "--data", small_kws, "-o", tmp_path / "o", "--leaves", "ptq"), 3,
                    "gru.h5", "bigru (Bidirectional(GRU)) is not unrolled", "unroll=True")
    lstm = save("lstm", keras.layers.LSTM(8, name="lstm"))
    _one_line_error(_optimize_cli(lstm, "--data", small_kws, "-o", tmp_path / "o", "--leaves", "ptq,pcqat"), 3,
                    "lstm.h5", "QAT leaf pcqat cannot be built", "--leaves ptq")
    assert not (tmp_path / "o").exists()
    recipe = tmp_path / "recipe.toml"  # the leaf is what is checked, not its calibration
    recipe.write_text(f"calibration_samples = {CALIBRATION}\n")
    ok = _optimize_cli(lstm, "--data", small_kws, "-o", tmp_path / "o", "--leaves", "ptq", "--recipe", recipe,
                       "--json")
    assert ok.returncode == 0, ok.stderr
    assert json.loads(ok.stdout)["leaves"][0]["leaf"] == "ptq"
