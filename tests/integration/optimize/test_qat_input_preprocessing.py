"""A MobileNet-v1-like model with a ``Rescaling(1/255)`` input layer through the tree on the command line: the
QAT-derived leaves, the palette QAT leaf among them, take the raw input as ptq does (the scaling folded into the
first convolution before QAT), so none spends more U55 NPU cycles than ptq, and the report flags no leaf."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from helpers import run_in_process
from zoo import settle_batch_norm

SEED = 3
U55 = "ethos-u55-128"
LEAVES = ("qat", "pcqat", "cqat_palette", "pcqat_palette")  # the QAT-derived leaves, each beside ptq
# The default run takes qat (folded into a kernel free to change). The palette QAT node's fold (into a kernel that
# keeps its palette) is checked in the default run by test_palette_qat_rewrites.py, whose cqat_palette model reads
# its input through the same Rescaling: the fold recorded, the int8 model's first operator the convolution.
# cqat_palette and pcqat_palette (the palette QAT node without and after pruning) and pcqat (folded as the palette
# leaf does, into a kernel that keeps its clusters, then TFMOT's cluster-preserving QAT) run with -m slow, each in a
# tree of its own.
DEFAULT = ("qat",)
CASES = [leaf if leaf in DEFAULT else pytest.param(leaf, marks=pytest.mark.slow) for leaf in LEAVES]
N_FIT, N_EVAL = 64, 32  # a few batches: the check is which operators the leaves convert to, and their cycles


@pytest.fixture(scope="module")
def rescaling_run(tmp_path_factory):
    """The run folder holding ptq and a given QAT-derived leaf, compiled for U55 (each tree made once)."""
    runs: dict[tuple[str, ...], Path] = {}

    def run_of(leaf: str) -> Path:
        leaves = DEFAULT if leaf in DEFAULT else (leaf,)
        if leaves not in runs:
            runs[leaves] = _optimize_and_compile(tmp_path_factory.mktemp("rescaling"), ("ptq", *leaves))
        return runs[leaves]

    return run_of


def _optimize_and_compile(out: Path, leaves: tuple[str, ...]) -> Path:
    from edgedeploy.keras import tfenv

    env = tfenv.load()
    tfenv.set_seed(SEED)
    keras, L = env.keras, env.keras.layers
    rng = np.random.default_rng(SEED)
    n = N_FIT + N_EVAL
    x = rng.uniform(0, 255, (n, 32, 32, 3)).astype(np.float32)
    y = rng.integers(0, 4, n)
    np.savez(out / "data.npz", x=x, y=y, split=(np.arange(n) >= N_FIT).astype(np.int64))
    inp = keras.Input((32, 32, 3))
    h = L.Rescaling(1 / 255, name="rescale")(inp)
    h = L.ReLU(6.0)(L.BatchNormalization()(L.Conv2D(8, 3, strides=2, padding="same", use_bias=False, name="stem")(h)))
    for filters, stride in ((16, 1), (32, 2)):  # depthwise-separable blocks, as MobileNet v1 builds them
        h = L.ReLU(6.0)(L.BatchNormalization()(L.DepthwiseConv2D(3, strides=stride, padding="same", use_bias=False)(h)))
        h = L.ReLU(6.0)(L.BatchNormalization()(L.Conv2D(filters, 1, use_bias=False)(h)))
    model = keras.Model(inp, L.Dense(4, activation="softmax")(L.GlobalAveragePooling2D()(h)))
    settle_batch_norm(model, x[:N_FIT])  # (batch-norm statistics of the data, as training leaves them)
    model.save(out / "model.h5", include_optimizer=False)
    run = out / "run"
    proc = run_in_process("optimize", out / "model.h5", "--data", out / "data.npz", "-o", run, "--leaves",
                          ",".join(leaves), "--epochs", "1", "--min-steps", "0", "--validation-fraction", "0",
                          "--clusters", "8", "--seed", SEED)
    assert proc.returncode == 0, proc.stderr[-3000:]
    proc = run_in_process("compile", run, "-t", U55, "--jobs", "1")  # (one Vela worker to start)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return run


@pytest.mark.parametrize("leaf", CASES)
def test_the_qat_leaf_spends_at_most_ptqs_npu_cycles(rescaling_run, leaf):
    run = rescaling_run(leaf)
    proc = run_in_process("report", run, "--json")
    assert proc.returncode == 0, proc.stderr[-2000:]
    rows = {r["leaf"]: r for r in json.loads(proc.stdout)["rows"] if r["target"] == U55}
    ptq = rows["ptq"]["values"]["npu_cycles"]["value"]
    cycles = rows[leaf]["values"]["npu_cycles"]["value"]
    assert cycles <= 1.01 * ptq, (leaf, cycles, ptq)
    assert rows[leaf]["over_reference"] is None or "npu_cycles" not in rows[leaf]["over_reference"], leaf


@pytest.mark.parametrize("leaf", CASES)
def test_the_qat_node_records_the_fold_and_its_int8_model_has_no_input_mul(rescaling_run, leaf):
    from edgedeploy.tflite.reader import read_tflite

    run = rescaling_run(leaf)
    manifest = json.loads((run / "manifest.json").read_text())
    node = next(r for r in manifest["stages"] if r["stage"] == "optimize" and r["variant"] == leaf)
    assert node["details"]["input_preprocessing"]["folded"] == {"rescale": ["stem"]}
    assert not any("rescal" in w for w in node["warnings"])
    ops = [o.op for o in read_tflite(run / "convert" / leaf / "model_int8.tflite").operators]
    assert ops[0] == "CONV_2D" and "MUL" not in ops, ops
