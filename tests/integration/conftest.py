from __future__ import annotations

import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

import pytest

from helpers import TREE_LEAVES, run_in_process

REPO = Path(__file__).resolve().parents[2]
TFLM_TREE = Path(os.environ.get("EDGEDEPLOY_TFLM_DIR") or REPO.parent / "shared" / "third_party" / "tflm-cortex-m55")
FIRMWARE_TOOLS = ("arm-none-eabi-gcc", "arm-none-eabi-g++", "cmake", "qemu-system-arm")


@pytest.fixture(scope="session")
def tflm_cache(tmp_path_factory) -> Path:
    """One cache of built TFLM libraries for every firmware test of the run (a cold build compiles the library's sources)."""
    missing = [t for t in FIRMWARE_TOOLS if shutil.which(t) is None]
    if missing:
        pytest.skip(f"{', '.join(missing)} not installed (.ci/run installs them)")
    if not (TFLM_TREE / "tensorflow").is_dir():
        pytest.skip(f"no TFLM tree at {TFLM_TREE} (set EDGEDEPLOY_TFLM_DIR)")
    given = os.environ.get("EDGEDEPLOY_TEST_TFLM_CACHE")
    if given:
        return Path(given)
    cache = shared_root(tmp_path_factory) / "tflm-cache"  # one for all pytest-xdist workers (a build locks its entry)
    cache.mkdir(exist_ok=True)
    return cache


@pytest.fixture(scope="session")
def float_tflite(shared_data, tmp_path_factory) -> Path:
    """A float32 TFLite of the MLPerf DS-CNN, converted here with TensorFlow (no quantization)."""
    from edgedeploy.keras import tfenv
    from edgedeploy.tflite.convert import function_converter

    env = tfenv.load()
    model = env.keras.models.load_model(shared_data / "kws" / "dscnn_mlperf_float.h5", compile=False)
    converter = function_converter(model)
    path = tmp_path_factory.mktemp("float") / "dscnn_float.tflite"
    path.write_bytes(converter.convert())
    return path


@pytest.fixture(scope="session")
def reverse_tflite(tmp_path_factory) -> Path:
    """A small full-int8 model with a REVERSE_V2 that Ethos-U55 cannot run (Ethos-U85 can).

    Calibrated on seeded random inputs: the test is about operator placement, not accuracy.
    """
    import numpy as np

    from edgedeploy.keras import tfenv
    from edgedeploy.tflite.convert import function_converter

    env = tfenv.load()
    tf, keras = env.tf, env.keras
    keras.utils.set_random_seed(0)
    inp = keras.Input((8, 8, 4), batch_size=1)
    x = keras.layers.Conv2D(8, 3, padding="same", activation="relu")(inp)
    x = keras.layers.Lambda(lambda t: tf.reverse(t, axis=[1]))(x)
    out = keras.layers.Dense(4)(keras.layers.Flatten()(x))
    converter = function_converter(keras.Model(inp, out))
    converter.optimizations = [tf.lite.Optimize.DEFAULT]
    rng = np.random.default_rng(0)
    converter.representative_dataset = lambda: ([rng.normal(size=(1, 8, 8, 4)).astype("float32")] for _ in range(16))
    converter.target_spec.supported_ops = [tf.lite.OpsSet.TFLITE_BUILTINS_INT8]
    converter.inference_input_type = converter.inference_output_type = tf.int8
    path = tmp_path_factory.mktemp("reverse") / "reverse_int8.tflite"
    path.write_bytes(converter.convert())
    return path


