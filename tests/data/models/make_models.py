"""Makes the small float input models that the task tests load, and the data they were trained on.

    cd REPO && PYTHONPATH=src python tests/data/models/make_models.py   # rewrites tests/data/models/*.h5

Both models are trained (seeded) on the bundled Speech Commands subset (examples/kws_tree/speech_commands_subset.npz):

- ``autoencoder.h5``: an MLPerf Tiny anomaly-detection-style Dense autoencoder (Dense/BatchNorm/ReLU blocks down to
  an 8-unit bottleneck and back, linear output) fitted to reconstruct the standardized MFCC features of six keyword
  classes (a seeded choice), 8 epochs;
- ``denoiser.h5``: three 3x3 convolutions mapping noisy MFCC maps to the clean ones, 4 epochs.

The tests build the same data with :func:`anomaly_arrays` and :func:`denoise_arrays` (pure NumPy, seeded), so a model
and its data always agree. Both are saved uncompiled: the loss must come from the data.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

SEED = 0
UNITS = (32, 32, 8, 32, 32)  # (MLPerf Tiny AD: 128 x4, 8, 128 x4; two narrow blocks each side here)
HERE = Path(__file__).resolve().parent
SUBSET = HERE.parents[2] / "examples" / "kws_tree" / "speech_commands_subset.npz"


def _features(src: Path = SUBSET):
    d = np.load(src)
    return d["x"].reshape(len(d["x"]), -1).astype(np.float32), d["y"], d["split"]


def anomaly_arrays(src: Path = SUBSET) -> dict:
    """``x`` (standardized on the normal fine-tune clips), ``split`` and ``y_anomaly`` (1: a class outside the six
    normal ones); the fine-tune split holds normal clips only, the evaluation split every clip."""
    x, y, split = _features(src)
    normal = np.random.default_rng(SEED).choice(np.unique(y), 6, replace=False)
    is_normal = np.isin(y, normal)
    keep = (split == 1) | ((split == 0) & is_normal)
    fit = (split == 0) & is_normal
    mu, sd = x[fit].mean(axis=0), x[fit].std(axis=0) + 1e-6
    return {"x": ((x - mu) / sd)[keep], "split": split[keep], "y_anomaly": (~is_normal[keep]).astype(np.int64)}


def denoise_arrays(src: Path = SUBSET) -> dict:
    """``x`` (standardized MFCC maps plus seeded Gaussian noise of standard deviation 0.5), ``y`` (the clean maps)
    and ``split``: every clip of the subset."""
    x, _, split = _features(src)
    clean = x.reshape(-1, 49, 10, 1)
    clean = (clean - clean.mean()) / clean.std()
    noisy = (clean + np.random.default_rng(SEED).normal(0, 0.5, clean.shape)).astype(np.float32)
    return {"x": noisy, "y": clean.astype(np.float32), "split": split}


def _save(keras, model, path: Path) -> None:
    plain = keras.models.clone_model(model)
    plain.set_weights(model.get_weights())
    plain.save(path, include_optimizer=False)


def main(out: Path = HERE) -> None:
    from edgedeploy.keras import tfenv

    keras = tfenv.load().keras
    tfenv.set_seed(SEED)
    d = anomaly_arrays()
    x = d["x"][d["split"] == 0]
    inp = keras.Input((x.shape[1],))
    h = inp
    for n in UNITS:
        h = keras.layers.ReLU()(keras.layers.BatchNormalization()(keras.layers.Dense(n)(h)))
    model = keras.Model(inp, keras.layers.Dense(x.shape[1])(h))
    model.compile(keras.optimizers.Adam(1e-3), "mse")
    model.fit(x, x, epochs=8, batch_size=64, verbose=0)
    _save(keras, model, out / "autoencoder.h5")

    tfenv.set_seed(SEED)
    d = denoise_arrays()
    fit = d["split"] == 0
    inp = keras.Input((49, 10, 1))
    h = keras.layers.Conv2D(16, 3, padding="same", activation="relu")(inp)
    h = keras.layers.Conv2D(16, 3, padding="same", activation="relu")(h)
    model = keras.Model(inp, keras.layers.Conv2D(1, 3, padding="same")(h))
    model.compile(keras.optimizers.Adam(2e-3), "mse")
    model.fit(d["x"][fit], d["y"][fit], epochs=4, batch_size=64, verbose=0)
    _save(keras, model, out / "denoiser.h5")


if __name__ == "__main__":
    main()
