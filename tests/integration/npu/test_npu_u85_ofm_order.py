"""Ethos-U85 operations that store their OFM transposed or reversed: Vela 5.2 lowers a depthwise convolution's
depth multiplier (the interleaving of its output channels), TRANSPOSE and REVERSE_V2 to 1x1 pooling operations
whose OFM_PRECISION reorders the output. Each model's compiled stream must hold those orders, and verify must give
TFLite's reference outputs bit for bit."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from edgedeploy.cli.app import app
from helpers import write_int8_tflite

SHAPE = (8, 6, 4)  # height, width and depth all different: a swapped axis cannot go unnoticed
TARGET = "ethos-u85-256"
PERMUTES = [(2, 1, 3), (1, 3, 2), (2, 3, 1), (3, 1, 2), (3, 2, 1)]  # every order of the axes but the identity


def _zoo(name: str):
    from edgedeploy.keras import tfenv

    t = tfenv.load()
    tf, L = t.tf, t.keras.layers
    return {
        "depth_multiplier": lambda x: L.DepthwiseConv2D(3, depth_multiplier=2, padding="same")(x),
        "transpose": lambda x: L.Concatenate()([L.Flatten()(L.Conv2D(4, 1)(L.Permute(p)(x))) for p in PERMUTES]),
        "reverse": lambda x: L.Conv2D(4, 1)(L.Concatenate()([tf.reverse(x, axis=[a]) for a in (1, 2, 3)])),
    }[name]


# the transpose (OFM_PRECISION bits 11-13) and reverse (bits 9-10) fields the compiled stream must hold
EXPECTED = {
    "depth_multiplier": ({"WHC", "HCW", "CWH"}, set()),
    "transpose": ({"WHC", "HCW", "WCH", "CHW", "CWH"}, set()),
    "reverse": (set(), {"H", "W", "C"}),
}


def _compile(name: str, tmp_path):
    from edgedeploy.keras import tfenv

    keras = tfenv.load().keras
    inp = keras.Input(SHAPE)
    model = write_int8_tflite(keras.Model(inp, _zoo(name)(inp)), tmp_path / f"{name}.tflite")
    run = tmp_path / "run"
    done = CliRunner().invoke(app, ["compile", str(model), "-o", str(run), "--allow-cpu-ops", "-t", TARGET])
    assert done.exit_code == 0, done.output
    return run


def _orders(run) -> tuple[set[str], set[str]]:
    """The transposes and reverses the compiled stream's operations store their OFMs with."""
    from edgedeploy.npu.commands import decode_for
    from edgedeploy.npu.leaf_layout import read_leaf
    from edgedeploy.npu.u85_commands import REVERSE, TRANSPOSE

    (path,) = run.glob(f"compile/**/{TARGET}/*_vela.tflite")
    leaf = read_leaf(path)
    precisions = [op.r0.get("OFM_PRECISION", 0) for op in decode_for(leaf.product, leaf.commands) if op.kind != "DMA"]
    transposes = {TRANSPOSE[(p >> 11) & 0x7] for p in precisions} - {"HWC"}
    reverses = {REVERSE[(p >> 9) & 0x3] for p in precisions} - {"NONE"}
    return transposes, reverses


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_u85_transposed_and_reversed_outputs_are_bit_exact(name, tmp_path):
    run = _compile(name, tmp_path)
    assert _orders(run) == EXPECTED[name]  # the stream really reorders its outputs: the check below is not vacuous
    result = CliRunner().invoke(app, ["verify", str(run), "-t", TARGET, "-n", "30", "--json"])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert doc["status"] == "bit-exact" and doc["exact_cases"] == 30, doc
