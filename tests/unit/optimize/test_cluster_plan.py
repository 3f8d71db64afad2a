"""How each kernel is clustered when per-channel clusters are asked for (k-means++ needs at least as many weights
as centroids), and how the preservation check judges a layer clustered per tensor instead."""

from __future__ import annotations

import numpy as np
import pytest

from edgedeploy.core.weight_stats import stats
from edgedeploy.optimize import preserve
from edgedeploy.optimize.techniques.cluster import clustering_plan

RNG = np.random.default_rng(0)
WIDE = RNG.normal(size=(3, 3, 8, 4))  # 72 weights per output channel
NARROW = RNG.normal(size=(1, 1, 3, 8))  # 3 weights per output channel, 24 in all
TINY = RNG.normal(size=(1, 1, 2, 4))  # 8 weights in all
SPARSE = WIDE * (np.arange(WIDE.size).reshape(WIDE.shape) // 4 % 8 == 0)  # 9 non-zero weights per channel


@pytest.mark.parametrize("kernel, sparse, per_channel, how, why", [
    (WIDE, False, True, "per channel", ""),
    (NARROW, False, True, "per tensor", "an output channel holds 3 weights <= 16 clusters"),
    (TINY, False, True, "not clustered", "an output channel holds 2 weights <= 16 clusters"),
    (TINY, False, False, "not clustered", "the kernel holds 8 weights <= 16 clusters"),
    (WIDE, True, True, "per channel", ""),
    (SPARSE, True, True, "per tensor", "an output channel holds 9 non-zero weights < 15 non-zero clusters"),
    (NARROW, False, False, "per tensor", ""),
])
def test_clustering_plan(kernel, sparse, per_channel, how, why):
    assert clustering_plan(kernel, 16, sparse, per_channel) == (how, why)


def test_a_layer_clustered_per_tensor_instead_is_judged_per_tensor():
    # 3 weights per channel, 17 distinct values in the tensor: fine per channel, not per tensor
    kernel = np.arange(24, dtype=np.float32).reshape(1, 1, 3, 8) % 17
    found = [stats("narrow", "Conv2D", kernel, 3)]
    fallback = {"narrow": "clustered per tensor: an output channel holds 3 weights <= 16 clusters"}
    judge = dict(sparsity=0.5, clusters=16, tolerance=0.02, per_channel_clusters=True)
    assert not preserve.check("clustered", "keras", found, **judge).failures
    verdict = preserve.check("clustered", "keras", found, **judge, fallback=fallback)
    assert verdict.failures == ["clustered (keras): layer narrow: 17 distinct values > 16 clusters"]
    kernel[kernel == 16] = 0  # 16 distinct values: the per-tensor promise holds, and the row says why
    verdict = preserve.check("clustered", "keras", [stats("narrow", "Conv2D", kernel, 3)], **judge, fallback=fallback)
    assert not verdict.failures
    assert verdict.rows[0]["note"] == fallback["narrow"]
