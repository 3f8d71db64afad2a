"""Variant names of compiled models (no Vela)."""

from __future__ import annotations

from pathlib import Path

from edgedeploy.pipeline.variants import keep_apart, variant_names


def test_names_come_from_files_and_folders_tell_same_named_files_apart():
    assert variant_names([Path("a/dscnn_int8.tflite"), Path("b/resnet8.tflite")]) == ["dscnn", "resnet8"]
    leaves = [Path("run/convert/pcqat/model_int8.tflite"), Path("run/convert/qat/model_int8.tflite")]
    assert variant_names(leaves) == ["pcqat", "qat"]
    assert variant_names([Path("x/net.tflite"), Path("y/net.tflite")]) == ["x_net", "y_net"]
    # the same path twice still gives two distinct names
    assert variant_names([Path("x/net.tflite"), Path("x/net.tflite")]) == ["x_net", "x_net_2"]


def test_a_model_never_takes_the_variant_another_model_left_in_the_run(tmp_path):
    a, b = tmp_path / "a" / "m_int8.tflite", tmp_path / "b" / "m_int8.tflite"
    earlier = {"m": str(a.resolve()), "ptq": None}  # `m` from a/, `ptq` a leaf of optimize
    # the same file again keeps its variant (an edited model replaces its own results)
    assert keep_apart([a], ["m"], earlier) == [("m", None)]
    # another file of the same name sits beside it, and the caller learns which variant it would have replaced
    assert keep_apart([b], ["m"], earlier) == [("b_m", "m")]
    assert keep_apart([tmp_path / "x" / "ptq.tflite"], ["ptq"], earlier) == [("x_ptq", "ptq")]
    # once imported, b/ keeps its name, even when both files are given together
    earlier["b_m"] = str(b.resolve())
    assert keep_apart([b, a], ["b_m", "a_m"], earlier) == [("b_m", None), ("m", None)]
    # a new name never lands on a taken one
    assert keep_apart([tmp_path / "c" / "m.tflite"], ["m"], {"m": "/elsewhere/m.tflite", "c_m": "/x/c_m.tflite"}) == [
        ("c_m_2", "m")]
