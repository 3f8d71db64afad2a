"""2:4 structured sparsity on real TensorFlow, TFMOT and Vela: the groups Vela's Ethos-U85 skips, the
gradual 2:4 pruning of a small model through pqat, and the check that names a layer that loses the pattern."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from edgedeploy import structured

EDGEDEPLOY = [sys.executable, "-m", "edgedeploy"]


def _cli(*args):
    return subprocess.run([*EDGEDEPLOY, *map(str, args)], capture_output=True, text=True,
                          env={**os.environ, "NO_COLOR": "1"})


def _conv_model(keras, seed: int):
    keras.utils.set_random_seed(seed)
    inp = keras.Input((12, 12, 16))
    x = keras.layers.Conv2D(32, 3, padding="same", activation="relu", name="conv_a")(inp)
    x = keras.layers.Conv2D(32, 3, padding="same", activation="relu", name="conv_b")(x)
    x = keras.layers.GlobalAveragePooling2D()(x)
    out = keras.layers.Dense(8, name="fc")(x)
    return keras.Model(inp, out)


def test_vela_counts_fewer_macs_only_for_groups_along_input_channels(tmp_path):
    """Zero two of every four weights along the input channels (this module's groups) and, as a control, along
    the output channels: Vela 5.2 for Ethos-U85 counts fewer MACs only for the first."""
    from edgedeploy import tfenv
    from edgedeploy.convert import convert_int8
    from edgedeploy.compile import CompileOptions, compile_tflite

    env = tfenv.load()
    rng = np.random.default_rng(0)
    x = rng.normal(size=(64, 12, 12, 16)).astype(np.float32)
    macs = {}
    for how in ("dense", "input", "output"):
        model = _conv_model(env.keras, 0)
        for layer in model.layers:
            if layer.name in ("conv_a", "conv_b", "fc"):
                w = layer.get_weights()
                kind = "Dense" if layer.name == "fc" else "Conv2D"
                if how == "input":
                    w[0] = w[0] * structured.mask_2of4(w[0], kind)
                elif how == "output":  # the same pattern on the wrong axis: groups of four output channels
                    swapped = np.swapaxes(w[0], -1, -2)
                    w[0] = np.swapaxes(swapped * structured.mask_2of4(swapped, kind), -1, -2)
                layer.set_weights(w)
        path = tmp_path / f"{how}.tflite"
        path.write_bytes(convert_int8(model, x[:32]))
        outcome = compile_tflite([path], ["ethos-u85-256"], tmp_path / f"out-{how}", CompileOptions(jobs=1))
        macs[how] = outcome.records[0].metrics["macs"].value
    print("Vela U85-256 MACs:", macs)
    assert macs["input"] < 0.7 * macs["dense"]
    assert macs["output"] == macs["dense"]
