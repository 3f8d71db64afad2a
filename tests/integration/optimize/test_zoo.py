"""The model zoo (tests/zoo.py) through the commands, as a user runs them: structure, not accuracy.

Each architecture (tf_keras ``.h5``, seeded random weights and data, a few training steps) goes through
``edgedeploy optimize`` (ptq, a QAT-family leaf but on the Conv1D net, whose QAT is test_optimize.py's, and the
thinned leaf where its search is cheap), ``edgedeploy compile`` for Ethos-U55-128 and ``edgedeploy verify`` on it;
what cannot go through stops with one line naming the reason. The whole matrix (every leaf, 2:4, three targets,
Keras 3 files, export) is ``bench/bench_models.py``, run by the slow test at the end.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from helpers import one_error_line, run_in_process

import zoo

REPO = Path(__file__).resolve().parents[3]
TARGET = "ethos-u55-128"

# architecture -> (leaves, the thinned node's layers left whole with the reason, where a thinned leaf is asked for:
# only on the smallest nets, whose width search compiles few candidates)
CASES = {
    "mobilenet_v1": ("ptq,qat", None),
    "mobilenet_v2": ("ptq,pqat", None),
    "mobilenet_v2_transfer": ("ptq,qat", None),  # nested: flattened before the tree
    "mobilenet_v3_small": ("ptq,qat", None),
    "mobilenet_v3_small_minimalistic": ("ptq,qat", None),
    "efficientnet_like": ("ptq,qat", None),  # thinned: in the slow matrix (its width search compiles many)
    "resnet_like": ("ptq,cqat,thinned", {
        "predictions": "it is a model output",
        "stem_conv": "stem_dw (DepthwiseConv2D) has depth_multiplier 2: each input channel feeds several output "
                     "channels, which are kept together with it"}),
    "densenet_like": ("ptq,pcqat", None),
    # QAT of Conv1D layers (rewritten as the Conv2D the converter writes): test_optimize.py's Conv1D tree
    "conv1d_kws": ("ptq,thinned", {"predictions": "it is a model output"}),
    "dense_autoencoder": ("ptq,qat,thinned", {"reconstruction": "it is a model output"}),
    "two_outputs": ("ptq,qat,thinned", {"class": "it is a model output", "box": "it is a model output"}),
}
# architecture -> (exit code, what the one error line says) where a QAT-family leaf asked for stops (ptq goes through)
KNOWN: dict[str, tuple[int, str]] = {}


# fine-tune and evaluation samples of each net's data: a tiny recipe's batch or two (structure, not accuracy)
N_FIT, N_EVAL = 32, 16


@pytest.fixture(scope="module")
def zoo_dir(tmp_path_factory) -> Path:
    """The folder of the nets the tests ask for (:func:`zoo_net`) and the tiny recipe, its thinned width search on
    the coarsest grid (two widths a group: 4 candidates compiled, not 25): these tests check that a net thins, keeps
    its channels and leaves its outputs whole, not which width the finer grid finds (the default five-width search
    is tests/integration/optimize/test_thin.py's, and the slow matrix's)."""
    out = tmp_path_factory.mktemp("zoo")
    (out / "tiny.toml").write_text("thin_candidates = 2\n" + zoo.TINY_RECIPE)
    return out


def zoo_net(folder: Path, name: str, **options) -> tuple[Path, Path]:
    """The zoo net ``name`` (its builder given ``options``) saved in ``folder`` and its data, written on first ask
    (only the selected cases')."""
    model, data = folder / f"{name}.h5", folder / f"{name}.npz"
    if not model.is_file():
        from edgedeploy.keras import tfenv

        zoo.write_net(tfenv.load().keras, folder, name, ".h5", N_FIT, N_EVAL, **options)
    return model, data


def test_every_zoo_model_is_covered():
    assert sorted(CASES) == sorted(zoo.ZOO)


# The default run takes the nets that bring the couplings the others share (squeeze-and-excitation and swish,
# Conv1D); the larger nets run with -m slow (and in bench/bench_models.py). MobileNetV3's hard-swish is checked in
# the default run on small models instead: its QAT rewrite in tests/integration/keras/test_qat_rewrites.py, its
# Keras 3 loading and its NPU operators in tests/integration/keras/test_keras3_activations.py. The two small nets
# whose kind the default run covers elsewhere also run with -m slow: ``two_outputs`` goes through optimize, compile,
# report and export in tests/integration/pipeline/test_several_outputs.py, and a dense autoencoder trains on
# inputs-only data, compiles and verifies in tests/integration/pipeline/test_tasks.py; that a model output is never
# thinned is tests/integration/optimize/test_thin.py's.
DEFAULT = {"efficientnet_like", "conv1d_kws"}
# builder options of the default run's nets: the EfficientNet-like net as one MBConv block that expands its input
# and adds back to it (every layer kind of the net's blocks: expansion, depthwise, squeeze-and-excitation, swish,
# projection, residual Add) at a third of its layers to build, train and convert. The whole net runs with -m slow,
# as the other large nets do (test_the_whole_support_matrix_..., bench/bench_models.py).
OPTIONS = {"efficientnet_like": {"blocks": ((4, 16, 1),)}}


@pytest.mark.parametrize("name", [n if n in DEFAULT else pytest.param(n, marks=pytest.mark.slow) for n in CASES])
def test_zoo_model_through_optimize_compile_and_verify(zoo_dir, tmp_path, name):
    leaves, not_thinned = CASES[name]
    run = tmp_path / "run"
    model, data = zoo_net(zoo_dir, name, **OPTIONS.get(name, {}))
    proc = run_in_process("optimize", model, "--data", data, "-o", run,
                          "--recipe", zoo_dir / "tiny.toml", "--leaves", leaves, "--json")
    if name in KNOWN:
        assert (proc.returncode, KNOWN[name][1] in one_error_line(proc)) == (KNOWN[name][0], True), proc.stderr
        leaves = "ptq"  # what was converted before it stopped
    else:
        assert proc.returncode == 0, proc.stderr[-2000:]
    manifest = {r["id"]: r for r in json.loads((run / "manifest.json").read_text())["stages"]}
    for leaf in leaves.split(","):
        assert manifest[f"convert/{leaf}"]["status"] == "ok"
    if not_thinned is not None:
        thinning = manifest["optimize/thinned"]["details"]["thinning"]
        assert thinning["not_thinned"] == not_thinned
        assert any(w < thinning["full_widths"][g] for g, w in thinning["widths"].items())
        checks = [r for r in manifest["convert/thinned"]["details"]["preservation"] if r.get("check") == "channels"]
        assert checks and all(r["status"] == "ok" for r in checks)
    proc = run_in_process("compile", run, "-t", TARGET, "--allow-cpu-ops", "--json")
    assert proc.returncode == 0, proc.stderr[-2000:]
    results = {r["variant"]: r for r in json.loads(proc.stdout)["results"]}
    assert sorted(results) == sorted(leaves.split(","))
    assert all(r["status"] == "ok" and r["metrics"]["npu_cycles"]["value"] > 0 for r in results.values())
    for leaf in [leaf for leaf in leaves.split(",") if leaf in ("ptq", "thinned")]:  # and the thinned leaf if any
        proc = run_in_process("verify", run, "--leaf", leaf, "-t", TARGET, "--count", "1", "--json")
        assert proc.returncode == 0, proc.stderr[-2000:]


@pytest.mark.slow
def test_the_whole_support_matrix_names_a_reason_for_every_failing_cell(tmp_path):
    """Every architecture, leaf (2:4 included), target and format through bench/bench_models.py (its plan): a cell
    that fails says why, every leaf is verified on every target it compiled for, and MobileNet-v2 and the
    EfficientNet-like net get a thinned leaf within budget on U55-128."""
    sys.path.insert(0, str(REPO / "bench"))
    import bench_models

    doc_path = tmp_path / "matrix.json"
    assert bench_models.main(["--out", str(tmp_path / "bench"), "--json", str(doc_path)]) == 0
    doc = json.loads(doc_path.read_text())
    assert {p["name"] for p in doc["models"]} == set(zoo.ZOO)
    assert {p["format"] for p in doc["models"]} == {"h5", "keras"}
    for part in doc["models"]:
        for row, cells in part["rows"].items():
            for stage, cell in cells.items():
                assert cell["status"] != "failed" or len(cell["text"]) > 10, (part["name"], row, stage, cell)
            for target in doc["targets"]:
                if cells.get(target, {}).get("status") in ("ok", "cpu"):
                    assert f"verify {target}" in cells, (part["name"], row, target)
    for name in ("mobilenet_v2", "efficientnet_like"):
        part = next(p for p in doc["models"] if p["name"] == name and p["format"] == "h5")
        assert "budget met on ethos-u55-128" in part["rows"]["thinned"]["optimize"]["text"]
