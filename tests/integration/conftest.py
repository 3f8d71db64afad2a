from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
TFLM_TREE = Path(os.environ.get("EDGEDEPLOY_TFLM_DIR") or REPO.parent / "shared" / "third_party" / "tflm-cortex-m55")
FIRMWARE_TOOLS = ("arm-none-eabi-gcc", "arm-none-eabi-g++", "cmake", "qemu-system-arm")


@pytest.fixture(scope="session")
def tflm_cache(tmp_path_factory) -> Path:
    """One cache of built TFLM libraries for every firmware test of the run (a cold build takes about 40 s)."""
    missing = [t for t in FIRMWARE_TOOLS if shutil.which(t) is None]
    if missing:
        pytest.skip(f"{', '.join(missing)} not installed (.ci/run installs them)")
    if not (TFLM_TREE / "tensorflow").is_dir():
        pytest.skip(f"no TFLM tree at {TFLM_TREE} (set EDGEDEPLOY_TFLM_DIR)")
    given = os.environ.get("EDGEDEPLOY_TEST_TFLM_CACHE")
    return Path(given) if given else tmp_path_factory.mktemp("tflm-cache")


@pytest.fixture(scope="session")
def float_tflite(shared_data, tmp_path_factory) -> Path:
    """A float32 TFLite of the MLPerf DS-CNN, converted here with TensorFlow (no quantization)."""
    from edgedeploy.keras import tfenv

    env = tfenv.load()
    model = env.keras.models.load_model(shared_data / "kws" / "dscnn_mlperf_float.h5", compile=False)
    converter = env.tf.lite.TFLiteConverter.from_keras_model(model)
    path = tmp_path_factory.mktemp("float") / "dscnn_float.tflite"
    path.write_bytes(converter.convert())
    return path


@pytest.fixture(scope="session")
def reverse_tflite(tmp_path_factory) -> Path:
    """A small full-int8 model with a REVERSE_V2 that Ethos-U55 cannot run (Ethos-U85 can).

    Calibrated on seeded random inputs: the test is about operator placement, not accuracy.
    """
    import numpy as np

    from edgedeploy.keras import tfenv

    env = tfenv.load()
    tf, keras = env.tf, env.keras
    keras.utils.set_random_seed(0)
    inp = keras.Input((8, 8, 4), batch_size=1)
    x = keras.layers.Conv2D(8, 3, padding="same", activation="relu")(inp)
    x = keras.layers.Lambda(lambda t: tf.reverse(t, axis=[1]))(x)
    out = keras.layers.Dense(4)(keras.layers.Flatten()(x))
    converter = tf.lite.TFLiteConverter.from_keras_model(keras.Model(inp, out))
    converter.optimizations = [tf.lite.Optimize.DEFAULT]
    rng = np.random.default_rng(0)
    converter.representative_dataset = lambda: ([rng.normal(size=(1, 8, 8, 4)).astype("float32")] for _ in range(16))
    converter.target_spec.supported_ops = [tf.lite.OpsSet.TFLITE_BUILTINS_INT8]
    converter.inference_input_type = converter.inference_output_type = tf.int8
    path = tmp_path_factory.mktemp("reverse") / "reverse_int8.tflite"
    path.write_bytes(converter.convert())
    return path


@pytest.fixture(scope="session")
def _ray_home(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("ray-home")


@pytest.fixture
def ray_home(_ray_home, monkeypatch) -> Path:
    """One HOME for every test that starts a local Ray head.

    Ray keeps the authentication token of a local head under ``~/.ray`` and caches it in the process; with a
    new HOME per test, a second head in the same process would look for it where it never was written.
    """
    monkeypatch.setenv("HOME", str(_ray_home))
    return _ray_home
