"""The ``ptq_16x8`` leaf: the baseline converted with int16 activations and int8 weights
(:func:`edgedeploy.tflite.convert16.convert_16x8`), calibrated on the same real samples as ``ptq`` and scored on the
evaluation split like every leaf."""

from __future__ import annotations

import time
from pathlib import Path

from edgedeploy.tflite.convert import gzip_size
from edgedeploy.tflite.convert16 import convert_16x8
from edgedeploy.config.data import Dataset
from edgedeploy.core.manifest import Metric
from edgedeploy.config.recipe import Recipe
from edgedeploy.core.stage import StageResult
from .leaf import start_keras_stage
from .scoring import float_scores, int8_scores, metric_details, metrics, task_of

MODEL_16X8 = "model_16x8.tflite"


def convert_leaf_16x8(env, leaf: str, inputs: dict[str, Path], out: Path, data: Dataset, recipe: Recipe) -> StageResult:
    start_keras_stage(recipe.seed)
    t0 = time.perf_counter()
    model = env.keras.models.load_model(inputs["model"], compile=False)
    float_scores_ = float_scores(model, data)
    calibration, calibrated_on = data.calibration(recipe.calibration_samples, recipe.seed)
    converted = convert_16x8(model, calibration, float_io=recipe.float_io, source=f"leaf {leaf}")
    target = out / MODEL_16X8
    target.write_bytes(converted)
    leaf_metrics = {
        **metrics(data, "float", float_scores_),
        # the leaf's integer model (int16 activations); its keys stay those of the other leaves for the report
        **metrics(data, "int8", int8_scores(converted, data)),
        "tflite_bytes": Metric(len(converted), "B", "measured"),
        "gzip_bytes": Metric(gzip_size(converted), "B", "measured"),
        "convert_seconds": Metric(round(time.perf_counter() - t0, 2), "s", "measured"),
    }
    return StageResult(
        outputs={"int8_model": target},  # the integer model compile takes (its activations are int16)
        metrics=leaf_metrics,
        details={"node": "baseline", "quantization": "16x8: int16 activations, int8 weights (per channel), "
                 "int64 bias", **({} if task_of(data).classifier else {"metric": metric_details(data)}),
                 "data": data.describe(), "calibration": calibrated_on,
                 "accuracy_split": data.describe()["eval_split"], "float_io": recipe.float_io},
        warnings=[],
    )
