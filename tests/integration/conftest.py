from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def float_tflite(shared_data, tmp_path_factory) -> Path:
    """A float32 TFLite of the MLPerf DS-CNN, converted here with TensorFlow (no quantization)."""
    from edgedeploy import tfenv

    env = tfenv.load()
    model = env.keras.models.load_model(shared_data / "kws" / "dscnn_mlperf_float.h5", compile=False)
    converter = env.tf.lite.TFLiteConverter.from_keras_model(model)
    path = tmp_path_factory.mktemp("float") / "dscnn_float.tflite"
    path.write_bytes(converter.convert())
    return path
