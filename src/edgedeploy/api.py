"""The Python API behind the CLI. Nothing here imports TensorFlow at import time."""

from __future__ import annotations

from .compile import CompileOptions, CompileOutcome, compile_tflite, compile_variants
from .manifest import Manifest, Metric, StageRecord
from .targets import Target, get_target, list_targets
from .tflite_model import read_tflite

__all__ = [
    "CompileOptions",
    "CompileOutcome",
    "Manifest",
    "Metric",
    "StageRecord",
    "Target",
    "compile_tflite",
    "compile_variants",
    "get_target",
    "list_targets",
    "read_tflite",
]
