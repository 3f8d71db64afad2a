"""A node's or a leaf's metrics on the evaluation split, by its task (:mod:`edgedeploy.config.task`).

Classifiers keep the manifest keys ``float_accuracy`` / ``int8_accuracy`` (%); other tasks record
``float_<metric>`` / ``int8_<metric>`` for each of their metrics (``mse``, ``mae``, ``psnr``, ``auc``), and every
record names its primary metric, its unit and its direction in ``details["metric"]``.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from edgedeploy.tflite.convert import tflite_predict, tflite_predict_all
from edgedeploy.core.manifest import Metric
from edgedeploy.config.task import METRICS, Task, score

CLASSIFIER = Task("sparse_categorical_crossentropy", False, "default")


def task_of(data) -> Task:
    return getattr(data, "task", None) or CLASSIFIER


def _heads(data) -> list[tuple[str | None, Any]]:
    """Each output's name (None for the first) and data set: a model with several outputs scores each on its own
    targets, the first output's metrics keeping their keys, another's named ``<output>/<metric>``."""
    return [(None, data), *getattr(data, "others", ())]


def _scored(data, outputs: list[np.ndarray]) -> dict[str, float]:
    out: dict[str, float] = {}
    for (name, d), o in zip(_heads(data), outputs):
        values = score(task_of(d), o, d.y_eval, d.x_eval, getattr(d, "anomaly", None))
        out.update({k if name is None else f"{name}/{k}": v for k, v in values.items()})
    return out


def float_scores(model, data) -> dict[str, float]:
    outputs = model.predict(data.x_eval, batch_size=256, verbose=0)
    return _scored(data, list(outputs) if getattr(data, "others", None) else [outputs])


def tflite_float_outputs(model_bytes: bytes, x: np.ndarray) -> np.ndarray:
    """The int8 model's outputs on ``x``, dequantized to float (its first output's)."""
    return tflite_all_float_outputs(model_bytes, x)[0]


def tflite_all_float_outputs(model_bytes: bytes, x: np.ndarray) -> list[np.ndarray]:
    """Every output of the int8 model on ``x``, dequantized to float, in its order (the Keras model's)."""
    from edgedeploy.tflite.interpreter import make_interpreter

    raws = tflite_predict_all(model_bytes, x)
    it = make_interpreter(model_bytes, allocate_now=False)
    out = []
    for raw, detail in zip(raws, it.get_output_details()):
        if detail["dtype"] == np.float32:
            out.append(raw.astype(np.float32))
            continue
        scale, zero = detail["quantization"]
        out.append(((raw.astype(np.float32) - zero) * scale).astype(np.float32))
    return out


def int8_scores(model_bytes: bytes, data) -> dict[str, float]:
    heads = _heads(data)
    if len(heads) > 1:
        floats = tflite_all_float_outputs(model_bytes, data.x_eval)
        return _scored(data, [o.reshape(len(o), -1) if task_of(d).classifier else o for (_, d), o in zip(heads, floats)])
    task = task_of(data)
    outputs = tflite_float_outputs(model_bytes, data.x_eval) if not task.classifier else tflite_predict(
        model_bytes, data.x_eval).reshape(len(data.x_eval), -1)
    return score(task, outputs, data.y_eval, data.x_eval, getattr(data, "anomaly", None))


def metrics(data, where: str, scores: dict[str, float]) -> dict[str, Metric]:
    """Manifest metrics ``<where>_<metric>`` (``where``: float or int8; another output's ``<where>_<output>_<metric>``);
    a value that cannot be had is unavailable."""
    task = task_of(data)
    out = {}
    for name, value in scores.items():
        metric = name.rpartition("/")[2]
        unit = METRICS[metric].unit if metric in METRICS else task.spec.unit
        key = f"{where}_{name.replace(':', '_').replace('.', '_').replace('/', '_')}"
        if value is None or not math.isfinite(value):
            out[key] = Metric(None, unit, "measured", unavailable="not finite (e.g. one class of anomaly labels)")
        else:
            out[key] = Metric(round(float(value), 3 if unit in ("%", "dB") else 6), unit, "measured")
    return out


def metric_details(data) -> dict[str, Any]:
    """What the leaf is judged by: ``details["metric"]`` of every node and leaf record."""
    task = task_of(data)
    spec = task.spec
    return {"name": task.metric, "key": task.metric.replace(":", "_").replace(".", "_"), "unit": spec.unit,
            "higher_is_better": spec.higher_is_better, "task": task.kind, "title": spec.title}
