"""Vela compiles as Ray tasks give the same results, stored the same way, as the local process pool: the DS-CNN
(bundled) on two targets. One worker each (one Ray worker and one pool process to start): the check is what comes
back from the tasks and where it is stored, not how many ran at once (several pool jobs
at once: tests/integration/vela/test_compile.py)."""

from __future__ import annotations

import pytest

from edgedeploy.pipeline.compile import CompileOptions, compile_tflite


def test_ray_executor_matches_local_pool(dscnn_int8, tmp_path, ray_home):
    pytest.importorskip("ray", reason="Ray is not installed (pip install 'edgedeploy[ray]')")
    models = [dscnn_int8]
    targets = ["ethos-u55-128", "ethos-u85-256"]
    local = compile_tflite(models, targets, tmp_path / "local", CompileOptions(jobs=1))
    ray_run = compile_tflite(models, targets, tmp_path / "ray", CompileOptions(jobs=1, executor="ray"))
    key = lambda r: (r.variant, r.target)  # noqa: E731
    a = {key(r): {k: m.value for k, m in r.metrics.items()} for r in local.records}
    b = {key(r): {k: m.value for k, m in r.metrics.items()} for r in ray_run.records}
    assert len(b) == 2 and a == b
    for r in ray_run.records:
        assert {x.role for x in r.outputs} >= {"vela_model", "summary_csv", "per_layer_csv", "log"}
        # the compiled models are byte-identical to the local ones
        local_rec = next(x for x in local.records if key(x) == key(r))
        assert r.output("vela_model").sha256 == local_rec.output("vela_model").sha256
    # an unchanged re-run reuses the results without starting Ray
    import ray

    again = compile_tflite(models, targets, tmp_path / "ray", CompileOptions(jobs=1, executor="ray"))
    assert len(again.cached_ids) == 2 and not ray.is_initialized()
