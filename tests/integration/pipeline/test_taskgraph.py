"""The tree as a task graph: two stage workers (``jobs = 2``) give the leaves, int8 accuracies, preservation rows
and compiles of the one-at-a-time run, and a leaf's compile starts while the tree is still training.

The one-at-a-time run is the run's shared tree (``trained_tree``, trained with one job by `edgedeploy optimize`),
its ptq leaf and two leaves of one trained node each (:data:`TRAINED`: the cheapest two the tree holds) compiled here
into a copy of its folder. Stages that do not train (the ptq chain) must give the same bytes. A node trained in
another process may end with float weights a few bits apart (TensorFlow's thread pools schedule its updates
differently; seen once in CI on the qat node, its int8 accuracy and preservation unchanged): for the trained chains
the records must agree on everything but the files' bytes and the cache keys made from them."""

from __future__ import annotations

import calendar
import time
from dataclasses import replace

VOLATILE = ("started", "seconds")  # when and how long; everything else of a record must match
# leaves of one node trained from the baseline each, cheapest first (no quantization-aware model to build for the
# first two); the test takes the first two the shared tree holds
TRAINED = ("pruned", "clustered", "qat")


def _epoch(iso: str) -> float:
    return calendar.timegm(time.strptime(iso, "%Y-%m-%dT%H:%M:%SZ"))


def _trained(rec) -> dict:
    d = _comparable(rec)
    d.pop("cache_key", None)
    for files in ("inputs", "outputs"):
        d[files] = [{k: v for k, v in a.items() if k not in ("sha256", "bytes")} for a in d.get(files, [])]
    keep = ("int8_accuracy", "float_accuracy")
    d["metrics"] = {k: v for k, v in d.get("metrics", {}).items() if k in keep}
    d.pop("details", None)  # sizes and per-layer facts of the files themselves; preservation is checked above
    return d


def _comparable(rec) -> dict:
    d = rec.to_dict()
    for key in VOLATILE:
        d.pop(key, None)
    d["metrics"] = {k: v for k, v in d.get("metrics", {}).items() if not k.endswith("_seconds")}
    d["details"] = {k: v for k, v in d.get("details", {}).items() if k != "time_by_step"}  # measured seconds
    if d.get("tool"):  # Vela's command line and its log name the run folder
        d["tool"] = {k: v for k, v in d["tool"].items() if k != "argv"}
    d["outputs"] = [{k: v for k, v in a.items() if a["role"] != "log" or k == "path"} for a in d["outputs"]]
    return d


def test_two_jobs_give_the_one_job_run_and_compiles_overlap_training(trained_tree, tmp_path):
    from edgedeploy.pipeline.compile import CompileOptions, resolve_targets
    from edgedeploy.core.manifest import Manifest
    from edgedeploy.pipeline.driver import drive
    from edgedeploy.pipeline.run_plan import Plan

    model, data = trained_tree.model, trained_tree.data
    trained = [leaf for leaf in TRAINED if leaf in trained_tree.outcome.leaves][:2]
    assert len(trained) == 2, f"the shared tree holds fewer than two of {TRAINED}"
    leaves = ["ptq", *trained]
    recipe = trained_tree.recipe(leaves=leaves)
    targets = resolve_targets(["ethos-u55-128"])
    opts = CompileOptions(jobs=1)
    # the shared tree's stages, reused, and the three leaves' compiles
    one = drive(Plan(model, data, trained_tree.copy(tmp_path / "one"), recipe, targets=targets, options=opts)).tree
    two = drive(Plan(model, data, tmp_path / "two", replace(recipe, jobs=2), targets=targets, options=opts)).tree

    assert list(two.leaves) == list(one.leaves) == leaves
    for leaf in one.leaves:
        assert two.leaves[leaf].metric("int8_accuracy") == one.leaves[leaf].metric("int8_accuracy")
        assert two.leaves[leaf].details["preservation"] == one.leaves[leaf].details["preservation"]
    a, b = Manifest.load(tmp_path / "one").records, Manifest.load(tmp_path / "two").records
    mine = sorted(i for i, r in a.items() if r.variant in ("baseline", *one.leaves))  # the three leaves' chains
    assert sorted(b) == mine
    assert len([i for i in b if i.startswith("compile/")]) == 3
    shared = Manifest.load(trained_tree.run_dir).records
    assert all(a[i].started == shared[i].started for i in mine if not i.startswith("compile/"))  # none ran again
    for stage_id in b:
        if any(part in trained for part in stage_id.split("/")):  # trained, or made from what was
            assert _trained(b[stage_id]) == _trained(a[stage_id]), stage_id
        else:
            assert _comparable(b[stage_id]) == _comparable(a[stage_id]), stage_id
    # two trainings ran at once, and the ptq leaf compiled while a node was still training
    nodes = [b[f"optimize/{n}"] for n in trained]
    last_end = max(_epoch(r.started) + r.seconds for r in nodes)
    assert _epoch(b["compile/ptq/ethos-u55-128"].started) < last_end
    assert _epoch(nodes[1].started) < _epoch(nodes[0].started) + nodes[0].seconds
    # an unchanged re-run with two jobs reuses every stage
    again = drive(Plan(model, data, tmp_path / "two", replace(recipe, jobs=2), targets=targets, options=opts)).tree
    assert {r.id for r in again.compiled.records} == again.compiled.cached_ids


def _die(env, name, inputs, out, sig):  # a stage whose work kills the process it runs in
    import os

    os.kill(os.getpid(), sig)


def test_a_stage_worker_that_dies_ends_as_one_line_with_exit_6(tmp_path):
    import signal

    import pytest

    from edgedeploy.errors import ToolFailedError
    from edgedeploy.pipeline.runners.local import LocalStages

    runner = LocalStages(2)
    try:
        future = runner.submit(_die, "node", {}, tmp_path, signal.SIGKILL)
        with pytest.raises(ToolFailedError) as err:
            runner.collect(future, tmp_path)
    finally:
        runner.close()
    assert err.value.exit_code == 6
    assert "a stage worker process died" in err.value.one_line() and "jobs, now 2" in err.value.one_line()
