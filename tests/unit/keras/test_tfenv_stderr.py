"""TFLite's XNNPACK notice on fd 2 is dropped where the interpreter allocates; anything else written there stays."""

from __future__ import annotations

import os

from edgedeploy.keras import tfenv


def test_only_the_xnnpack_notice_is_dropped(capfd):
    with tfenv.without_xnnpack_notice():
        os.write(2, b"INFO: Created TensorFlow Lite XNNPACK delegate for CPU.\n")
        os.write(2, b"ERROR: tensor 3 has a dynamic shape\n")
    os.write(2, b"after\n")
    err = capfd.readouterr().err
    assert err == "ERROR: tensor 3 has a dynamic shape\nafter\n"


def test_an_error_inside_still_propagates_and_its_output_is_kept(capfd):
    try:
        with tfenv.without_xnnpack_notice():
            os.write(2, b"tflite: failed to prepare node 4\n")
            raise RuntimeError("allocate_tensors failed")
    except RuntimeError as exc:
        assert "allocate_tensors failed" in str(exc)
    assert capfd.readouterr().err == "tflite: failed to prepare node 4\n"


def test_debug_logging_keeps_the_notice(capfd, monkeypatch):
    monkeypatch.setenv("EDGEDEPLOY_TF_LOGS", "1")
    with tfenv.without_xnnpack_notice():
        os.write(2, b"INFO: Created TensorFlow Lite XNNPACK delegate for CPU.\n")
    assert "XNNPACK" in capfd.readouterr().err
