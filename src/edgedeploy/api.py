"""The Python API behind the CLI. Nothing here imports TensorFlow at import time.

    from edgedeploy import api
    run = api.compile_tflite([Path("model_int8.tflite")], ["ethos-u55-128"], Path("out"))
    run = api.optimize("model.h5", "data.npz", "out", leaves=["ptq", "pcqat"], epochs=2)  # or a model object, arrays
    report = api.build_report(Path("out"))
"""

from __future__ import annotations

from typing import Any

from edgedeploy.pipeline.compile import CompileOptions, CompileOutcome, compile_tflite, compile_variants
from .interactive.run import OptimizeRun, optimize
from .interactive.report_view import Report
from edgedeploy.core.manifest import Manifest, Metric, StageRecord
from edgedeploy.config.recipe import Recipe, load_recipe
from edgedeploy.config.targets import Target, get_target, list_targets
from edgedeploy.tflite.reader import read_tflite

__all__ = [
    "CompileOptions",
    "CompileOutcome",
    "Manifest",
    "Metric",
    "OptimizeRun",
    "Recipe",
    "Report",
    "StageRecord",
    "Target",
    "build_report",
    "compile_run",
    "compile_tflite",
    "compile_variants",
    "export_bundle",
    "get_target",
    "list_targets",
    "load_recipe",
    "optimize",
    "read_tflite",
    "is_sweep",
    "run_project",
    "run_sweep",
    "walk",
    "walk_project",
]


def run_project(*args: Any, **kwargs: Any):
    """optimize -> convert -> compile from an ``edgedeploy.toml``. See :func:`edgedeploy.pipeline.project.run_project`."""
    from edgedeploy.pipeline.project import run_project as run

    return run(*args, **kwargs)


def is_sweep(path: Any) -> bool:
    """Whether the project file at ``path`` lists [[models]] (a sweep; checks the whole file)."""
    from edgedeploy.pipeline.project import load_project

    return load_project(path).is_sweep


def run_sweep(*args: Any, **kwargs: Any):
    """Every [[models]] table of a project file into OUT/NAME. See :func:`edgedeploy.pipeline.sweep.run_sweep`."""
    from edgedeploy.pipeline.sweep import run_sweep as run

    return run(*args, **kwargs)


def walk(*args: Any, **kwargs: Any):
    """Train, convert, compile and judge the tree level by level until a leaf meets the requirements.
    See :func:`edgedeploy.pipeline.walk.walk`."""
    from edgedeploy.pipeline.walk import walk as run

    return run(*args, **kwargs)


def walk_project(*args: Any, **kwargs: Any):
    """``compile PROJECT.toml --walk``. See :func:`edgedeploy.pipeline.walk.walk_project`."""
    from edgedeploy.pipeline.walk import walk_project as run

    return run(*args, **kwargs)


def build_report(*args: Any, **kwargs: Any):
    """The report document of a run folder. See :func:`edgedeploy.report.build_report`."""
    from .report import build_report as build

    return build(*args, **kwargs)


def export_bundle(*args: Any, **kwargs: Any):
    """A firmware bundle. See :func:`edgedeploy.export.export_bundle`."""
    from .export import export_bundle as export

    return export(*args, **kwargs)


def compile_run(*args: Any, **kwargs: Any):
    """Compile the leaves of an ``edgedeploy optimize`` run folder into it. See :func:`edgedeploy.pipeline.compile.compile_run`."""
    from edgedeploy.pipeline.compile import compile_run as run

    return run(*args, **kwargs)


def emulate_bundle(*args: Any, **kwargs: Any):
    """A bundle's golden vectors on an emulated Cortex-M55. See :func:`edgedeploy.hil.emulate.run.emulate_bundle`."""
    from edgedeploy.hil.emulate.run import emulate_bundle as emulate

    return emulate(*args, **kwargs)


def serve_bundle(*args: Any, **kwargs: Any):
    """A bundle's device runner on the emulated board's UART, served on a TCP port until stopped.
    See :func:`edgedeploy.hil.emulate.serve.serve_bundle`."""
    from edgedeploy.hil.emulate.serve import serve_bundle as serve

    return serve(*args, **kwargs)


def verify_run(*args: Any, **kwargs: Any):
    """A compiled leaf on the functional NPU model against TFLite's reference kernels. See
    :func:`edgedeploy.npu.verify.verify_run`."""
    from .npu.verify import verify_run as verify

    return verify(*args, **kwargs)


def verify_options(**kwargs: Any):
    """:class:`edgedeploy.npu.verify.VerifyOptions` (imported when asked)."""
    from .npu.verify import VerifyOptions

    return VerifyOptions(**kwargs)
