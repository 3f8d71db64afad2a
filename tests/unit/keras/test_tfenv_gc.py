"""The collector's thresholds for TensorFlow work: raised from Python's defaults, never lowered, never switched on."""

from __future__ import annotations

import gc

import pytest

from edgedeploy.keras import tfenv


@pytest.fixture
def restore_gc():
    was, enabled = gc.get_threshold(), gc.isenabled()
    yield
    gc.set_threshold(*was)
    (gc.enable if enabled else gc.disable)()


def test_python_defaults_are_raised(restore_gc):
    gc.set_threshold(700, 10, 10)
    tfenv.collect_less_often()
    assert gc.get_threshold() == tfenv.GC_THRESHOLD and tfenv.GC_THRESHOLD[0] > 700


def test_higher_thresholds_and_a_disabled_collector_are_kept(restore_gc):
    higher = (tfenv.GC_THRESHOLD[0] * 2, 5, 5)
    gc.set_threshold(*higher)
    tfenv.collect_less_often()
    assert gc.get_threshold() == higher
    gc.set_threshold(700, 10, 10)
    gc.disable()
    tfenv.collect_less_often()
    assert gc.get_threshold() == (700, 10, 10) and not gc.isenabled()
