"""edgedeploy: take a Keras model to an Arm Ethos-U NPU.

Importing this package is cheap: TensorFlow and Vela are imported only by the
stages that need them.

    import edgedeploy
    run = edgedeploy.optimize(model, (x, y), "out", leaves=["ptq"])
    run.compile(["ethos-u55-128"])
    run.report()
"""

from __future__ import annotations

import sys
import types

from edgedeploy.core.lazy import lazy_exports

__all__ = ["OptimizeRun", "Report", "__version__", "optimize"]

__version__ = "0.1.0"  # the one place the version is written (pyproject.toml reads it)

# The Python API (edgedeploy.interactive), imported on first use.
__getattr__ = lazy_exports(__name__, {"OptimizeRun": ".interactive.optimize_run", "Report": ".interactive.report_view"})


class _Package(types.ModuleType):
    """``edgedeploy.optimize`` is the typed function of the Python API. The subpackage of the same name (the
    deployment tree's stages) is imported with ``from edgedeploy.optimize import ...`` or
    ``importlib.import_module("edgedeploy.optimize")``; the import system's binding of it to this attribute is
    not kept."""

    @property
    def optimize(self):
        from .interactive.optimize_run import optimize

        return optimize

    @optimize.setter
    def optimize(self, value) -> None:
        if not isinstance(value, types.ModuleType):
            raise AttributeError("edgedeploy.optimize is the Python API's function")


sys.modules[__name__].__class__ = _Package
