"""The deployment tree, as data: every node and every leaf, written once.

A node is one ``optimize/<node>`` stage: a technique (see :mod:`edgedeploy.optimize.registry`) applied to its
parent's saved model with the node's settings. A leaf converts one node to an int8 TFLite (``convert/<leaf>``).
Recipe validation, the walk in :mod:`edgedeploy.optimize`, the preservation checks, the palette stages and the
report's tree levels all read the tables below; adding a technique is one entry here and one function in the
registry.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Mapping

# Sparsity patterns of the pruned nodes (recipe ``sparsity_pattern``; :mod:`edgedeploy.config.pattern` prunes and checks
# them), and quantizations that are no leaf because Ethos-U cannot run them (asking for one gets the reason).
PATTERNS = ("unstructured", "2:4")
NOT_NPU_FORMATS = {
    "float16": "float16 weights are dequantized to float on the CPU; Ethos-U runs int8 (and 16x8) only",
    "dynamic_range": "dynamic-range quantization keeps float activations, which Ethos-U cannot run",
}


@dataclass(frozen=True)
class Node:
    name: str
    parent: str | None
    technique: str | None  # a key of edgedeploy.optimize.registry.TECHNIQUES; None: the baseline (no training)
    settings: Mapping[str, Any] = field(default_factory=dict)  # the technique's settings for this node
    stage: str | None = None  # the [stages.X] table whose epochs and learning rate it trains with
    qat: bool = False  # trained with fake quantization: saved as weights over its parent, converted from QAT
    keeps_sparsity: bool = False  # preservation: its Conv2D/Dense kernels keep the recipe's sparsity
    keeps_clusters: bool = False  # preservation: at most `clusters` distinct values per kernel (channel)
    keeps_palette: bool = False  # preservation: int8 kernels hold only their shared palette's values
    keeps_channels: bool = False  # preservation: its kernels keep the thinned node's input and output channels
    level: int = 0  # how far down the tree (the recommendation tries lower levels first)


@dataclass(frozen=True)
class Leaf:
    name: str
    node: str
    conversion: str = "int8"  # a key of edgedeploy.optimize.registry.CONVERSIONS
    default: bool = True  # in a recipe's default leaves

    @property
    def level(self) -> int:
        return NODE_TABLE[self.node].level


_QAT_CLUSTER = {"scheme": "cluster_preserve", "preserve_sparsity": False, "settle_clusters": True}
NODE_TABLE: Mapping[str, Node] = MappingProxyType({n.name: n for n in (
    Node("baseline", None, None, level=0),
    Node("pruned", "baseline", "prune", stage="prune", keeps_sparsity=True, level=2),
    Node("clustered", "baseline", "cluster", {"preserve_sparsity": False}, stage="cluster", keeps_clusters=True,
         level=2),
    Node("pruned_clustered", "pruned", "sparsity_preserving_cluster", {"preserve_sparsity": True}, stage="cluster",
         keeps_sparsity=True, keeps_clusters=True, level=3),
    Node("qat", "baseline", "qat", {"scheme": "default_8bit"}, stage="qat", qat=True, level=1),
    Node("pqat", "pruned", "qat", {"scheme": "prune_preserve"}, stage="qat", qat=True, keeps_sparsity=True, level=3),
    Node("cqat", "clustered", "qat", _QAT_CLUSTER, stage="qat", qat=True, keeps_clusters=True, level=3),
    Node("pcqat", "pruned_clustered", "qat", {**_QAT_CLUSTER, "preserve_sparsity": True}, stage="qat", qat=True,
         keeps_sparsity=True, keeps_clusters=True, level=4),
    # palette-aware nodes (edgedeploy.optimize.palette): int8 kernels keep one shared palette per tensor
    Node("clustered_palette", "baseline", "palette", stage="qat", keeps_palette=True, level=2),
    Node("pruned_clustered_palette", "pruned", "palette", stage="qat", keeps_palette=True, level=3),
    Node("cqat_palette", "clustered_palette", "palette_qat", stage="qat", qat=True, keeps_palette=True, level=3),
    Node("pcqat_palette", "pruned_clustered_palette", "palette_qat", stage="qat", qat=True, keeps_palette=True,
         level=4),
    # thinned: whole output channels removed, widths chosen from Vela's cycles (edgedeploy.optimize.techniques.thin)
    Node("thinned", "baseline", "thin", stage="thin", keeps_channels=True, level=2),
    Node("thinned_qat", "thinned", "qat", {"scheme": "default_8bit"}, stage="qat", qat=True, keeps_channels=True,
         level=3),
    Node("thinned_pruned", "thinned", "prune", stage="prune", keeps_sparsity=True, keeps_channels=True, level=3),
    Node("thinned_pqat", "thinned_pruned", "qat", {"scheme": "prune_preserve"}, stage="qat", qat=True,
         keeps_sparsity=True, keeps_channels=True, level=4),
    Node("thinned_pruned_clustered", "thinned_pruned", "sparsity_preserving_cluster", {"preserve_sparsity": True},
         stage="cluster", keeps_sparsity=True, keeps_clusters=True, keeps_channels=True, level=4),
    Node("thinned_pcqat", "thinned_pruned_clustered", "qat", {**_QAT_CLUSTER, "preserve_sparsity": True},
         stage="qat", qat=True, keeps_sparsity=True, keeps_clusters=True, keeps_channels=True, level=5),
)})
LEAF_TABLE: Mapping[str, Leaf] = MappingProxyType({leaf.name: leaf for leaf in (
    Leaf("ptq", "baseline"),
    Leaf("qat", "qat"),
    Leaf("pruned", "pruned"),
    Leaf("pqat", "pqat"),
    Leaf("clustered", "clustered"),
    Leaf("cqat", "cqat"),
    Leaf("pruned_clustered", "pruned_clustered"),
    Leaf("pcqat", "pcqat"),
    # not in the default leaves; ask for them, e.g. `--leaves ptq,pcqat,pcqat_palette`
    *(Leaf(n, n, conversion="palette_int8", default=False) for n in ("clustered_palette", "pruned_clustered_palette", "cqat_palette",
                                          "pcqat_palette")),
    # thinned leaves (not in the default leaves): e.g. `--leaves ptq,thinned,thinned_pcqat`
    *(Leaf(n, n, default=False) for n in ("thinned", "thinned_qat", "thinned_pruned", "thinned_pqat",
                                                         "thinned_pcqat")),
    # the baseline with int16 activations and int8 weights (edgedeploy.tflite.convert16); asked for by name
    Leaf("ptq_16x8", "baseline", conversion="int16x8", default=False),
)})

# Views of the tables in the shapes the rest of the code reads.
NODES: Mapping[str, tuple[str | None, str | None]] = MappingProxyType(
    {n.name: (n.parent, n.technique) for n in NODE_TABLE.values()})
LEAVES: Mapping[str, str] = MappingProxyType({leaf.name: leaf.node for leaf in LEAF_TABLE.values()})
DEFAULT_LEAVES: tuple[str, ...] = tuple(leaf.name for leaf in LEAF_TABLE.values() if leaf.default)
QAT_NODES = frozenset(n.name for n in NODE_TABLE.values() if n.qat)
PRUNED_NODES = frozenset(n.name for n in NODE_TABLE.values() if n.keeps_sparsity)
CLUSTERED_NODES = frozenset(n.name for n in NODE_TABLE.values() if n.keeps_clusters)
QAT_CLUSTER_NODES = frozenset(n.name for n in NODE_TABLE.values() if n.qat and n.keeps_clusters)
THINNED_NODES = frozenset(n.name for n in NODE_TABLE.values() if n.keeps_channels)
PALETTE_NODES = frozenset(n.name for n in NODE_TABLE.values() if n.keeps_palette)
LEAF_LEVELS: Mapping[str, int] = MappingProxyType({leaf.name: leaf.level for leaf in LEAF_TABLE.values()})
# Leaves whose weights were clustered, so Vela's palette encoding should apply to them.
CLUSTERED_LEAVES = frozenset(leaf.name for leaf in LEAF_TABLE.values()
                             if NODE_TABLE[leaf.node].keeps_clusters or NODE_TABLE[leaf.node].keeps_palette)


def node(name: str) -> Node:
    return NODE_TABLE[name]


def leaf(name: str) -> Leaf:
    return LEAF_TABLE[name]


def stage_kind(name: str) -> str:
    """The ``[stages.X]`` table node ``name`` trains with (prune, cluster or qat)."""
    return NODE_TABLE[name].stage or "qat"


def nodes_for(leaves: list[str]) -> list[str]:
    """Every node the leaves need, parents first, each once."""
    order: list[str] = []

    def add(name: str) -> None:
        parent = NODE_TABLE[name].parent
        if parent is not None:
            add(parent)
        if name not in order:
            order.append(name)

    for name in leaves:
        add(LEAF_TABLE[name].node)
    return order
