"""Variant names of compiled models (no Vela)."""

from __future__ import annotations

from pathlib import Path

from edgedeploy.compile import variant_names


def test_names_come_from_files_and_folders_tell_same_named_files_apart():
    assert variant_names([Path("a/dscnn_int8.tflite"), Path("b/resnet8.tflite")]) == ["dscnn", "resnet8"]
    leaves = [Path("run/convert/pcqat/model_int8.tflite"), Path("run/convert/qat/model_int8.tflite")]
    assert variant_names(leaves) == ["pcqat", "qat"]
    assert variant_names([Path("x/net.tflite"), Path("y/net.tflite")]) == ["x_net", "y_net"]
    # the same path twice still gives two distinct names
    assert variant_names([Path("x/net.tflite"), Path("x/net.tflite")]) == ["x_net", "x_net_2"]
