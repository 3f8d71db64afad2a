"""Weight statistics of one kernel: the fraction of zeros, distinct values, per output channel too."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np


@dataclass(frozen=True)
class WeightStats:
    layer: str
    kind: str  # Conv2D, DepthwiseConv2D, Dense, ...
    shape: tuple[int, ...]
    sparsity: float
    unique: int
    max_unique_per_channel: int
    channels: int
    scales: int = 0  # quantization scales in an int8 tensor (1 = per tensor); 0 for float weights

    def to_dict(self) -> dict[str, Any]:
        return {
            "layer": self.layer,
            "kind": self.kind,
            "shape": list(self.shape),
            "sparsity": round(self.sparsity, 4),
            "unique": self.unique,
            "max_unique_per_channel": self.max_unique_per_channel,
            "channels": self.channels,
            "scales": self.scales,
        }


def stats(layer: str, kind: str, values: np.ndarray, channel_axis: int, scales: int = 0) -> WeightStats:
    values = np.asarray(values)
    moved = np.moveaxis(values, channel_axis, 0).reshape(values.shape[channel_axis], -1)
    per_channel = max(len(np.unique(row)) for row in moved) if moved.size else 0
    return WeightStats(
        layer=layer,
        kind=kind,
        shape=tuple(values.shape),
        sparsity=float(np.mean(values == 0)) if values.size else 0.0,
        unique=int(len(np.unique(values))),
        max_unique_per_channel=int(per_channel),
        channels=int(values.shape[channel_axis]),
        scales=scales,
    )