@pytest.fixture(scope="session")
def _ray_home(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("ray-home")


@pytest.fixture
def ray_home(_ray_home, monkeypatch) -> Path:
    """One HOME for every test that starts a local Ray head.

    Ray keeps the authentication token of a local head under ``~/.ray`` and caches it in the process; with a
    new HOME per test, a second head in the same process would look for it where it never was written.
    """
    monkeypatch.setenv("HOME", str(_ray_home))
    return _ray_home


# The deployment tree most integration tests read: the bundled example's float DS-CNN fine-tuned on its 900 real
# Speech Commands clips (scored on the 400 of other speakers), trained once per test run through `edgedeploy
# optimize`. Its settings are test_accuracy's (2 epochs, seed 0, no min_steps stretching); sparsity and clusters are
# the recipe defaults, named here because tests check them. Its leaves are those its readers read (ptq and pcqat:
# test_accuracy; pruned and clustered, two nodes trained from the baseline each: test_taskgraph; pruned_clustered,
# whose node pcqat trains from anyway: test_optimize). Of the nodes trained from the baseline alone, clustered is the
# one with no quantization-aware model to build (qat builds one, as pcqat does here). Every leaf is seeded on its
# own, so each is the leaf of a run of the whole tree; in the slow run test_optimize trains the other default leaves
# (qat, pqat, cqat) and the palette leaf on a copy of it, and test_palette trains the palette leaf on another.
TREE_MODEL = REPO / "examples" / "kws_tree" / "dscnn_mlperf_float.h5"
TREE_DATA = REPO / "examples" / "kws_tree" / "speech_commands_subset.npz"
TREE_SETTINGS = {"epochs": 2, "min_steps": 0, "seed": 0, "sparsity": 0.5, "clusters": 16}


@dataclass(frozen=True)
class TrainedTree:
    """The shared tree's run folder (read it; copy it with :meth:`copy` to write into it) and what made it."""

    run_dir: Path
    model: Path
    data: Path
    settings: dict
    optimize_json: dict  # what `edgedeploy optimize --json` printed

    @property
    def outcome(self):
        """The run as the driver returns it (``drive(plan).tree``), read from the manifest."""
        from edgedeploy.core.manifest import Manifest
        from edgedeploy.pipeline.tree_run import OptimizeOutcome

        records = Manifest.load(self.run_dir).records
        outcome = OptimizeOutcome(self.run_dir)
        for rid, rec in records.items():
            stage, _, name = rid.partition("/")
            if stage == "convert":
                outcome.leaves[name] = rec
            elif stage == "optimize":
                outcome.nodes[name] = rec
        return outcome

    def recipe(self, **overrides):
        from edgedeploy.config.recipe import load_recipe

        return load_recipe(overrides={**self.settings, "leaves": list(TREE_LEAVES), **overrides})

    def copy(self, dest: Path) -> Path:
        """A copy of the run folder at ``dest`` (a folder that does not exist yet), for a test that writes."""
        shutil.copytree(self.run_dir, dest, symlinks=True)
        return dest


def shared_root(tmp_path_factory) -> Path:
    """A folder every pytest-xdist worker of this run sees (the base temp folder without xdist)."""
    base = tmp_path_factory.getbasetemp()
    return base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base


@pytest.fixture(scope="session")
def trained_tree(tmp_path_factory) -> TrainedTree:
    """:data:`TREE_LEAVES` of the bundled example, trained once per test run (across pytest-xdist workers: the first
    to ask trains it under a file lock, the others wait for it and read it)."""
    from filelock import FileLock

    root = shared_root(tmp_path_factory) / "trained-tree"
    root.mkdir(exist_ok=True)
    out, done = root / "run", root / "optimize.json"
    with FileLock(str(root / "lock")):
        if not done.is_file():
            shutil.rmtree(out, ignore_errors=True)
            s = TREE_SETTINGS
            # in this process, which has TensorFlow loaded already (a new one would spend seconds importing it)
            proc = run_in_process("optimize", TREE_MODEL, "--data", TREE_DATA, "-o", out, "--leaves", ",".join(TREE_LEAVES),
                                  "--epochs", s["epochs"], "--min-steps", s["min_steps"], "--seed", s["seed"],
                                  "--sparsity", s["sparsity"], "--clusters", s["clusters"], "--json")
            assert proc.returncode == 0, proc.stderr[-3000:]
            done.write_text(proc.stdout)
    return TrainedTree(out, TREE_MODEL, TREE_DATA, dict(TREE_SETTINGS), json.loads(done.read_text()))
