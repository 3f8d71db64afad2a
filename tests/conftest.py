"""Shared test set-up: isolation, seeds, real data from ../shared/data, markers."""

from __future__ import annotations

import contextlib
import itertools
import os
import random
import shutil
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
TEST_DATA = Path(__file__).resolve().parent / "data"
SEED = int(os.environ.get("EDGEDEPLOY_TEST_SEED", "1234"))
# The width every test sees (the _isolate fixture sets it again), from before any module makes its consoles:
# pytest-xdist's workers start with COLUMNS=80.
os.environ["COLUMNS"] = "200"
# pytest-xdist runs a worker per core: each worker's TensorFlow (and the commands it starts) gets its share of the
# cores rather than a thread pool per core, which would have the workers' pools contend for the same cores.
_WORKERS = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
if _WORKERS > 1:
    _share = str(max(1, (os.cpu_count() or 1) // _WORKERS))
    for _var in ("TF_NUM_INTRAOP_THREADS", "TF_NUM_INTEROP_THREADS", "OMP_NUM_THREADS"):
        os.environ.setdefault(_var, _share)


def _end_worker() -> None:
    """A pytest-xdist worker's last exit handler. By the time it runs, the worker has sent every result to the
    controller and the exit handlers of the modules its tests loaded have run (registered after this one), so the
    process ends here without freeing each of those modules (TensorFlow, Keras, Ray: seconds of teardown the
    controller would wait for), as a command ends (``edgedeploy.cli``'s ``_exit``)."""
    import sys

    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(0)


if os.environ.get("PYTEST_XDIST_WORKER"):
    import atexit

    atexit.register(_end_worker)  # registered before the modules the tests load register theirs: it runs last


@pytest.hookimpl(tryfirst=True)
def pytest_unconfigure(config):
    """In a pytest-xdist worker, move what the tests left on the heap out of the garbage collector's sight before
    pytest's last collection (its unraisable-exception check). The worker's process ends without freeing them
    (:func:`_end_worker`), and walking TensorFlow's object graph, whose finalizers call into its runtime, took
    seconds the controller would wait for. Unraisable exceptions of the tests themselves are still reported: pytest
    checks for them around each test."""
    if os.environ.get("PYTEST_XDIST_WORKER"):
        import gc

        gc.freeze()


# Files of ../shared/data that the repository ships real copies of: the same model files, and a seeded random
# subset of the same Speech Commands clips (900 fine-tune, 400 evaluation; examples/kws_tree/SOURCE.md). A clone
# without ../shared/data runs every test that needs only these. A test that needs more names the files in its
# marker, e.g. ``@pytest.mark.requires_data("ic/resnet8_mlperf_int8.tflite")``, and skips in a clone.
BUNDLED = {
    "kws/dscnn_mlperf_int8.tflite": REPO / "examples" / "kws" / "dscnn_mlperf_int8.tflite",
    "kws/dscnn_mlperf_float.h5": REPO / "examples" / "kws_tree" / "dscnn_mlperf_float.h5",
    "kws/speech_commands_v2_test_mfcc_mlperf.npz": REPO / "examples" / "kws_tree" / "speech_commands_subset.npz",
}


def shared_data_dir(value: str | None, default: Path = REPO.parent / "shared" / "data") -> Path:
    """Where the real data is: ``value`` (EDGEDEPLOY_SHARED_DATA) when set and not blank, else ``default``. A blank
    value is "not set", never the current folder."""
    value = (value or "").strip()
    return Path(value).expanduser() if value else default


def has_shared_data(folder: Path) -> bool:
    """``folder`` holds the real data: a folder with at least the files the repository bundles. Anything else (a
    missing path, a file, an unrelated folder) means the bundled examples/ are used instead."""
    return folder.is_dir() and all((folder / rel).is_file() for rel in BUNDLED)


SHARED_DATA = shared_data_dir(os.environ.get("EDGEDEPLOY_SHARED_DATA"))
HAVE_SHARED_DATA = has_shared_data(SHARED_DATA)


def missing_data(item) -> str | None:
    """Why ``item`` cannot run on the data found here, or None when it can."""
    if HAVE_SHARED_DATA:
        return None
    needed = [rel for marker in item.iter_markers("requires_data") for rel in marker.args]
    missing = [rel for rel in needed if rel not in BUNDLED]
    if missing:
        return (f"needs {', '.join(missing)} from the real data at {SHARED_DATA}, which is absent (set "
                "EDGEDEPLOY_SHARED_DATA); the repository's examples/ hold only "
                f"{', '.join(sorted(BUNDLED))}")
    return None


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
    where = f"{SHARED_DATA} (found)" if HAVE_SHARED_DATA else f"{SHARED_DATA} absent: the bundled examples/ instead"
    return [f"edgedeploy test seed: {SEED}", f"real data: {where}"]


def pytest_report_collectionfinish(config, start_path, items):
    if HAVE_SHARED_DATA:
        return []
    skipping = sum(1 for item in items if missing_data(item))
    return [f"{skipping} of {len(items)} tests need real data beyond the bundled examples/ and will skip"]


def pytest_configure(config):
    if hasattr(config.option, "loadscopereorder"):  # pytest-xdist: hand out modules in the order set below
        config.option.loadscopereorder = False


def _module_rank(items) -> dict[Path, int]:
    """Each test module's place in the run: 0, the module with the most tests that read the shared trained tree (a
    worker trains it at once, then runs the rest of that long module); 1, the other integration and e2e modules; 2,
    the other modules that read the tree (long trained by then: no worker waits for it); 3, the unit tests, many
    small modules that fill the workers' last minutes evenly (pytest-xdist's own order, most tests first, left a
    long module to run alone at the end)."""
    unit = Path(__file__).parent / "unit"
    rank: dict[Path, int] = {}
    readers: dict[Path, int] = {}
    for item in items:
        path = Path(str(item.path))
        if unit in path.parents:
            rank[path] = 3
        elif "trained_tree" in getattr(item, "fixturenames", ()):
            rank[path] = 2
            readers[path] = readers.get(path, 0) + 1
        else:
            rank.setdefault(path, 1)
    if readers:
        rank[max(readers, key=lambda p: readers[p])] = 0
    return rank


@pytest.hookimpl(trylast=True)  # after -m and -k have deselected
def pytest_collection_modifyitems(session, config, items):
    rank = _module_rank(items)
    items.sort(key=lambda item: rank[Path(str(item.path))])  # stable: each module's tests stay in their order


def pytest_runtest_setup(item):
    reason = missing_data(item)
    if reason:
        pytest.skip(reason)
    if item.get_closest_marker("requires_fvp"):
        from edgedeploy.fvp.discovery import find_any_fvp

        if find_any_fvp() is None:
            pytest.skip("no Arm Corstone FVP installed (set EDGEDEPLOY_FVP_DIR or put FVP_Corstone_SSE-* on PATH)")


@pytest.fixture(scope="session")
def _homes(tmp_path_factory) -> Path:
    """The folder each test's HOME is made in (one per worker), numbered in the order the tests run.

    ``tmp_path_factory.mktemp`` lists the whole base folder to number a new folder, so making a HOME with it for
    each of two thousand tests would cost seconds that grow with the square of their count."""
    return tmp_path_factory.mktemp("homes")


_HOME_NUMBERS = itertools.count()


@pytest.fixture(autouse=True)
def _isolate(_homes, monkeypatch):
    """Each test gets its own HOME and cache, no colour, a fixed width and a fixed seed. A HOME the test left empty
    is removed after it (one that holds something stays, to read after a failure)."""
    home = _homes / str(next(_HOME_NUMBERS))
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("XDG_CACHE_HOME", str(home / ".cache"))
    monkeypatch.setenv("NO_COLOR", "1")
    monkeypatch.setenv("COLUMNS", "200")
    monkeypatch.delenv("EDGEDEPLOY_FVP_DIR", raising=False)
    random.seed(SEED)
    yield
    from edgedeploy.core.files import release_run_dirs

    release_run_dirs()  # a command holds its run folder's lock until the process ends; tests share one process
    with contextlib.suppress(OSError):
        home.rmdir()


@pytest.fixture(scope="session")
def shared_data(tmp_path_factory) -> Path:
    """The real models and data: ../shared/data, or a folder of the same layout linking the bundled examples."""
    if HAVE_SHARED_DATA:
        return SHARED_DATA
    root = tmp_path_factory.mktemp("bundled-data")
    for rel, src in BUNDLED.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).symlink_to(src)
    return root


@pytest.fixture(scope="session")
def dscnn_int8(shared_data) -> Path:
    return shared_data / "kws" / "dscnn_mlperf_int8.tflite"


@pytest.fixture(scope="session")
def vela_bin() -> str:
    path = shutil.which("vela") or str(Path(os.sys.executable).with_name("vela"))
    if not Path(path).exists():
        pytest.fail("the vela console script is not installed next to this Python")
    return path
