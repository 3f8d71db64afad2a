"""The ``ptq_16x8`` leaf: the baseline with int16 activations and int8 weights (TFLite's 16x8 quantization).

Calibrated on the same real fine-tune samples as ``ptq``. TFLite converts with
``EXPERIMENTAL_TFLITE_BUILTINS_ACTIVATIONS_INT16_WEIGHTS_INT8`` only (no int8 or float fallback), so an
operator without a 16x8 kernel stops the conversion, and that operator is named. Vela compiles int16
activations for Ethos-U55, U65 and U85; an operator it leaves on the CPU is refused by the compile stage
(exit 7), as for int8 leaves.
"""

from __future__ import annotations

import re
import tempfile
from pathlib import Path

import numpy as np

from edgedeploy.tflite.convert import in_keras_order, quantizing_converter
from edgedeploy.errors import ToolFailedError

# e.g. "Quantization to 16x8-bit not yet supported for op: 'UNIDIRECTIONAL_SEQUENCE_LSTM'." (TF 2.21, an LSTM)
_OP_RE = re.compile(r"'(tfl\.[a-z_0-9]+)'|op:? '?([A-Z_0-9]{3,})'?|operation '?([A-Za-z_.0-9]+)'?")


def _failed_operator(message: str) -> str | None:
    m = _OP_RE.search(message)
    return next((g for g in m.groups() if g), None) if m else None


def convert_16x8(model, calibration_x: np.ndarray, float_io: bool = False, source: str | None = None) -> bytes:
    """``model`` as a 16x8 TFLite (batch size 1), calibrated on ``calibration_x``; int16 input and output
    tensors unless ``float_io``."""
    from edgedeploy.keras import tfenv

    tf = tfenv.load().tf
    converter = quantizing_converter(model, calibration_x,
                                     tf.lite.OpsSet.EXPERIMENTAL_TFLITE_BUILTINS_ACTIVATIONS_INT16_WEIGHTS_INT8,
                                     None if float_io else tf.int16)
    prefix = f"{source}: " if source else ""
    try:
        with tfenv.quiet_native_stderr():
            result = converter.convert()
    except Exception as exc:  # the converter raises assorted errors
        text = str(exc).strip()
        op = _failed_operator(text)
        first = text.splitlines()[0] if text else type(exc).__name__
        what = f"operator {op} has no 16x8 (int16 activation) kernel in TFLite" if op else first
        raise ToolFailedError(f"{prefix}16x8 conversion failed: {what}",
                              "use the int8 ptq leaf for this model, or replace that layer") from exc
    _require_16x8(result, prefix)
    return in_keras_order(result)


def _require_16x8(data: bytes, prefix: str) -> None:
    from edgedeploy.tflite.reader import read_tflite

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "converted.tflite"
        path.write_bytes(data)
        floats = read_tflite(path).float_compute_ops()
    if floats:
        raise ToolFailedError(f"{prefix}16x8 conversion left operators in float "
                              f"({', '.join(sorted({o.op for o in floats}))}); they have no 16x8 kernel in TFLite",
                              "use the int8 ptq leaf for this model, or replace that layer")
