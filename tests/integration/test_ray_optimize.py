"""`optimize --executor ray`: every stage runs as a Ray task on a local Ray head, with the same leaves (int8
accuracies, preserved sparsity) as the local run, and the artifacts in the same run folder layout."""

from __future__ import annotations

from pathlib import Path

import pytest

from edgedeploy.recipe import load_recipe

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "kws_tree"


@pytest.mark.slow
def test_ray_stages_give_the_local_leaves(tmp_path, ray_home):
    pytest.importorskip("ray", reason="Ray is not installed (pip install 'edgedeploy[ray]')")
    from edgedeploy.optimize import optimize

    model, data = EXAMPLE / "dscnn_mlperf_float.h5", EXAMPLE / "speech_commands_subset.npz"
    recipe = load_recipe(overrides={"leaves": ["ptq", "pruned"], "epochs": 1, "min_steps": 0, "batch_size": 64,
                                    "seed": 3})
    local = optimize(model, data, tmp_path / "local", recipe)
    on_ray = optimize(model, data, tmp_path / "ray", recipe, executor="ray")
    for leaf in ("ptq", "pruned"):
        a, b = local.leaves[leaf], on_ray.leaves[leaf]
        assert b.metric("int8_accuracy") == a.metric("int8_accuracy")
        assert b.metric("float_accuracy") == a.metric("float_accuracy")
        assert b.details["preservation"] == a.details["preservation"]
        assert (tmp_path / "ray" / b.output("int8_model").path).is_file()
    assert set(on_ray.nodes) == {"baseline", "pruned"}
    # an unchanged re-run reuses every stage without starting Ray
    import ray

    again = optimize(model, data, tmp_path / "ray", recipe, executor="ray")
    assert not ray.is_initialized()
    assert {r.id for r in again.leaves.values()} == {r.id for r in on_ray.leaves.values()}
