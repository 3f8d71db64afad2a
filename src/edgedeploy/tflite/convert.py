"""Full-int8 TFLite conversion, calibrated on real samples, and accuracy on the host."""

from __future__ import annotations

import gzip
import logging
from pathlib import Path
from typing import Any

import numpy as np

from edgedeploy.errors import ToolFailedError

log = logging.getLogger("edgedeploy")


class FloatOperatorsLeft(ToolFailedError):
    """Int8 conversion left operators computing in float (no int8 kernel, or no range to quantize them with)."""


def function_converter(model):
    """A TFLite converter of ``model``'s inference at batch size 1, with none of its options set."""
    from edgedeploy.keras import tfenv

    tf = tfenv.load().tf
    shape = [1, *model.input_shape[1:]]
    fn = tf.function(lambda t: model(t, training=False))
    concrete = fn.get_concrete_function(tf.TensorSpec(shape, tf.float32))
    # The converter saves its trackable object as a SavedModel before converting. Given the Keras model, that
    # traces every layer's call; given only the variables the function reads, it saves the one function, in a
    # fraction of the time, and the converted bytes are the same.
    holder = tf.Module()
    holder.model_variables = list(model.variables)
    return tf.lite.TFLiteConverter.from_concrete_functions([concrete], holder)


def quantizing_converter(model, calibration_x: np.ndarray | None, ops, io_type):
    """A TFLite converter for ``model`` at batch size 1 with default optimizations: calibrated on
    ``calibration_x`` one sample at a time and restricted to the operator set ``ops`` when samples are given
    (QAT models carry their own ranges), its input and output tensors of ``io_type`` unless that is None."""
    from edgedeploy.keras import tfenv

    tf = tfenv.load().tf
    converter = function_converter(model)
    converter.optimizations = [tf.lite.Optimize.DEFAULT]
    if calibration_x is not None:
        samples = calibration_x.astype(np.float32)

        def representative():
            for i in range(len(samples)):
                yield [samples[i : i + 1]]

        converter.representative_dataset = representative
        converter.target_spec.supported_ops = [ops]
    if io_type is not None:
        converter.inference_input_type = io_type
        converter.inference_output_type = io_type
    return converter


def convert_int8(model, calibration_x: np.ndarray | None, float_io: bool = False, source: str | None = None) -> bytes:
    """Convert ``model`` to full-int8 TFLite with a fixed batch size of 1.

    PTQ models are calibrated on ``calibration_x`` (real samples from the fine-tune split); QAT models carry
    their own ranges, and ``calibration_x`` is None for them (see :func:`convert_qat_int8`). ``source`` (e.g.
    the leaf) starts the message of a failure.
    """
    from edgedeploy.keras import tfenv

    tf = tfenv.load().tf
    converter = quantizing_converter(model, calibration_x, tf.lite.OpsSet.TFLITE_BUILTINS_INT8,
                                     None if float_io else tf.int8)
    try:
        with tfenv.quiet_native_stderr():  # the converter prints its settings to fd 2
            result = converter.convert()
    except Exception as exc:  # the converter raises assorted errors
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ToolFailedError(f"{_prefix(source)}int8 conversion failed: {first}",
                              "a layer may have no int8 kernel in TFLite; check the model's operators") from exc
    _require_full_int8(result, source)
    return in_keras_order(result)


def in_keras_order(data: bytes) -> bytes:
    """``data`` (a converted model) with its outputs listed in the Keras model's output order.

    The converter may list a model's several outputs in another order (a classifier and a box regressor come out
    box first); its signature names them ``output_<i>`` for the i-th Keras output. The subgraph's list of output
    tensors is permuted in place, so that every reader (scoring, verify, export's golden vectors, the firmware)
    finds output i where the Keras model has it. A model with one output, or whose signature does not name its
    outputs so, is returned as it is."""
    import re

    import tflite  # the generated TFLite schema

    buf = bytearray(data)
    model = tflite.Model.GetRootAsModel(buf, 0)
    if model.SignatureDefsLength() != 1:
        return data
    sig = model.SignatureDefs(0)
    named = {}
    for i in range(sig.OutputsLength()):
        m = re.fullmatch(r"output_(\d+)", (sig.Outputs(i).Name() or b"").decode())
        if m is None:
            return data
        named[int(m.group(1))] = sig.Outputs(i).TensorIndex()
    outputs = model.Subgraphs(sig.SubgraphIndex()).OutputsAsNumpy()  # a view into ``buf``
    order = [named[k] for k in sorted(named)]
    if len(order) < 2 or sorted(order) != sorted(outputs.tolist()) or order == outputs.tolist():
        return data
    outputs[:] = order
    return bytes(buf)


def convert_qat_int8(model, calibration, float_io: bool = False, source: str | None = None) -> tuple[bytes, str | None]:
    """Convert a QAT model to full-int8 TFLite; returns (the model, what calibrated some of it, or None).

    A QAT model carries its own ranges. Layers TFMOT left without fake quantization (see
    :func:`edgedeploy.keras.qat_annotate.unsupported_for_qat`) have none, and some (a SeparableConv2D, a batch norm it
    cannot fold) then stay in float: only then is the model converted again with a representative dataset,
    ``calibration()`` -> (samples, description), which gives those tensors ranges and keeps every QAT range.
    """
    try:
        return convert_int8(model, None, float_io, source), None
    except FloatOperatorsLeft as exc:
        x, described = calibration()
        log.info("%s; calibrating the layers without QAT ranges on %s", exc.message, described)
        return convert_int8(model, x, float_io, source), f"{described}, for the layers without QAT ranges only"


