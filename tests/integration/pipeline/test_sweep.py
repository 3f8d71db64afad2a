"""`edgedeploy compile PROJECT` on a project listing several models, then `edgedeploy report OUT` comparing them:
real Speech Commands clips of the bundled example, real TFMOT and Vela.

The project is examples/sweep/edgedeploy.toml (its data, models, recipes and requirements) cut to one epoch
(min_steps = 0, no hold-out selection, no distillation) so the test takes seconds, plus a third model whose data
does not fit it: the other two still finish, the sweep exits with that model's code (3) and the report names it.
Then `--walk` over the same folder walks each model, reusing what the sweep trained. Each model is the committed
small classifier of the same clips (tests/data/models/kws_mlp.h5) in place of the example's DS-CNN: what is checked
is the sweep (folders, failures, recipe keys, the comparison, the walks), and a model of two Dense blocks has far
fewer layers to wrap, trace and convert. Like the DS-CNN, its ptq leaf is over the example's flash limit and its
pruned leaves are within it.
"""

from __future__ import annotations

import json
import tomllib
from pathlib import Path

import numpy as np
import pytest

from helpers import input_models, run_in_process

from edgedeploy.core.manifest import Manifest

EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "sweep" / "edgedeploy.toml"
TARGET = "ethos-u55-128"
MODEL = input_models().HERE / "kws_mlp.h5"  # the subset's 12 classes from its 49x10 MFCC maps


