"""Leaves of the deployment tree as the report sees them: names, levels, the reference leaf."""

from __future__ import annotations

from edgedeploy.config.tree import CLUSTERED_LEAVES, LEAF_LEVELS  # noqa: F401


# Levels of the deployment tree, least optimized first. The recommendation takes
# the least-optimized leaf that meets every requirement and that no other such
# leaf beats on accuracy, flash and latency at once (report.judge). A name ending in one of LEVEL_SUFFIXES has the level of its base
# (``pruned_ptq`` is ``pruned``; ``pcqat_palette`` is ``pcqat``).
# (the levels are the node table's: edgedeploy.config.tree)
LEVEL_SUFFIXES = ("_palette", "_ptq")
REFERENCE_LEAF = "ptq"

from edgedeploy.vela.debugdb import PALETTE_LIMIT  # noqa: E402,F401  (Vela's palette size)


def base_leaf(name: str) -> str:
    for suffix in LEVEL_SUFFIXES:
        if name.endswith(suffix) and name[: -len(suffix)] in LEAF_LEVELS:
            return name[: -len(suffix)]
    return name


def leaf_level(name: str) -> int | None:
    """The tree level of a leaf name, or None for a variant that is not a tree leaf (an imported .tflite)."""
    return LEAF_LEVELS.get(base_leaf(name))


def is_clustered_leaf(name: str) -> bool:
    return base_leaf(name) in CLUSTERED_LEAVES or name.endswith("_palette")
