"""Shared test set-up: isolation, seeds, real data from ../shared/data, markers."""

from __future__ import annotations

import os
import random
import shutil
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SHARED_DATA = Path(os.environ.get("EDGEDEPLOY_SHARED_DATA", REPO.parent / "shared" / "data"))
TEST_DATA = Path(__file__).resolve().parent / "data"
SEED = int(os.environ.get("EDGEDEPLOY_TEST_SEED", "1234"))


def stratified_choice(indices, labels, n: int, seed: int):
    """``n`` of ``indices`` (positions into ``labels``), the same share from every class, chosen at random with
    ``seed``, in random order. The data sets are stored sorted by class: a leading slice would hold few classes."""
    import numpy as np

    indices = np.asarray(indices)
    rng = np.random.default_rng(seed)
    classes = np.unique(labels[indices])
    groups = [rng.permutation(indices[labels[indices] == c]) for c in classes]
    share = n // len(classes)
    taken = [g[:share] for g in groups]
    rest = rng.permutation(np.concatenate([g[share:] for g in groups]))[: n - sum(len(t) for t in taken)]
    return rng.permutation(np.concatenate(taken + [rest]))


@pytest.fixture(scope="session")
def stratified():
    """:func:`stratified_choice`: a seeded, class-balanced choice of samples for training, calibration or scoring."""
    return stratified_choice


def pytest_report_header(config):
    return [f"edgedeploy test seed: {SEED}", f"shared data: {SHARED_DATA} ({'found' if SHARED_DATA.is_dir() else 'absent'})"]


def pytest_runtest_setup(item):
    if item.get_closest_marker("requires_data") and not SHARED_DATA.is_dir():
        pytest.skip(f"real models and data not found at {SHARED_DATA} (set EDGEDEPLOY_SHARED_DATA)")
    if item.get_closest_marker("requires_fvp"):
        from edgedeploy.fvp.discovery import find_any_fvp

        if find_any_fvp() is None:
            pytest.skip("no Arm Corstone FVP installed (set EDGEDEPLOY_FVP_DIR or put FVP_Corstone_SSE-* on PATH)")


@pytest.fixture(autouse=True)
def _isolate(tmp_path_factory, monkeypatch):
    """Each test gets its own HOME and cache, no colour, a fixed width and a fixed seed."""
    home = tmp_path_factory.mktemp("home")
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("XDG_CACHE_HOME", str(home / ".cache"))
    monkeypatch.setenv("NO_COLOR", "1")
    monkeypatch.setenv("COLUMNS", "200")
    monkeypatch.delenv("EDGEDEPLOY_FVP_DIR", raising=False)
    random.seed(SEED)
    yield
    from edgedeploy.fsutil import release_run_dirs

    release_run_dirs()  # a command holds its run folder's lock until the process ends; tests share one process


@pytest.fixture(scope="session")
def shared_data() -> Path:
    if not SHARED_DATA.is_dir():
        pytest.skip(f"real models and data not found at {SHARED_DATA} (set EDGEDEPLOY_SHARED_DATA)")
    return SHARED_DATA


@pytest.fixture(scope="session")
def dscnn_int8(shared_data) -> Path:
    return shared_data / "kws" / "dscnn_mlperf_int8.tflite"


@pytest.fixture(scope="session")
def vela_bin() -> str:
    path = shutil.which("vela") or str(Path(os.sys.executable).with_name("vela"))
    if not Path(path).exists():
        pytest.fail("the vela console script is not installed next to this Python")
    return path
