"""Makes the small float input models that tests load instead of fitting them, and builds the data they were trained on.

    cd REPO && PYTHONPATH=src python tests/data/models/make_models.py   # rewrites tests/data/models/*.h5
    cd REPO && PYTHONPATH=src python tests/data/models/make_models.py --kws   # only the kws_*.h5 models
    cd REPO && PYTHONPATH=src python tests/data/models/make_models.py --kws kws_shapes   # only kws_shapes.h5

The first two and the ``kws_`` models are trained (seeded) on the bundled Speech Commands subset
(examples/kws_tree/speech_commands_subset.npz):

- ``autoencoder.h5``: an MLPerf Tiny anomaly-detection-style Dense autoencoder (Dense/BatchNorm/ReLU blocks down to
  an 8-unit bottleneck and back, linear output) fitted to reconstruct the standardized MFCC features of six keyword
  classes (a seeded choice), 8 epochs;
- ``denoiser.h5``: three 3x3 convolutions mapping noisy MFCC maps to the clean ones, 4 epochs;
- ``kws_conv1d.h5``, ``kws_mlp.h5``, ``kws_shapes.h5`` (:data:`KWS_MODELS`): small
  classifiers of the subset's MFCC features holding layer shapes the deployment tree rewrites, 6 epochs;
- ``tiny_dscnn_B_W.h5``: a DS-CNN of ``B`` depthwise/pointwise blocks after a ``W``-channel first convolution, for 10x8
  inputs of 4 classes (:func:`tiny_arrays`: seeded noise with a learnable class cue, 240 fine-tune and 120 evaluation
  samples), 2 epochs; saved compiled, with its optimizer.

The tests build the same data with :func:`anomaly_arrays`, :func:`denoise_arrays` and :func:`tiny_arrays` (pure NumPy,
seeded), so a model and its data always agree. The autoencoder, the denoiser and the ``kws_`` models are saved
uncompiled: the loss must come from the data.
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


TINY = ((0, 64), (1, 64), (2, 32))  # (blocks, width) of the tiny DS-CNNs


def tiny_arrays(n_fit: int = 240, n_eval: int = 120) -> dict:
    """``x`` (10x8x1 Gaussian noise, 2.5 added to row ``2 * y``: a learnable class cue), ``y`` (4 classes) and
    ``split``."""
    rng = np.random.default_rng(SEED)
    y = rng.integers(0, 4, n_fit + n_eval)
    x = rng.normal(size=(len(y), 10, 8, 1)).astype(np.float32)
    x[np.arange(len(y)), y * 2, :, 0] += 2.5
    return {"x": x, "y": y, "split": np.r_[np.zeros(n_fit, int), np.ones(n_eval, int)]}


def tiny_dscnn(blocks: int, width: int, out: Path = HERE) -> Path:
    return out / f"tiny_dscnn_{blocks}_{width}.h5"


def _tiny_dscnn(keras, blocks: int, width: int, out: Path) -> None:
    keras.utils.set_random_seed(SEED)
    inp = keras.Input((10, 8, 1))
    x = keras.layers.Conv2D(width, 3, padding="same", name="conv")(inp)
    x = keras.layers.BatchNormalization()(x)
    x = keras.layers.ReLU()(x)
    for i in range(blocks):
        x = keras.layers.DepthwiseConv2D(3, padding="same", name=f"dw{i}")(x)
        x = keras.layers.BatchNormalization()(x)
        x = keras.layers.ReLU()(x)
        x = keras.layers.Conv2D(64, 1, name=f"pw{i}")(x)
        x = keras.layers.BatchNormalization()(x)
        x = keras.layers.ReLU()(x)
    x = keras.layers.GlobalAveragePooling2D()(x)
    model = keras.Model(inp, keras.layers.Dense(4, activation="softmax", name="fc")(x))
    model.compile("adam", "sparse_categorical_crossentropy")
    d = tiny_arrays()
    model.fit(d["x"][d["split"] == 0], d["y"][d["split"] == 0], epochs=2, verbose=0)
    model.save(tiny_dscnn(blocks, width, out))


KWS_MODELS = ("kws_conv1d", "kws_mlp", "kws_shapes")  # small models of the real KWS features


def _kws_model(keras, name: str):
    """The float model ``name`` of :data:`KWS_MODELS`, seeded (tests/integration/optimize/test_optimize.py says what
    each shape is there for)."""
    L = keras.layers
    if name == "kws_conv1d":  # Conv1D -> BatchNorm -> ReLU, max pooling, a dilated causal Conv1D
        inp = keras.Input((49, 10))
        x = L.Conv1D(24, 5, padding="same", use_bias=False, name="c1")(inp)
        x = L.ReLU(name="relu")(L.BatchNormalization(name="bn")(x))
        x = L.MaxPooling1D(2)(x)
        x = L.Conv1D(32, 3, padding="causal", dilation_rate=2, activation="relu", name="c2")(x)
        x = L.GlobalAveragePooling1D()(x)
    elif name == "kws_mlp":  # Dense -> BatchNorm -> ReLU blocks
        inp = keras.Input((49, 10, 1))
        x = L.Flatten()(inp)
        for i in range(2):
            x = L.ReLU(name=f"relu{i}")(L.BatchNormalization(name=f"bn{i}")(L.Dense(64, name=f"fc{i}")(x)))
    else:  # kws_shapes: a Concatenate fed by convolutions, SeparableConv2D -> BatchNorm -> ReLU, a ReLU6 layer and
        # an Activation("relu") layer after 1x1 convolutions
        inp = keras.Input((49, 10, 1))
        x = L.Conv2D(16, (5, 3), strides=2, padding="same", activation="relu", name="stem")(inp)
        a = L.Conv2D(16, 1, activation="relu", name="branch_1x1")(x)
        b = L.Conv2D(16, 3, padding="same", activation="relu", name="branch_3x3")(x)
        c = L.AveragePooling2D(3, strides=1, padding="same")(x)
        x = L.Concatenate(name="cat")([a, b, c])  # 48 channels
        x = L.SeparableConv2D(32, 3, padding="same", name="sep")(x)
        x = L.ReLU(name="relu")(L.BatchNormalization(name="bn")(x))
        x = L.ReLU(6.0, name="pw_relu")(L.Conv2D(24, 1, name="pw")(x))
        x = L.Activation("relu", name="out_relu")(L.Conv2D(20, 1, name="out")(x))
        x = L.GlobalAveragePooling2D()(x)
    return keras.Model(inp, L.Dense(12, activation="softmax", name="head")(x))


def kws_models(out: Path = HERE, names=KWS_MODELS) -> None:
    """:data:`KWS_MODELS` (or those of ``names``), each fitted (seeded) for 6 epochs on the bundled subset's 900
    fine-tune clips."""
    from edgedeploy.keras import tfenv

    keras = tfenv.load().keras
    d = np.load(SUBSET)
    fit = d["split"] == 0
    for name in names:
        tfenv.set_seed(SEED)
        model = _kws_model(keras, name)
        x = d["x"][fit][..., 0] if name == "kws_conv1d" else d["x"][fit]
        model.compile(keras.optimizers.Adam(1e-3), "sparse_categorical_crossentropy")
        model.fit(x, d["y"][fit], epochs=6, batch_size=32, verbose=0)
        _save(keras, model, out / f"{name}.h5")


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

    for blocks, width in TINY:
        _tiny_dscnn(keras, blocks, width, out)
    kws_models(out)


if __name__ == "__main__":
    import sys

    kws_models(names=sys.argv[2:] or KWS_MODELS) if sys.argv[1:2] == ["--kws"] else main()
