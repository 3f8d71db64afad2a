"""While TFMOT imports, Keras 3 (``keras``) is reported missing, so TFMOT's probe for Keras 2.13 fails at once
instead of importing all of Keras 3 first; before and after, and in a process that has Keras 3 already, imports
are untouched."""

from __future__ import annotations

import importlib
import sys
import types

import pytest

from edgedeploy.keras import tfenv


def _finders() -> list:
    return [f for f in sys.meta_path if isinstance(f, tfenv._NoKeras3)]


def _forget_keras(monkeypatch) -> None:
    """This process as one that never imported Keras 3 (another test in it may have; put back afterwards)."""
    for name in [m for m in sys.modules if m == "keras" or m.startswith("keras.")]:
        monkeypatch.delitem(sys.modules, name)


def test_keras_is_missing_inside_the_block_and_the_finder_gone_after(monkeypatch):
    _forget_keras(monkeypatch)
    with tfenv.keras3_probe_fails_fast():
        with pytest.raises(ModuleNotFoundError) as err:
            importlib.import_module("keras.src.engine")  # TFMOT's probe: fails on the package, imports nothing
        assert err.value.name == "keras" and "keras" not in sys.modules
        assert importlib.import_module("json").dumps([]) == "[]"  # every other import goes through
    assert _finders() == [] and "keras" not in sys.modules


def test_a_process_with_keras_imported_keeps_it(monkeypatch):
    loaded = types.ModuleType("keras")
    monkeypatch.setitem(sys.modules, "keras", loaded)
    with tfenv.keras3_probe_fails_fast():
        assert _finders() == []
        assert importlib.import_module("keras") is loaded


def test_the_finder_is_removed_when_the_import_fails(monkeypatch):
    _forget_keras(monkeypatch)
    with pytest.raises(ZeroDivisionError):
        with tfenv.keras3_probe_fails_fast():
            1 / 0
    assert _finders() == []
