"""edgedeploy: take a Keras model to an Arm Ethos-U NPU.

Importing this package is cheap: TensorFlow and Vela are imported only by the
stages that need them.
"""

from __future__ import annotations

__all__ = ["__version__"]

__version__ = "0.1.0"  # the one place the version is written (pyproject.toml reads it)
