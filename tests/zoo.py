"""A small zoo of the architectures that ship on Ethos-U, built from ``keras.applications`` (weights=None: nothing is
downloaded) and Keras layers, with tiny inputs so that each builds in seconds, and a data file for each.

Every builder takes the Keras module (tf_keras, or Keras 3) so that the same network is saved by either:
``build(keras, name)``. :func:`write_zoo` saves each as ``NAME.h5`` (tf_keras) or ``NAME.keras`` (Keras 3), with its
data ``NAME.npz``. Keras 3 runs in a process of its own (TF_USE_LEGACY_KERAS unset):

    python tests/zoo.py OUT_DIR --keras3 [NAME ...]

Weights are random (seeded; batch-norm statistics settled on seeded samples); the data are seeded random samples with a class cue a few steps can learn: the zoo
checks structure (which stages a network goes through, and why not), not accuracy.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any, Callable

import numpy as np

SEED = 0
IMAGE = (32, 32, 3)
# the recipe every zoo model runs with (the tests' and bench/bench_models.py's --recipe): structure, not accuracy
TINY_RECIPE = """# the zoo's tiny recipe: structure, not accuracy
epochs = 1
batch_size = 16
calibration_samples = 32
[training]
min_steps = 0
[selection]
validation_fraction = 0.0
"""
CLASSES = 4


def mobilenet_v1(k):
    return k.applications.MobileNet(input_shape=IMAGE, alpha=0.25, weights=None, classes=CLASSES)


def mobilenet_v2(k):
    return k.applications.MobileNetV2(input_shape=IMAGE, alpha=0.35, weights=None, classes=CLASSES)


def mobilenet_v2_transfer(k):
    """Transfer learning as users write it: a ``keras.applications`` base (no top) called as one layer of a
    Functional model, between a Rescaling input and a Dense head (a nested model, flattened by edgedeploy)."""
    L = k.layers
    inp = k.Input(IMAGE)
    x = L.Rescaling(1.0 / 127.5, offset=-1.0, name="rescale")(inp)
    base = k.applications.MobileNetV2(input_shape=IMAGE, alpha=0.35, include_top=False, weights=None)
    x = base(x)
    x = L.GlobalAveragePooling2D(name="avg_pool")(x)
    return k.Model(inp, L.Dense(CLASSES, activation="softmax", name="predictions")(x), name="mobilenet_v2_transfer")


def mobilenet_v3_small(k):
    """Hard-swish and squeeze-and-excitation (GlobalAveragePooling -> 1x1 Conv -> 1x1 Conv -> Multiply)."""
    return k.applications.MobileNetV3Small(input_shape=IMAGE, alpha=0.75, weights=None, classes=CLASSES,
                                           include_preprocessing=False)


def mobilenet_v3_small_minimalistic(k):
    """No hard-swish, no squeeze-and-excitation."""
    return k.applications.MobileNetV3Small(input_shape=IMAGE, alpha=0.75, minimalistic=True, weights=None,
                                           classes=CLASSES, include_preprocessing=False)


# EfficientNet-B0-like MBConv blocks: (expansion, output channels, stride)
MBCONV = ((1, 16, 1), (4, 24, 2), (4, 24, 1), (4, 40, 2))


def efficientnet_like(k, blocks: tuple[tuple[int, int, int], ...] = MBCONV):
    """EfficientNet-B0-like MBConv ``blocks`` (expansion, output channels, stride): swish, squeeze-and-excitation
    as GlobalAveragePooling -> Dense -> Dense -> Multiply, residual Adds where a block keeps its input's shape."""
    L = k.layers
    inp = k.Input(IMAGE)
    x = L.Conv2D(16, 3, strides=2, padding="same", use_bias=False, name="stem_conv")(inp)
    x = L.BatchNormalization(name="stem_bn")(x)
    x = L.Activation("swish", name="stem_swish")(x)
    for i, (expand, out, stride) in enumerate(blocks):
        p = f"block{i}_"
        width = int(x.shape[-1]) * expand
        y = x
        if expand != 1:
            y = L.Conv2D(width, 1, use_bias=False, name=p + "expand")(y)
            y = L.BatchNormalization(name=p + "expand_bn")(y)
            y = L.Activation("swish", name=p + "expand_swish")(y)
        y = L.DepthwiseConv2D(3, strides=stride, padding="same", use_bias=False, name=p + "dw")(y)
        y = L.BatchNormalization(name=p + "dw_bn")(y)
        y = L.Activation("swish", name=p + "dw_swish")(y)
        s = L.GlobalAveragePooling2D(name=p + "se_squeeze")(y)
        s = L.Dense(max(4, width // 4), activation="swish", name=p + "se_reduce")(s)
        s = L.Dense(width, activation="sigmoid", name=p + "se_expand")(s)
        s = L.Reshape((1, 1, width), name=p + "se_reshape")(s)
        y = L.Multiply(name=p + "se_excite")([y, s])
        y = L.Conv2D(out, 1, use_bias=False, name=p + "project")(y)
        y = L.BatchNormalization(name=p + "project_bn")(y)
        x = L.Add(name=p + "add")([x, y]) if stride == 1 and int(x.shape[-1]) == out else y
    x = L.Conv2D(128, 1, use_bias=False, name="top_conv")(x)
    x = L.BatchNormalization(name="top_bn")(x)
    x = L.Activation("swish", name="top_swish")(x)
    x = L.GlobalAveragePooling2D(name="avg_pool")(x)
    return k.Model(inp, L.Dense(CLASSES, activation="softmax", name="predictions")(x), name="efficientnet_like")


def resnet_like(k):
    """Residual blocks with identity and projection shortcuts, and a depthwise convolution with multiplier 2."""
    L = k.layers
    inp = k.Input(IMAGE)
    x = L.Conv2D(16, 3, padding="same", name="stem_conv")(inp)
    x = L.BatchNormalization(name="stem_bn")(x)
    x = L.ReLU(name="stem_relu")(x)
    x = L.DepthwiseConv2D(3, depth_multiplier=2, padding="same", name="stem_dw")(x)  # 16 -> 32 channels
    for i, (width, stride) in enumerate(((16, 1), (32, 2), (32, 1))):
        p = f"res{i}_"
        y = L.Conv2D(width, 3, strides=stride, padding="same", name=p + "conv1")(x)
        y = L.BatchNormalization(name=p + "bn1")(y)
        y = L.ReLU(name=p + "relu1")(y)
        y = L.Conv2D(width, 3, padding="same", name=p + "conv2")(y)
        y = L.BatchNormalization(name=p + "bn2")(y)
        if stride != 1 or int(x.shape[-1]) != width:
            x = L.Conv2D(width, 1, strides=stride, name=p + "shortcut")(x)
        x = L.ReLU(name=p + "relu2")(L.Add(name=p + "add")([x, y]))
    x = L.GlobalAveragePooling2D(name="avg_pool")(x)
    return k.Model(inp, L.Dense(CLASSES, activation="softmax", name="predictions")(x), name="resnet_like")


def densenet_like(k):
    """Dense blocks (each layer's output concatenated to its input) and transitions."""
    L = k.layers
    inp = k.Input(IMAGE)
    x = L.Conv2D(16, 3, strides=2, padding="same", use_bias=False, name="stem_conv")(inp)
    for b in range(2):
        for i in range(3):
            p = f"dense{b}_{i}_"
            y = L.BatchNormalization(name=p + "bn")(x)
            y = L.ReLU(name=p + "relu")(y)
            y = L.Conv2D(8, 3, padding="same", use_bias=False, name=p + "conv")(y)
            x = L.Concatenate(name=p + "concat")([x, y])
        x = L.BatchNormalization(name=f"transition{b}_bn")(x)
        x = L.ReLU(name=f"transition{b}_relu")(x)
        x = L.Conv2D(int(x.shape[-1]) // 2, 1, use_bias=False, name=f"transition{b}_conv")(x)
        x = L.AveragePooling2D(2, name=f"transition{b}_pool")(x)
    x = L.GlobalAveragePooling2D(name="avg_pool")(x)
    return k.Model(inp, L.Dense(CLASSES, activation="softmax", name="predictions")(x), name="densenet_like")


KWS_INPUT = (49, 10)


def conv1d_kws(k):
    """A keyword spotter on 49 frames of 10 MFCCs: Conv1D blocks, global pooling, softmax."""
    L = k.layers
    inp = k.Input(KWS_INPUT)
    x = inp
    for i, width in enumerate((32, 32, 48)):
        x = L.Conv1D(width, 3, strides=2 if i else 1, padding="same", use_bias=False, name=f"conv{i}")(x)
        x = L.BatchNormalization(name=f"bn{i}")(x)
        x = L.ReLU(name=f"relu{i}")(x)
    x = L.GlobalAveragePooling1D(name="avg_pool")(x)
    return k.Model(inp, L.Dense(CLASSES, activation="softmax", name="predictions")(x), name="conv1d_kws")


AE_FEATURES = 64


def dense_autoencoder(k):
    """A dense autoencoder (anomaly detection), trained on its inputs: the data file holds no targets."""
    L = k.layers
    inp = k.Input((AE_FEATURES,))
    x = L.Dense(32, activation="relu", name="enc0")(inp)
    x = L.Dense(8, activation="relu", name="code")(x)
    x = L.Dense(32, activation="relu", name="dec0")(x)
    return k.Model(inp, L.Dense(AE_FEATURES, name="reconstruction")(x), name="dense_autoencoder")


def two_outputs(k):
    """A shared trunk with two heads (a classifier and a regressor), as detection heads have."""
    L = k.layers
    inp = k.Input(IMAGE)
    x = L.Conv2D(16, 3, strides=2, padding="same", activation="relu", name="conv0")(inp)
    x = L.Conv2D(32, 3, strides=2, padding="same", activation="relu", name="conv1")(x)
    x = L.GlobalAveragePooling2D(name="avg_pool")(x)
    cls = L.Dense(CLASSES, activation="softmax", name="class")(x)
    box = L.Dense(4, name="box")(x)
    return k.Model(inp, [cls, box], name="two_outputs")


# name -> (builder, what it brings)
ZOO: dict[str, tuple[Callable, str]] = {
    "mobilenet_v1": (mobilenet_v1, "depthwise-separable convolutions, ReLU6 (alpha 0.25)"),
    "mobilenet_v2": (mobilenet_v2, "inverted residuals (alpha 0.35)"),
    "mobilenet_v2_transfer": (mobilenet_v2_transfer, "MobileNetV2 base (no top) nested in a Functional model: "
                                                     "Rescaling input, Dense head"),
    "mobilenet_v3_small": (mobilenet_v3_small, "hard-swish, squeeze-and-excitation (alpha 0.75)"),
    "mobilenet_v3_small_minimalistic": (mobilenet_v3_small_minimalistic, "no hard-swish, no SE (alpha 0.75)"),
    "efficientnet_like": (efficientnet_like, "MBConv: swish, SE (GAP -> Dense -> Dense -> Multiply)"),
    "resnet_like": (resnet_like, "residual Adds, projection shortcuts, depthwise multiplier 2"),
    "densenet_like": (densenet_like, "Concatenate-heavy dense blocks"),
    "conv1d_kws": (conv1d_kws, "Conv1D keyword spotter"),
    "dense_autoencoder": (dense_autoencoder, "dense autoencoder, inputs-only data"),
    "two_outputs": (two_outputs, "two outputs (classifier and regressor)"),
}


def build(keras, name: str, **options):
    """The zoo model ``name`` (its builder given ``options``), its batch norms' statistics settled on seeded
    samples (:func:`settle_batch_norm`)."""
    keras.utils.set_random_seed(SEED)
    model = ZOO[name][0](keras, **options)
    shape = tuple(int(d) for d in model.inputs[0].shape[1:])
    settle_batch_norm(model, np.random.default_rng(SEED).normal(size=(32, *shape)).astype(np.float32))
    return model


def settle_batch_norm(model, x: np.ndarray) -> None:
    """Sets every batch norm's moving mean and variance to its input's statistics on ``x``, as training would.

    Freshly initialised, a batch norm is the identity, and through a deep net (MobileNet-v2's 52 layers) the
    activations shrink towards zero: the int8 scales would be ~1e-9, which no trained model has and which TFLite's
    reference kernels refuse. One forward pass in training mode with momentum 0 normalises every layer's input
    with its batch statistics and stores them."""
    norms = [layer for layer in _layers(model) if layer.__class__.__name__ == "BatchNormalization"]
    momenta = [layer.momentum for layer in norms]
    for layer in norms:
        layer.momentum = 0.0
    model(x, training=True)
    for layer, momentum in zip(norms, momenta):
        layer.momentum = momentum


def _layers(model) -> list:
    """Every layer of ``model``, those of the models nested in it included."""
    out = []
    for layer in model.layers:
        out += _layers(layer) if hasattr(layer, "layers") else [layer]
    return out


def write_data(model, path: Path, n_fit: int = 64, n_eval: int = 32) -> Path:
    """Seeded random samples for ``model``: ``x``/``y``/``split`` with a class cue (the first input rows brighter
    for higher classes); for the autoencoder ``x_train``/``x_test`` only; for several outputs one target per output
    (``y`` the first output's classes, ``y_box`` the second's values)."""
    rng = np.random.default_rng(SEED)
    shape = tuple(int(d) for d in model.inputs[0].shape[1:])
    n = n_fit + n_eval
    x = rng.normal(size=(n, *shape)).astype(np.float32)
    if len(shape) == 1 and int(model.outputs[0].shape[-1]) == shape[0]:
        np.savez(path, x_train=x[:n_fit], x_test=x[n_fit:])
        return path
    y = rng.integers(0, CLASSES, n)
    x[np.arange(n), y] += 2.0  # a learnable cue on the first axis
    arrays = {"x": x, "y": y, "split": np.r_[np.zeros(n_fit, int), np.ones(n_eval, int)]}
    if len(model.outputs) > 1:
        arrays["y_box"] = rng.normal(size=(n, int(model.outputs[1].shape[-1]))).astype(np.float32)
    np.savez(path, **arrays)
    return path


def write_zoo(keras, out: Path, names: list[str] | None = None, suffix: str = ".h5", n_fit: int = 64,
              n_eval: int = 32) -> dict[str, Path]:
    """Saves each named zoo model as ``out/NAME{suffix}`` with its data ``out/NAME.npz`` (``n_fit`` fine-tune and
    ``n_eval`` evaluation samples, :func:`write_data`); returns the model paths."""
    out.mkdir(parents=True, exist_ok=True)
    return {name: write_net(keras, out, name, suffix, n_fit, n_eval) for name in names or list(ZOO)}


def write_net(keras, out: Path, name: str, suffix: str = ".h5", n_fit: int = 64, n_eval: int = 32,
              **options: Any) -> Path:
    """Saves the zoo model ``name`` (its builder given ``options``) as ``out/NAME{suffix}`` with its data
    ``out/NAME.npz`` (:func:`write_data`); returns the model's path."""
    model = build(keras, name, **options)
    model.save(out / f"{name}{suffix}")
    write_data(model, out / f"{name}.npz", n_fit, n_eval)
    return out / f"{name}{suffix}"


def main(argv: list[str]) -> int:
    out, rest = Path(argv[0]), argv[1:]
    keras3 = "--keras3" in rest
    names = [a for a in rest if not a.startswith("--")] or None
    if keras3:
        import keras
    else:
        sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
        from edgedeploy.keras import tfenv

        keras = tfenv.load().keras
    for name, path in write_zoo(keras, out, names, ".keras" if keras3 else ".h5").items():
        print(name, path)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
