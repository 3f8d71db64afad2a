"""Palette-aware leaves on the real MLPerf DS-CNN and Speech Commands features (2 epochs, a small real subset).

Through the command line: `edgedeploy compile edgedeploy.toml` (Vela with its debug database) over a copy of the
run's shared tree (``trained_tree`` in tests/integration/conftest.py: `edgedeploy optimize ... --leaves
...,pcqat`), which trains the palette leaf beside the tree's and compiles them, then `edgedeploy report`. The int8
kernels are read straight from each leaf's .tflite, independently of edgedeploy's own preservation table.

With -m slow: the default run checks the palette leaf's training on a smaller model (pcqat_palette in
test_optimize.py's Conv1D tree: at most 32 values per kernel, sparsity kept, the ptq leaf's operators; cqat_palette
in test_palette_qat_rewrites.py), Vela's debug database read into per-layer NPU weights
(tests/integration/vela/test_compile.py) and the report's compression entries
(tests/integration/report/test_report_integration.py). Here, on the real DS-CNN, the figures: the palette leaf's
Vela-encoded weights against TFMOT's pcqat.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import numpy as np
import pytest

from helpers import run_in_process

from edgedeploy.tflite.reader import read_weight_tensors

pytestmark = [pytest.mark.requires_data, pytest.mark.slow]

CLUSTERS, SPARSITY, EPOCHS, SEED = 16, 0.5, 1, 7  # (the size-budget test's own run)
LEAVES = "ptq,pcqat,pcqat_palette"


def _cli(*args: str) -> subprocess.CompletedProcess:
    return run_in_process(*args)


@pytest.fixture(scope="module")
def small_kws(shared_data, tmp_path_factory, stratified) -> Path:
    """1,024 real fine-tune clips (a seeded class-balanced choice: the file is sorted by class) and 912 evaluation
    clips (every other one of the speaker-disjoint eval split)."""
    d = np.load(shared_data / "kws" / "speech_commands_v2_test_mfcc_mlperf.npz")
    fit = np.sort(stratified(np.where(d["split"] == 0)[0], d["y"], 1024, seed=0))
    ev = np.where(d["split"] == 1)[0][::2]
    idx = np.concatenate([fit, ev])
    path = tmp_path_factory.mktemp("kws") / "kws.npz"
    np.savez(path, x=d["x"][idx], y=d["y"][idx], split=d["split"][idx], labels=d["labels"])
    return path


@pytest.fixture(scope="module")
def palette_run(trained_tree, tmp_path_factory):
    """A copy of the shared tree `edgedeploy optimize` trained, compiled by a project naming the same model, data and
    recipe with the leaves ptq, pcqat and pcqat_palette: the palette leaf's nodes are trained, the others reused."""
    s = trained_tree.settings
    assert (s["sparsity"], s["clusters"]) == (SPARSITY, CLUSTERS)
    out = trained_tree.copy(tmp_path_factory.mktemp("palette") / "run")
    project = out.parent / "edgedeploy.toml"
    project.write_text(
        f'model = "{trained_tree.model}"\ndata = "{trained_tree.data}"\nout = "{out}"\ntargets = ["ethos-u55-128"]\n'
        f'[recipe]\nleaves = {json.dumps(LEAVES.split(","))}\nepochs = {s["epochs"]}\ntraining.min_steps = 0\n'
        f'seed = {s["seed"]}\nsparsity = {SPARSITY}\nclusters = {CLUSTERS}\n')
    comp = _cli("compile", str(project), "--json")
    assert comp.returncode == 0, comp.stderr[-3000:]
    return out, trained_tree.optimize_json, json.loads(comp.stdout)


def _stages(out: Path) -> dict:
    return {s["id"]: s for s in json.loads((out / "manifest.json").read_text())["stages"]}


def test_compile_reused_the_optimized_tree(palette_run, trained_tree):
    out, opt, _ = palette_run
    assert {"ptq", "pcqat"} <= {leaf["leaf"] for leaf in opt["leaves"]}
    stages = _stages(out)
    # nothing the tree holds was trained or converted again: those stages are the ones optimize recorded
    trained = _stages(trained_tree.run_dir)
    assert {i: stages[i]["started"] for i in trained} == {i: r["started"] for i, r in trained.items()}
    assert stages["optimize/pcqat_palette"]["parent"] == "optimize/pruned_clustered_palette"
    assert stages["optimize/pruned_clustered_palette"]["parent"] == "optimize/pruned"
    assert {"compile/pcqat_palette/ethos-u55-128", "compile/pcqat/ethos-u55-128"} <= set(stages)