def project(tmp: Path) -> Path:
    """The example's project with its paths made absolute, :data:`MODEL` for each model, one epoch, and a third
    model with unusable data."""
    doc = tomllib.loads(EXAMPLE.read_text(encoding="utf-8"))
    base = EXAMPLE.parent
    assert [m["name"] for m in doc["models"]] == ["dscnn", "dscnn_sparse"]
    rng = np.random.default_rng(0)
    np.savez(tmp / "wrong.npz", x=rng.normal(size=(40, 7)).astype("float32"), y=rng.integers(0, 12, 40),
             split=np.repeat([0, 1], 20))
    models = "".join(
        f'[[models]]\nname = "{m["name"]}"\nmodel = "{MODEL}"\n'
        + (f"recipe = {{ sparsity = {m['recipe']['sparsity']} }}\n" if "recipe" in m else "")
        for m in doc["models"][:1]) + (
        f'[[models]]\nname = "broken"\nmodel = "{MODEL}"\n'
        f'data = "wrong.npz"\n') + "".join(
        f'[[models]]\nname = "{m["name"]}"\nmodel = "{MODEL}"\n'
        f"recipe = {{ sparsity = {m['recipe']['sparsity']}, learning_rate = {m['recipe']['learning_rate']} }}\n"
        for m in doc["models"][1:])
    path = tmp / "edgedeploy.toml"
    path.write_text(
        f'data = "{(base / doc["data"]).resolve()}"\nout = "out"\ntargets = ["{TARGET}"]\n'
        '[recipe]\nleaves = ["ptq", "pruned"]\nepochs = 1\nbatch_size = 64\nlearning_rate = 1e-4\nseed = 0\n'
        # nothing held out to pick an epoch and no teacher's outputs to compute: the sweep is checked, not the recipe
        'training.min_steps = 0\nselection.validation_fraction = 0.0\ndistillation.enabled = false\n'
        f"[requirements]\nmax_flash = {doc['requirements']['max_flash']}\n" + models, encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def swept(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("sweep")
    path = project(tmp)
    # in this process, which has TensorFlow loaded already: the check is the command's outcome (exit code, error
    # line, JSON, run folders); test_ray_address runs `compile` as the console script
    return tmp, path, run_in_process("compile", path, "--json", cwd=tmp)


def test_each_model_runs_into_its_own_folder_and_a_failure_does_not_stop_the_others(swept):
    tmp, _, proc = swept
    assert proc.returncode == 3, proc.stderr  # the broken model's exit code
    (line,) = [ln for ln in proc.stderr.splitlines() if ln.startswith("error:")]
    assert "model 'broken' of the sweep failed:" in line and "finished: dscnn, dscnn_sparse" in line
    doc = json.loads(proc.stdout)  # only JSON on stdout, even when a model failed
    assert doc["schema"] == "edgedeploy.compile_sweep" and list(doc["models"]) == ["dscnn", "broken", "dscnn_sparse"]
    assert doc["models"]["broken"]["status"] == "failed" and doc["models"]["broken"]["error"]["exit_code"] == 3
    record = json.loads((tmp / "out" / "sweep.json").read_text())
    assert record["schema"] == "edgedeploy.sweep" and record["finished"] and record["targets"] == [TARGET]
    assert [(m["name"], m["folder"], m["status"]) for m in record["models"]] == [
        ("dscnn", "dscnn", "ok"), ("broken", "broken", "failed"), ("dscnn_sparse", "dscnn_sparse", "ok")]
    for name in ("dscnn", "dscnn_sparse"):
        results = doc["models"][name]["compile"]["results"]
        assert sorted((r["variant"], r["target"]) for r in results) == [("pruned", TARGET), ("ptq", TARGET)]
        manifest = Manifest.load(tmp / "out" / name)
        ids = {r.id for r in manifest.find()}
        assert {"optimize/pruned", "convert/ptq", "convert/pruned", f"compile/pruned/{TARGET}"} <= ids
    sparsity = {name: Manifest.load(tmp / "out" / name).info["optimize"]["recipe"]["sparsity"]
                for name in ("dscnn", "dscnn_sparse")}
    assert sparsity == {"dscnn": 0.5, "dscnn_sparse": 0.75}  # the model's own recipe key over the shared one


def test_one_report_compares_the_models(swept):
    tmp, path, _ = swept
    proc = run_in_process("report", tmp / "out", "--json", "--project", path)
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert doc["schema"] == "edgedeploy.sweep_report" and doc["comparable"]["ranked"] is True
    assert [(r["model"], r["leaf"], r["target"]) for r in doc["rows"]] == [
        ("dscnn", "ptq", TARGET), ("dscnn", "pruned", TARGET), ("dscnn_sparse", "ptq", TARGET),
        ("dscnn_sparse", "pruned", TARGET)]
    assert any("model broken failed (exit 3)" in n for n in doc["notes"])
    # each row is its member run's own report row, read from that run's manifest
    for name in ("dscnn", "dscnn_sparse"):
        own = json.loads(run_in_process("report", tmp / "out" / name, "--json", "--project", path).stdout)
        mine = [r for r in doc["rows"] if r["model"] == name]
        for r in mine:
            theirs = next(o for o in own["rows"] if o["leaf"] == r["leaf"] and o["target"] == r["target"])
            assert r["values"]["compiled_model_bytes"] == theirs["values"]["compiled_model_bytes"]
            assert r["values"]["int8_accuracy_pct"] == theirs["values"]["int8_accuracy_pct"]
            assert r["recommended"] == theirs["recommended"]
    # the overall pick meets the flash limit, and no other meeting pair beats it on accuracy, flash and cycles
    overall = doc["overall"][TARGET]
    (best,) = [r for r in doc["rows"] if r["overall"]]
    assert (overall["model"], overall["leaf"]) == (best["model"], best["leaf"]) and best["meets_requirements"]
    assert best["values"]["compiled_model_bytes"]["value"] <= 35000 and best["leaf"] == "pruned"

    def point(r):
        return (-r["values"]["int8_accuracy_pct"]["value"], r["values"]["compiled_model_bytes"]["value"],
                r["values"]["total_cycles"]["value"])

    for r in doc["rows"]:
        if r is not best and r["meets_requirements"]:
            assert not all(a <= b for a, b in zip(point(r), point(best))) or point(r) == point(best)
    table = run_in_process("report", tmp / "out", "--project", path)
    assert table.returncode == 0 and f"Overall {TARGET}: {best['model']} / pruned (" in table.stdout
    md = run_in_process("report", tmp / "out", "-f", "markdown", "--project", path).stdout
    assert md.count(f"| {TARGET} |") == 4 and "## Overall recommendation" in md
    html = run_in_process("report", tmp / "out", "-f", "html")
    assert html.returncode == 0 and (tmp / "out" / "report.html").is_file()


def test_walk_walks_each_model_reusing_the_sweeps_nodes(swept):
    tmp, path, _ = swept
    proc = run_in_process("compile", path, "--walk", cwd=tmp)
    assert proc.returncode == 3, proc.stderr  # the broken model again
    for name in ("dscnn", "dscnn_sparse"):
        walk = Manifest.load(tmp / "out" / name).info["walk"]
        assert walk["stopped"] == "met" and walk["recommended"] == "pruned"
        assert [lv["nodes_trained"] for lv in walk["levels"]] == [[], []]  # reused from the sweep's run
        assert f"walk {name}: stopped (met)" in proc.stdout
    assert json.loads((tmp / "out" / "sweep.json").read_text())["mode"] == "walk"


def test_regression_gate_compares_each_model_with_its_own(swept, tmp_path):
    tmp, path, _ = swept
    proc = run_in_process("report", tmp / "out", "--json")
    old = json.loads(proc.stdout)
    (tmp_path / "same.json").write_text(proc.stdout)
    assert run_in_process("report", tmp / "out", "--compare", tmp_path / "same.json", "--fail-on-regression").returncode == 0
    # the reference had dscnn_sparse's ptq leaf 3 points more accurate than now
    model = next(m for m in old["models"] if m["name"] == "dscnn_sparse")
    row = next(r for r in model["report"]["rows"] if r["leaf"] == "ptq")
    row["values"]["int8_accuracy_pct"]["value"] += 3.0
    (tmp_path / "better.json").write_text(json.dumps(old))
    proc = run_in_process("report", tmp / "out", "--compare", tmp_path / "better.json", "--fail-on-regression")
    assert proc.returncode == 10, proc.stderr
    assert "1 regression(s)" in proc.stderr and "dscnn_sparse: ptq on ethos-u55-128: int8 accuracy" in proc.stderr
    one = run_in_process("report", tmp / "out" / "dscnn", "--json").stdout
    (tmp_path / "one.json").write_text(one)
    proc = run_in_process("report", tmp / "out", "--compare", tmp_path / "one.json")
    assert proc.returncode == 2 and "is the report of one run, and this is a sweep's" in proc.stderr


def test_a_walk_that_meets_nothing_fails_its_model_only(swept):
    tmp, path, _ = swept
    # no loss at all against ptq, and ptq itself is over the flash limit: no leaf of either model meets both
    strict = tmp / "strict.toml"
    strict.write_text(path.read_text().replace("max_flash = 35000", "max_flash = 35000\nmax_accuracy_drop = 0.0"))
    proc = run_in_process("compile", strict, "--walk", cwd=tmp)
    assert proc.returncode == 8, proc.stderr  # the first failed model's code: dscnn's walk (8), before broken (3)
    (line,) = [ln for ln in proc.stderr.splitlines() if ln.startswith("error:")]
    assert "model 'dscnn' of the sweep failed: walk through ptq, pruned" in line
    assert "also failed: broken, dscnn_sparse" in line
    record = json.loads((tmp / "out" / "sweep.json").read_text())
    status = {m["name"]: (m["status"], (m.get("error") or {}).get("exit_code")) for m in record["models"]}
    assert status == {"dscnn": ("failed", 8), "broken": ("failed", 3), "dscnn_sparse": ("failed", 8)}
    for name in ("dscnn", "dscnn_sparse"):
        assert Manifest.load(tmp / "out" / name).info["walk"]["stopped"] == "exhausted"
        assert f"walk {name}: stopped (exhausted)" in proc.stdout  # shown although the model failed
