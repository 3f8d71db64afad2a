"""Vela compiles as Ray tasks give the same results, stored the same way, as the local process pool."""

from __future__ import annotations

import pytest

from edgedeploy.pipeline.compile import CompileOptions, compile_tflite

pytestmark = pytest.mark.requires_data("ic/resnet8_mlperf_int8.tflite")


def test_ray_executor_matches_local_pool(shared_data, tmp_path, ray_home):
    pytest.importorskip("ray", reason="Ray is not installed (pip install 'edgedeploy[ray]')")
    models = [shared_data / "kws" / "dscnn_mlperf_int8.tflite", shared_data / "ic" / "resnet8_mlperf_int8.tflite"]
    targets = ["ethos-u55-128", "ethos-u85-256"]
    local = compile_tflite(models, targets, tmp_path / "local", CompileOptions(jobs=2))
    ray_run = compile_tflite(models, targets, tmp_path / "ray", CompileOptions(jobs=2, executor="ray"))
    key = lambda r: (r.variant, r.target)  # noqa: E731
    a = {key(r): {k: m.value for k, m in r.metrics.items()} for r in local.records}
    b = {key(r): {k: m.value for k, m in r.metrics.items()} for r in ray_run.records}
    assert len(b) == 4 and a == b
    for r in ray_run.records:
        assert {x.role for x in r.outputs} >= {"vela_model", "summary_csv", "per_layer_csv", "log"}
        # the compiled models are byte-identical to the local ones
        local_rec = next(x for x in local.records if key(x) == key(r))
        assert r.output("vela_model").sha256 == local_rec.output("vela_model").sha256
    # an unchanged re-run reuses the results without starting Ray
    import ray

    again = compile_tflite(models, targets, tmp_path / "ray", CompileOptions(jobs=2, executor="ray"))
    assert len(again.cached_ids) == 4 and not ray.is_initialized()