def test_palette_kernels_have_at_most_clusters_values_per_tensor_and_keep_sparsity(palette_run):
    out, _, _ = palette_run
    tensors = read_weight_tensors(out / _stages(out)["convert/pcqat_palette"]["outputs"][0]["path"])
    kinds = [t.op for t in tensors]
    assert kinds.count("CONV_2D") == 5 and kinds.count("DEPTHWISE_CONV_2D") == 4 and kinds.count("FULLY_CONNECTED") == 1
    for t in tensors:
        values = t.values()
        assert len(np.unique(values)) <= CLUSTERS, (t.name, len(np.unique(values)))
        if t.op in ("CONV_2D", "FULLY_CONNECTED"):  # TFMOT pruned these; depthwise kernels stay dense
            assert np.mean(values == 0) >= SPARSITY - 0.02, (t.name, np.mean(values == 0))
    # TFMOT's pcqat on the same tree: per-channel scales spread its clusters over more values than the palette
    pcqat = read_weight_tensors(out / _stages(out)["convert/pcqat"]["outputs"][0]["path"])
    assert max(len(np.unique(t.values())) for t in pcqat) > CLUSTERS


def test_palette_encoded_weights_are_smaller_than_pcqat(palette_run):
    out, _, _ = palette_run
    stages = _stages(out)
    mine = stages["compile/pcqat_palette/ethos-u55-128"]
    theirs = stages["compile/pcqat/ethos-u55-128"]
    a, b = mine["metrics"]["encoded_weights_bytes"]["value"], theirs["metrics"]["encoded_weights_bytes"]["value"]
    assert a < b, (a, b)
    # Vela's debug database was written and parsed: per-layer bytes add up to Vela's summary
    layers = mine["details"]["npu_weights"]["layers"]
    assert len(layers) == 10 and sum(r["encoded_weight_bytes"] for r in layers) == a
    assert all(r["int8_distinct"] <= CLUSTERS for r in layers)
    assert mine["metrics"]["weight_read_cycles"]["mode"] == "estimated"
    roles = {o["role"] for o in mine["outputs"]}
    assert "debug_db" in roles


def test_preservation_and_accuracy_are_recorded(palette_run):
    out, _, _ = palette_run
    rec = _stages(out)["convert/pcqat_palette"]
    rows = rec["details"]["preservation"]
    assert len(rows) == 10 and all(r["status"] == "ok" for r in rows)
    assert rec["metrics"]["max_distinct_int8_per_tensor"]["value"] <= CLUSTERS
    assert rec["metrics"]["int8_accuracy"]["mode"] == "measured"
    ptq = _stages(out)["convert/ptq"]["metrics"]["int8_accuracy"]["value"]
    assert ptq > 80  # the published float model: 92.2% on the full test set


def test_report_shows_npu_weights(palette_run):
    out, _, _ = palette_run
    rep = _cli("report", str(out), "--format", "json")
    assert rep.returncode == 0, rep.stderr[-2000:]
    doc = json.loads(rep.stdout)
    entry = doc["compression"]["pcqat_palette"]
    assert entry["status"] == "kept"
    assert entry["npu_weights"]["ethos-u55-128"]["summary"]["layers_over_palette"] == 0
    assert "Vela's debug database" in entry["note"]
    assert doc["compression"]["pcqat"]["status"] == "lost"


@pytest.mark.slow
def test_a_size_budget_holds_on_the_compiled_leaf(shared_data, small_kws, tmp_path):
    """`[palette] size_budget` through `edgedeploy compile`: the leaf's Vela-encoded weights are within the
    fraction of the ptq leaf's, as the sweep planned them."""
    model = shared_data / "kws" / "dscnn_mlperf_float.h5"
    out = tmp_path / "run"
    project = tmp_path / "edgedeploy.toml"
    project.write_text(
        f'model = "{model}"\ndata = "{small_kws}"\nout = "{out}"\ntargets = ["ethos-u55-128"]\n'
        f'[recipe]\nleaves = ["ptq", "clustered_palette"]\nepochs = {EPOCHS}\ntraining.min_steps = 0\nseed = {SEED}\n'
        '[recipe.palette]\nsearch = true\nsize_budget = 0.45\nclusters = [4, 8, 16]\nsparsities = [0.0, 0.5]\n')
    comp = _cli("compile", str(project), "--json")
    assert comp.returncode == 0, comp.stderr[-3000:]
    stages = _stages(out)
    ptq = stages["compile/ptq/ethos-u55-128"]["metrics"]["encoded_weights_bytes"]["value"]
    mine = stages["compile/clustered_palette/ethos-u55-128"]["metrics"]["encoded_weights_bytes"]["value"]
    size = stages["optimize/clustered_palette"]["details"]["sweep"]["size"]
    assert size["fits"] and mine <= 0.45 * ptq, (mine, ptq)
    # the sweep's reference is the ptq leaf as compiled, and its planned bytes are what Vela encodes
    assert size["reference_encoded_bytes"] == ptq and size["encoded_bytes"] == mine
