"""edgedeploy: take a Keras model to an Arm Ethos-U NPU.

Importing this package is cheap: TensorFlow and Vela are imported only by the
stages that need them.
"""

from __future__ import annotations

__all__ = ["__version__"]


def __getattr__(name: str) -> str:
    if name == "__version__":  # resolved lazily: importlib.metadata is slow to import
        from importlib.metadata import PackageNotFoundError, version

        try:
            value = version("edgedeploy")
        except PackageNotFoundError:  # a source tree that was not installed
            value = "0.0.0+source"
        globals()["__version__"] = value
        return value
    raise AttributeError(name)
