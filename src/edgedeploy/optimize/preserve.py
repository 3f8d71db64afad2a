"""Preservation checks: did sparsity and clusters survive each stage, in Keras and in the int8 TFLite?

Pure NumPy over weight arrays: per layer, the fraction of zero weights, the number of distinct values per
tensor and the largest number of distinct values in one output channel. Each node of the deployment tree
promises what its techniques give (pruned nodes their sparsity, clustered nodes their clusters); a layer
that loses it fails the stage, except where a known TFMOT limit applies, which is reported as such.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable

from edgedeploy.core.weight_stats import WeightStats
from edgedeploy.errors import PreservationError

from edgedeploy.config.tree import CLUSTERED_NODES, PRUNED_NODES, QAT_CLUSTER_NODES  # what each node of the tree promises

# How the clustering node's record (``fallback_layers``) names a layer asked for per-channel clusters and clustered
# per tensor instead: such a layer is judged per tensor.
PER_TENSOR_FALLBACK = "clustered per tensor"

DEPTHWISE_NOTE = "TFMOT 0.8.1 does not prune or cluster DepthwiseConv2D kernels"


@dataclass
class Verdict:
    rows: list[dict[str, Any]]
    warnings: list[str]
    failures: list[str]


def check(
    node: str,
    where: str,
    found: Iterable[WeightStats],
    *,
    sparsity: float,
    clusters: int,
    tolerance: float,
    skipped: Iterable[str] = (),
    per_channel_clusters: bool = False,
    relu_followed: Iterable[str] = (),
    fallback: dict[str, str] | None = None,
) -> Verdict:
    """Judge the weights of ``node`` (``where`` is "keras" or "int8") against what the node promises.

    ``fallback`` names the layers the clustering node did not cluster as asked, with why (per-channel clusters
    asked, but an output channel holds too few weights): one clustered per tensor instead is judged per tensor;
    one kept as it is already holds no more than ``clusters`` distinct values per channel."""
    fallback = fallback or {}
    skipped = set(skipped)
    relu_followed = set(relu_followed)
    wants_sparsity = node in PRUNED_NODES
    wants_clusters = node in CLUSTERED_NODES
    # With sparsity preserved, zero is kept as a value of its own beside the clusters.
    limit = clusters + (1 if node in PRUNED_NODES and wants_clusters else 0)
    rows, warnings, failures = [], [], []
    for s in found:
        row = {**s.to_dict(), "where": where, "status": "ok", "note": ""}
        eligible = s.kind in ("Conv2D", "Dense") and s.layer not in skipped
        if s.kind == "DepthwiseConv2D" and (wants_sparsity or wants_clusters):
            row.update(status="not optimized", note=DEPTHWISE_NOTE)
        elif s.layer in skipped and (wants_sparsity or wants_clusters):
            row.update(status="skipped", note="listed in skip_layers")
        elif eligible:
            problems = []
            if wants_sparsity and s.sparsity < sparsity - tolerance:
                problems.append(f"sparsity {s.sparsity:.3f} < target {sparsity:.2f} - {tolerance:.2f}")
            if wants_clusters:
                per_tensor_ok = s.unique <= limit
                per_channel_ok = s.max_unique_per_channel <= limit
                by_tensor = fallback.get(s.layer, "").startswith(PER_TENSOR_FALLBACK)
                row["note"] = fallback.get(s.layer, "")
                if (per_channel_clusters and not by_tensor) or s.scales > 1:
                    # per-channel clusters, or int8 per-channel scales: judge each output channel
                    if not per_channel_ok:
                        problems.append(f"{s.max_unique_per_channel} distinct values in one channel > {limit}")
                    elif not per_tensor_ok:
                        row["note"] = (f"{s.unique} distinct values per tensor, at most {s.max_unique_per_channel} "
                                       "per channel (per-channel scales)")
                elif not per_tensor_ok:
                    if node in QAT_CLUSTER_NODES and per_channel_ok and where == "keras":
                        row.update(status="warning", note=f"TFMOT switched this layer to per-channel clusters: "
                                   f"{s.unique} values per tensor, at most {s.max_unique_per_channel} per channel")
                        warnings.append(f"{node}: layer {s.layer}: {row['note']} (a known CQAT/PCQAT behaviour; "
                                        "Vela's palette then holds more values and encoded weights grow)")
                    else:
                        problems.append(f"{s.unique} distinct values > {limit} clusters")
            if problems:
                hint = ""
                if s.layer in relu_followed:
                    hint = " (a separate ReLU layer follows it, so QAT gives it a no-op quantize config)"
                row.update(status="failed", note="; ".join(problems) + hint)
                failures.append(f"{node} ({where}): layer {s.layer}: {row['note']}")
        rows.append(row)
    return Verdict(rows, warnings, failures)


def raise_failures(verdict: Verdict, node: str) -> None:
    if verdict.failures:
        first = verdict.failures[0]
        more = f" (and {len(verdict.failures) - 1} more)" if len(verdict.failures) > 1 else ""
        raise PreservationError(
            f"stage {node} lost what its parent had: {first}{more}",
            "train longer or with a lower learning rate, or list the layer in skip_layers",
        )
