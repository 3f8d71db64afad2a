"""Fixtures shared by the unit tests."""

from __future__ import annotations

from pathlib import Path

import pytest

from edgedeploy.fvp import discovery


@pytest.fixture
def no_fvps(monkeypatch, tmp_path):
    """Hide any FVP or runner the machine has."""
    empty = tmp_path / "empty-path"
    empty.mkdir()
    monkeypatch.setenv("PATH", f"{empty}")
    monkeypatch.setattr(discovery, "usual_install_dirs", lambda: [])
    monkeypatch.delenv(discovery.ENV_RUNNER, raising=False)
    monkeypatch.delenv("XDG_DATA_HOME", raising=False)


def pytest_configure(config):
    """A run whose -m leaves out the ``slow`` tests draws fewer Hypothesis examples (:func:`helpers.examples`)."""
    import helpers

    try:  # pytest's own reading of -m (pytest is pinned in the test extra)
        from _pytest.mark.expression import Expression
    except ImportError:  # another pytest: every property draws its full count
        return
    markexpr = config.getoption("markexpr", "")
    if markexpr:
        helpers.FULL_PROPERTIES = Expression.compile(markexpr).evaluate(lambda name: name == "slow")


# Unit tests run neither TensorFlow nor Vela (tests/integration does): a unit test after which either is imported in
# this process fails, naming the module, so a test that needs one moves to tests/integration. (Vela's register
# tables, which the command-stream decoder reads, are data; its compiler is what runs Vela.)
HEAVY = ("tensorflow", "tf_keras", "tensorflow_model_optimization", "ethosu.vela.vela", "ethosu.vela.compiler_driver")


def pytest_collection_finish(session):
    """The same for what the unit test modules import when collected (checked when only unit tests were collected)."""
    import sys

    unit = Path(__file__).parent
    if session.items and all(unit in Path(str(item.path)).parents for item in session.items):
        loaded = [name for name in HEAVY if name in sys.modules]
        if loaded:
            raise pytest.UsageError(f"collecting tests/unit imported {', '.join(loaded)}: move that module to "
                                    "tests/integration")


@pytest.fixture(autouse=True)
def _no_tensorflow_or_vela():
    import sys

    before = {name for name in HEAVY if name in sys.modules}
    yield
    started = [name for name in HEAVY if name in sys.modules and name not in before]
    assert not started, f"a unit test imported {', '.join(started)}: move it to tests/integration"