def _prefix(source: str | None) -> str:
    return f"{source}: " if source else ""


KERNEL_OPS = ("CONV_2D", "DEPTHWISE_CONV_2D", "FULLY_CONNECTED", "TRANSPOSE_CONV")


def _require_full_int8(data: bytes, source: str | None = None) -> None:
    """The converted model computes in int8 only, every bias is quantized for the scales its operator computes
    with, and no layer's int8 kernel came out all zeros."""
    import tempfile

    from edgedeploy.tflite.reader import describe_misbiased, read_tflite, read_weight_tensors

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "converted.tflite"
        path.write_bytes(data)
        model = read_tflite(path)
        floats = model.float_compute_ops()
        misbiased = model.misbiased_operators()
        zeroed = [t for t in read_weight_tensors(path)
                  if t.op in KERNEL_OPS and t.dtype == "int8" and not np.any(t.values())]
    if floats:
        raise FloatOperatorsLeft(
            f"{_prefix(source)}int8 conversion left {len(floats)} operators in float "
            f"({', '.join(sorted({o.op for o in floats}))})",
            "these layers have no int8 kernel in TFLite; replace them or quantize them with QAT",
        )
    if misbiased:
        op, ratio = misbiased[0]
        raise ToolFailedError(
            f"{_prefix(source)}int8 conversion quantized the bias of {len(misbiased)} operator(s) for another input "
            f"scale ({describe_misbiased(op, ratio)}); the int8 model would compute something else",
            "a QAT activation range that TFMOT started at [-6, 6] and that still reaches below zero after a ReLU is "
            'the known cause: set [training] qat_ranges = "calibrated" (the default)',
        )
    if zeroed:
        raise ToolFailedError(
            f"{_prefix(source)}int8 conversion rounded every weight of {len(zeroed)} kernel(s) to zero "
            f"({zeroed[0].op} '{zeroed[0].name.split(';')[0]}'); the model would compute nothing there",
            "report this model; a scaling the converter folded into that kernel after quantizing it (e.g. an input "
            "Rescaling before a QAT layer) is the known cause",
        )


def gzip_size(data: bytes) -> int:
    return len(gzip.compress(data, compresslevel=9, mtime=0))


def tflite_predict(model_bytes: bytes, x: np.ndarray, batch: int = 256) -> np.ndarray:
    """Run the int8 model on every sample of ``x`` (float, model input scale) and return its raw outputs (its
    first output's, for a model with several: :func:`tflite_predict_all`).

    The interpreter is resized to a batch when that gives the same answers as batch 1 on the first
    samples; otherwise it runs one sample at a time.
    """
    return tflite_predict_all(model_bytes, x, batch)[0]


def tflite_predict_all(model_bytes: bytes, x: np.ndarray, batch: int = 256) -> list[np.ndarray]:
    """:func:`tflite_predict` for every output of the model, in its order (the Keras model's:
    :func:`in_keras_order`)."""
    from edgedeploy.tflite.interpreter import allocate, make_interpreter

    it = make_interpreter(model_bytes, num_threads=2)
    inp, outs = it.get_input_details()[0], it.get_output_details()
    xq = quantize_input(x, inp)

    def read(it_) -> list[np.ndarray]:
        return [it_.get_tensor(out["index"]).copy() for out in outs]

    def one(it_, xs) -> list[np.ndarray]:
        res = []
        for i in range(len(xs)):
            it_.set_tensor(inp["index"], xs[i : i + 1])
            it_.invoke()
            res.append(read(it_))
        return [np.concatenate(part) for part in zip(*res)]

    probe = xq[: min(8, len(xq))]
    reference = one(it, probe)
    batched = None
    try:
        bt = make_interpreter(model_bytes, num_threads=2, allocate_now=False)
        bt.resize_tensor_input(inp["index"], [len(probe), *inp["shape"][1:]], strict=False)
        allocate(bt)
        bt.set_tensor(inp["index"], probe)
        bt.invoke()
        if all(np.array_equal(a, b) for a, b in zip(read(bt), reference)):
            batched = bt
    except Exception:  # a fixed-shape operator (e.g. RESHAPE to [1, N]) rules batching out
        batched = None
    if batched is None:
        return one(it, xq)
    results = []
    for start in range(0, len(xq), batch):
        chunk = xq[start : start + batch]
        batched.resize_tensor_input(inp["index"], [len(chunk), *inp["shape"][1:]], strict=False)
        batched.allocate_tensors()
        batched.set_tensor(inp["index"], chunk)
        batched.invoke()
        results.append(read(batched))
    return [np.concatenate(part) for part in zip(*results)]


def quantize_input(x: np.ndarray, detail: dict[str, Any]) -> np.ndarray:
    dtype = detail["dtype"]
    if dtype == np.float32:
        return x.astype(np.float32)
    scale, zero = detail["quantization"]
    info = np.iinfo(dtype)
    return np.clip(np.round(x / scale + zero), info.min, info.max).astype(dtype)


