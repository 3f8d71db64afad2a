"""A small model with what the QAT nodes rewrite before TFMOT (hard-swish and a squeeze-and-excitation gate's
hard-sigmoid as TensorFlow operations, a batch norm after a ``Concatenate``, a Dense layer's own swish) behind a
``Rescaling(1/255)`` input layer through the palette QAT leaf on the command line: its node folds the scaling into
the first convolution and applies the rewrites the other QAT nodes apply, records both, and its int8 model reads
the raw input with that convolution and converts with HARD_SWISH and one kernel for the batch norm, every planned
layer keeping its palette."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from helpers import run_in_process
from zoo import settle_batch_norm

SEED = 3
# The palette QAT leaves: the default run takes cqat_palette (its palette node has no prune stage before it);
# pcqat_palette, the same palette QAT node after pruning, runs with -m slow.
LEAVES = ["cqat_palette", pytest.param("pcqat_palette", marks=pytest.mark.slow)]
N_FIT, N_EVAL = 64, 32  # a couple of batches: the check is the rewrites and the operators they convert to


def _model(keras):
    L = keras.layers

    def hard_sigmoid(x):
        return L.ReLU(6.0)(x + 3.0) * (1.0 / 6.0)

    inp = keras.Input((16, 16, 3))
    x = L.Rescaling(1 / 255, name="rescale")(inp)
    x = L.Conv2D(8, 3, strides=2, padding="same", name="stem")(x)
    x = L.Multiply(name="hswish")([x, hard_sigmoid(x)])
    gate = L.Conv2D(8, 1, name="gate")(L.GlobalAveragePooling2D(keepdims=True, name="squeeze")(x))
    x = L.Multiply(name="excite")([x, hard_sigmoid(gate)])
    y = L.Conv2D(8, 3, padding="same", use_bias=False, name="branch")(x)
    x = L.Concatenate(name="concat")([x, y])
    x = L.ReLU(name="post_relu")(L.BatchNormalization(name="post_bn")(x))
    s = L.Dense(8, activation="swish", name="reduce")(L.GlobalAveragePooling2D(name="pool")(x))
    return keras.Model(inp, L.Dense(4, activation="softmax", name="out")(s))


@pytest.fixture(scope="module", params=LEAVES)
def leaf(request) -> str:
    return request.param


@pytest.fixture(scope="module")
def run(leaf, tmp_path_factory) -> Path:
    from edgedeploy.keras import tfenv

    env = tfenv.load()
    tfenv.set_seed(SEED)
    out = tmp_path_factory.mktemp("palette_rewrites")
    rng = np.random.default_rng(SEED)
    n = N_FIT + N_EVAL
    y = rng.integers(0, 4, n)
    x = np.clip(127.5 + 40 * (rng.normal(size=(n, 16, 16, 3)) + y[:, None, None, None] * 0.5), 0, 255)
    x = x.astype(np.float32)  # (raw pixel values, for the Rescaling)
    np.savez(out / "data.npz", x=x, y=y, split=(np.arange(n) >= N_FIT).astype(np.int64))
    model = _model(env.keras)
    settle_batch_norm(model, x[:N_FIT])  # (batch-norm statistics not the identity's)
    model.save(out / "model.h5", include_optimizer=False)
    proc = run_in_process("optimize", out / "model.h5", "--data", out / "data.npz", "-o", out / "run", "--leaves",
                          leaf, "--epochs", "1", "--min-steps", "0", "--validation-fraction", "0", "--clusters", "8",
                          "--seed", SEED)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return out / "run"


def test_the_palette_qat_node_records_the_rewrites_the_qat_nodes_apply(run, leaf):
    manifest = json.loads((run / "manifest.json").read_text())
    node = next(r for r in manifest["stages"] if r["stage"] == "optimize" and r["variant"] == leaf)
    # the input scaling folded into the first convolution, keeping its palette (as every QAT node folds it)
    assert node["details"]["input_preprocessing"]["folded"] == {"rescale": ["stem"]}
    assert not any("rescal" in w for w in node["warnings"])
    rewrites = node["details"]["qat_rewrites"]
    assert rewrites["batch_norms_as_depthwise"] == ["post_bn"] and rewrites["separate_swish"] == ["reduce"]
    assert "hswish" in rewrites["hard_activations_as_layers"]
    # the ReLUs left after a kernel layer (the gate's, once its + 3 is in the bias) fused into it, so that TFMOT
    # keeps the layer's palette quantizer: the convert stage checked every planned layer kept its palette
    assert rewrites["fuse_separate_relu"] == ["gate", "post_bn"], rewrites
    convert = next(r for r in manifest["stages"] if r["id"] == f"convert/{leaf}")
    planned = {r["layer"] for r in convert["details"]["preservation"] if r.get("clusters") is not None}
    assert {"stem", "gate", "branch"} <= planned, planned


def test_the_palette_qat_leaf_converts_with_hard_swish_and_a_kernel_for_the_batch_norm(run, leaf):
    from edgedeploy.tflite.reader import read_tflite

    ops = [o.op for o in read_tflite(run / "convert" / leaf / "model_int8.tflite").operators]
    # the raw input goes straight into the first convolution: no MUL of the scaling before it
    assert ops[0] == "CONV_2D", ops
    # hard-swish as one operator; the gate's + 3 in its convolution's bias (no ADD); the batch norm a depthwise
    # convolution; every operator in int8
    assert "HARD_SWISH" in ops and "ADD" not in ops and "DEPTHWISE_CONV_2D" in ops, ops
    assert "DEQUANTIZE" not in ops, ops
