"""A Keras model's outputs on an array of samples, computed eagerly in inference mode.

``model.predict`` traces a function for every model it is given; the models edgedeploy reads outputs from (a
flattened twin checked once, a thinned candidate scored once) are called once or twice each, so tracing would cost
more than the calls.
"""

from __future__ import annotations

import numpy as np


def model_outputs(model, x: np.ndarray, batch: int = 256):
    """The model's outputs on ``x`` in inference mode (a list of arrays for several outputs), ``batch`` samples a
    call."""
    parts = [model(x[i:i + batch], training=False) for i in range(0, len(x), batch)]
    if isinstance(parts[0], (list, tuple)):
        return [np.concatenate([np.asarray(p[k]) for p in parts]) for k in range(len(parts[0]))]
    return np.concatenate([np.asarray(p) for p in parts])
