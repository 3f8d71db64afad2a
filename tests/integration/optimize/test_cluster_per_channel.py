"""Per-channel clustering (``--per-channel-clusters``) of a small model on the command line: a 1x1 Conv2D whose
output channels hold fewer weights than the clusters is clustered per tensor and named in the node's record, and
a Conv2D without a bias (which TFMOT's own size check takes for one weight per channel) is clustered per channel."""

from __future__ import annotations

import json

import numpy as np

from helpers import run_in_process

SEED = 1
CLUSTERS = 16


def _model(keras):
    L = keras.layers
    inp = keras.Input((8, 8, 3))
    x = L.Conv2D(8, 1, activation="relu", name="narrow")(inp)  # 3 weights per output channel
    x = L.Conv2D(8, 3, padding="same", use_bias=False, name="no_bias")(x)  # 72 weights per output channel
    x = L.GlobalAveragePooling2D(name="pool")(L.ReLU(name="relu")(x))
    return keras.Model(inp, L.Dense(4, activation="softmax", name="out")(x))


def test_a_layer_with_too_few_weights_per_channel_is_clustered_per_tensor(tmp_path):
    from edgedeploy.keras import tfenv

    env = tfenv.load()
    tfenv.set_seed(SEED)
    rng = np.random.default_rng(SEED)
    y = rng.integers(0, 4, 64)
    x = rng.normal(size=(64, 8, 8, 3)).astype(np.float32) + y[:, None, None, None] * 0.5
    np.savez(tmp_path / "data.npz", x=x, y=y, split=(np.arange(64) >= 48).astype(np.int64))
    _model(env.keras).save(tmp_path / "model.h5", include_optimizer=False)
    proc = run_in_process("optimize", tmp_path / "model.h5", "--data", tmp_path / "data.npz", "-o", tmp_path / "run",
                          "--leaves", "clustered", "--per-channel-clusters", "--clusters", CLUSTERS,
                          "--epochs", "1", "--min-steps", "0", "--validation-fraction", "0", "--seed", SEED)
    assert proc.returncode == 0, proc.stderr[-3000:]
    manifest = json.loads((tmp_path / "run" / "manifest.json").read_text())
    node = next(s for s in manifest["stages"] if s["id"] == "optimize/clustered")
    fallback = node["details"]["training"]["clustering"]["fallback_layers"]
    assert fallback == {"narrow": f"clustered per tensor: an output channel holds 3 weights <= {CLUSTERS} clusters"}
    rows = {r["layer"]: r for r in node["details"]["preservation"]}
    assert rows["narrow"]["status"] == "ok" and rows["narrow"]["unique"] <= CLUSTERS
    # clustered per channel: each channel at most CLUSTERS values, the tensor more than one channel's palette
    assert rows["no_bias"]["status"] == "ok" and rows["no_bias"]["max_unique_per_channel"] <= CLUSTERS
    assert rows["no_bias"]["unique"] > CLUSTERS
