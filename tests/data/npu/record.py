"""Record the NPU model's test data: Vela's raw output and TFLite reference outputs for a few real inputs.

Run from the repository root: ``.venv/bin/python tests/data/npu/record.py [NAME ...]`` (all models, or those
named; needs ../shared/data for ResNet-8).
Vela runs in a subprocess with the built-in targets' settings; the reference outputs come from
LiteRT's interpreter with its reference kernels (BUILTIN_REF).
"""

from __future__ import annotations

import shutil
import sys
import tempfile
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[3]
HERE = Path(__file__).resolve().parent
SHARED = REPO.parent / "shared" / "data"
CASES = 8
MODELS = {
    "dscnn_u55_128": (REPO / "examples/kws/dscnn_mlperf_int8.tflite", "ethos-u55-128",
                      REPO / "examples/kws_tree/speech_commands_subset.npz"),
    "resnet8_u65_256": (SHARED / "ic/resnet8_mlperf_int8.tflite", "ethos-u65-256", SHARED / "ic/cifar10_jpeg_subset.npz"),
    # int16 activations: the bundled float DS-CNN converted 16x8 here (its softmax uses interpolated lookup tables)
    "dscnn16x8_u55_128": (None, "ethos-u55-128", REPO / "examples/kws_tree/speech_commands_subset.npz"),
    "dscnn_u85_256": (REPO / "examples/kws/dscnn_mlperf_int8.tflite", "ethos-u85-256",
                      REPO / "examples/kws_tree/speech_commands_subset.npz"),
    "dscnn_u85_512": (REPO / "examples/kws/dscnn_mlperf_int8.tflite", "ethos-u85-512",
                      REPO / "examples/kws_tree/speech_commands_subset.npz"),
    # a network of dense random weights, some of which Vela 5.2 writes in the U85's fast weight format (FWD)
    "fwd_convs_u85_256": (HERE / "fwd_convs_int8.tflite", "ethos-u85-256", None),
    "fwd_convs_u85_512": (HERE / "fwd_convs_int8.tflite", "ethos-u85-512", None),
}
FWD_INPUT = (12, 12, 3)
FLOAT_DSCNN = REPO / "examples/kws_tree/dscnn_mlperf_float.h5"
CALIBRATION = 100


def vela_raw(model: Path, target_name: str, out: Path) -> Path:
    from edgedeploy.core.proc import check, run_command
    from edgedeploy.config.targets import get_target
    from edgedeploy.vela.outputs import build_vela_args

    args = build_vela_args(model, get_target(target_name), out, "Performance", ("--output-format", "raw"))
    check(run_command([sys.executable, "-m", "ethosu.vela", *args], timeout=300), "vela")
    return next(out.glob("*_vela.npz"))


def rows(data: Path, n: int) -> np.ndarray:
    with np.load(data) as npz:
        if "x_test" in npz:
            return npz["x_test"][:n].astype(np.float32)
        eval_rows = np.flatnonzero(npz["split"] == 1)[:n]
        return npz["x"][eval_rows].astype(np.float32)


def reference(model: Path, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    from edgedeploy.export.golden_vectors import prepare_inputs
    from edgedeploy.tflite.interpreter import make_interpreter
    from edgedeploy.tflite.reader import read_tflite

    typed, _ = prepare_inputs(x, read_tflite(model).inputs[0])
    interp = make_interpreter(model, reference=True)
    i, o = interp.get_input_details()[0], interp.get_output_details()[0]
    outs = []
    for c in range(typed.shape[0]):
        interp.set_tensor(i["index"], typed[c : c + 1])
        interp.invoke()
        outs.append(interp.get_tensor(o["index"])[0].copy())
    return typed, np.stack(outs)


def dscnn_16x8(data: Path, out: Path) -> Path:
    """The bundled float DS-CNN converted with int16 activations, calibrated on the first fine-tune rows."""
    from edgedeploy.keras.model import load_model
    from edgedeploy.tflite.convert16 import convert_16x8

    with np.load(data) as npz:
        calibration = npz["x"][np.flatnonzero(npz["split"] == 0)[:CALIBRATION]].astype(np.float32)
    path = out / "dscnn_16x8.tflite"
    path.write_bytes(convert_16x8(load_model(FLOAT_DSCNN)[0], calibration))
    return path


def fwd_convs(path: Path) -> Path:
    """A small int8 convolution network (seeded): a 5x5 stride-2 convolution, a 3x3 one (48 input channels, the
    one Vela writes in FWD) and a fully-connected layer of uniform random weights, which do not compress, a 1x1
    convolution of 4 distinct weights and a 3x3 one of 14 (each channel's set the same up to its scale), which
    the standard format compresses better."""
    from edgedeploy.keras import tfenv
    from edgedeploy.tflite.convert import function_converter

    t = tfenv.load()
    tf, keras = t.tf, t.keras
    L = keras.layers
    rng = np.random.default_rng(7)
    inp = keras.Input(FWD_INPUT)
    x = L.Conv2D(48, 5, strides=2, padding="same", activation="relu", name="pkf")(inp)
    x = L.Conv2D(32, 3, padding="same", activation="relu", name="dense3x3")(x)
    x = L.Conv2D(32, 1, activation="relu", name="lut4")(x)
    x = L.Conv2D(20, 3, padding="same", name="lut16")(x)
    out = L.Dense(10, name="fc")(L.GlobalAveragePooling2D()(x))
    model = keras.Model(inp, out)
    for layer in model.layers:
        if not layer.weights:
            continue
        kernel, bias = layer.get_weights()
        if layer.name == "lut4":
            kernel = rng.choice([-1.0, -1 / 3, 1 / 3, 1.0], size=kernel.shape)
        elif layer.name == "lut16":
            kernel = rng.choice([k / 7 for k in range(-7, 8) if k], size=kernel.shape)
            kernel[0, 0, 0, :], kernel[0, 0, 1, :] = 1.0, -1.0  # every channel spans the same range
        else:
            kernel = rng.uniform(-1.0, 1.0, size=kernel.shape)
        bias = rng.normal(scale=0.1, size=bias.shape)
        layer.set_weights([(kernel * 0.2).astype(np.float32), bias.astype(np.float32)])
    conv = function_converter(model)
    conv.optimizations = [tf.lite.Optimize.DEFAULT]
    conv.representative_dataset = lambda: ([rng.normal(size=(1,) + FWD_INPUT).astype(np.float32)] for _ in range(30))
    conv.target_spec.supported_ops = [tf.lite.OpsSet.TFLITE_BUILTINS_INT8]
    conv.inference_input_type = conv.inference_output_type = tf.int8
    path.write_bytes(conv.convert())
    return path


def main(names: list[str]) -> None:
    for name, (model, target, data) in MODELS.items():
        if names and name not in names:
            continue
        with tempfile.TemporaryDirectory() as tmp:
            model = model or dscnn_16x8(data, Path(tmp))
            if data is None:  # weights only: no reference cases
                if not model.exists():
                    fwd_convs(model)
                shutil.copy(vela_raw(model, target, Path(tmp)), HERE / f"{name}_vela.npz")
                print(f"{name}: {target}")
                continue
            shutil.copy(vela_raw(model, target, Path(tmp)), HERE / f"{name}_vela.npz")
            x, y = reference(model, rows(data, CASES))
        np.savez(HERE / f"{name}_cases.npz", x=x, y=y)
        print(f"{name}: {target}, {CASES} cases")


if __name__ == "__main__":
    main(sys.argv[1:])
