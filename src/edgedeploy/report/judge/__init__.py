"""The one judge of collected results: the report (per target), the walk (every target at once) and the sweep
(models against each other) all judge with it.

- :mod:`.pareto`: quality, the objectives, dominance, the Pareto front, the orders that rank leaves, and the
  least-optimized leaf that no other beats;
- :mod:`.checks`: requirement checks on a row (and requirements given as options), board fit, size budgets;
- :mod:`.shortfall`: how far a check misses, and which leaf comes closest to a requirement no leaf meets;
- :mod:`.over_reference`: leaves that cost more NPU cycles or flash than ``ptq`` on a target, and the layers why;
- :mod:`.recommend`: the recommendation for one target;
- :mod:`.across_targets`: a walk's verdicts, its pick and its shortfalls, a leaf judged on every target;
- :mod:`.across_models`: a sweep's overall recommendation per target, and whether its models compare.

It judges rows only: it reads no run folder (the size budgets read the manifest's optimize records).
"""

from __future__ import annotations

from .across_models import comparable, overall, sweep_unmet
from .across_targets import judge_leaves, meets_everywhere, pick, shortfalls
from .checks import (
    NOT_COMPILED, REQUIREMENT_VALUES, TARGET_FREE, check_row, judge_uncompiled, requirements_from_options,
    size_budget_misses,
)
from .over_reference import excess_layers, flag_over_reference
from .pareto import (
    dominates, leaf_rank, least_optimized, level_key, objectives, pair_rank, pareto_front, pareto_of_target, quality,
    quality_across_models, rank, undominated,
)
from .recommend import Choice, choose, recommend, unmet_targets
from .shortfall import closest_misses, describe_miss, miss_entry, shortfall

__all__ = [
    "NOT_COMPILED", "REQUIREMENT_VALUES", "TARGET_FREE", "Choice", "check_row", "choose", "closest_misses", "comparable",
    "describe_miss", "dominates", "excess_layers", "flag_over_reference", "judge_leaves",
    "judge_uncompiled", "leaf_rank", "least_optimized",
    "level_key", "meets_everywhere", "miss_entry", "objectives", "overall", "pair_rank", "pareto_front",
    "pareto_of_target", "pick", "quality", "quality_across_models", "rank", "recommend", "requirements_from_options",
    "shortfall", "shortfalls", "size_budget_misses", "sweep_unmet", "undominated", "unmet_targets",
]
