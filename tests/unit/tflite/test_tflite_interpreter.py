"""The host TFLite interpreter (LiteRT): reference kernels on request, outputs as recorded, one-line error when missing."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from edgedeploy.errors import ToolMissingError
from edgedeploy.tflite.interpreter import make_interpreter

REPO = Path(__file__).resolve().parents[3]
DSCNN = REPO / "examples/kws/dscnn_mlperf_int8.tflite"
CASES = REPO / "tests/data/npu/dscnn_u55_128_cases.npz"


def _outputs(interp, x: np.ndarray) -> np.ndarray:
    i, o = interp.get_input_details()[0], interp.get_output_details()[0]
    outs = []
    for c in range(len(x)):
        interp.set_tensor(i["index"], x[c : c + 1])
        interp.invoke()
        outs.append(interp.get_tensor(o["index"])[0].copy())
    return np.stack(outs)


def _eval_inputs(interp, n: int) -> np.ndarray:
    with np.load(REPO / "examples/kws_tree/speech_commands_subset.npz") as npz:
        x = npz["x"][np.flatnonzero(npz["split"] == 1)[:n]].astype(np.float32)
    scale, zero = interp.get_input_details()[0]["quantization"]
    return np.clip(np.round(x / scale + zero), -128, 127).astype(np.int8)


@pytest.mark.parametrize("source", ["path", "bytes"])
def test_reference_kernels_give_the_recorded_reference_outputs(source):
    model = DSCNN if source == "path" else DSCNN.read_bytes()
    with np.load(CASES) as cases:
        x, y = cases["x"], cases["y"]
    assert np.array_equal(_outputs(make_interpreter(model, reference=True), x), y)


def test_reference_and_default_kernels_are_different_kernels():
    ref = make_interpreter(DSCNN, reference=True)
    x = _eval_inputs(ref, 64)
    a, b = _outputs(ref, x), _outputs(make_interpreter(DSCNN), x)
    assert not np.array_equal(a, b)  # the optimized kernels round differently on some cases
    assert np.mean(a.argmax(1) == b.argmax(1)) > 0.9


def test_unallocated_interpreter_can_be_resized_then_allocated():
    from edgedeploy.tflite.interpreter import allocate

    it = make_interpreter(DSCNN, allocate_now=False)
    inp = it.get_input_details()[0]
    it.resize_tensor_input(inp["index"], [4, *inp["shape"][1:]], strict=False)
    allocate(it)
    assert list(it.get_input_details()[0]["shape"]) == [4, *inp["shape"][1:]]


def test_missing_litert_names_the_package_and_the_pin(monkeypatch):
    monkeypatch.setitem(sys.modules, "ai_edge_litert", None)
    with pytest.raises(ToolMissingError) as info:
        make_interpreter(DSCNN)
    assert "pip install ai-edge-litert==2.3.0" in info.value.one_line()


def test_running_a_model_does_not_import_tensorflow():
    code = ("import sys; from edgedeploy.tflite.interpreter import make_interpreter; "
            f"make_interpreter({str(DSCNN)!r}, reference=True).invoke(); print('tensorflow' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert done.stdout.strip() == "False"
