"""EDGEDEPLOY_SHARED_DATA empty, unset or pointing nowhere: the tests use the bundled examples/, never the current
folder."""

from __future__ import annotations

import importlib.util
import os
import subprocess
from pathlib import Path

import pytest

from helpers import pytest_argv

TESTS = Path(__file__).resolve().parents[1]


def _conftest():
    spec = importlib.util.spec_from_file_location("edgedeploy_tests_conftest", TESTS / "conftest.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _layout(root: Path, conf) -> Path:
    for rel in conf.BUNDLED:
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(b"")
    return root


@pytest.mark.parametrize("value,found", [
    (None, "default"), ("", "default"), ("   ", "default"), ("/nonexistent/shared/data", False),
    ("FILE", False), ("EMPTY", False), ("CWD", False), ("REAL", True),
])
def test_only_a_folder_holding_the_data_counts_as_shared_data(tmp_path, monkeypatch, value, found):
    conf = _conftest()
    default = tmp_path / "default"
    (tmp_path / "file").write_text("x")
    (tmp_path / "empty").mkdir()
    _layout(tmp_path / "real", conf)
    monkeypatch.chdir(tmp_path)  # the current folder holds other things, never the data
    value = {"FILE": str(tmp_path / "file"), "EMPTY": str(tmp_path / "empty"), "CWD": ".",
             "REAL": str(tmp_path / "real")}.get(value, value)
    folder = conf.shared_data_dir(value, default)
    if found == "default":
        assert folder == default and not conf.has_shared_data(folder)
        _layout(default, conf)
        assert conf.has_shared_data(conf.shared_data_dir(value, default))
    else:
        assert conf.has_shared_data(folder) is found


# blank values are slow: test_only_a_folder_holding_the_data_counts_as_shared_data reads "" and " " as unset in this
# process; the default run starts the test process once, naming a folder that is not there
@pytest.mark.parametrize("value", [pytest.param("", marks=pytest.mark.slow), pytest.param(" ", marks=pytest.mark.slow),
                                   "/nonexistent"])
def test_the_test_run_never_takes_the_current_folder_for_the_data(tmp_path, value):
    proc = subprocess.run(pytest_argv("--co", str(TESTS / "unit" / "core" / "test_names.py")), capture_output=True,
                          text=True, timeout=120,
                          cwd=tmp_path, env={**os.environ, "EDGEDEPLOY_SHARED_DATA": value})
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    default = TESTS.parent.parent / "shared" / "data"
    if value.strip():  # pointing nowhere: the bundled examples/
        assert f"real data: {value} absent: the bundled examples/ instead" in proc.stdout
    else:  # empty is unset: the data beside the repository, or the bundled examples/ where there is none
        assert f"real data: {default} (found)" in proc.stdout or f"real data: {default} absent" in proc.stdout
