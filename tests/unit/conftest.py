"""Fixtures shared by the unit tests."""

from __future__ import annotations

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
