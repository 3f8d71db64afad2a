"""Walk the deployment tree level by level and stop at the first level where a leaf meets the requirements.

Arm's collaborative-optimization process: try the least-optimized leaves first (``ptq``, then ``qat``, then
pruned and clustered, then PQAT, CQAT and sparsity-preserving clustering, then PCQAT) and go deeper only
while nothing meets the accuracy, size and latency requirements. Each level trains and converts its leaves
(nodes already trained are reused from the run folder), compiles the new leaves for every target asked
for, and judges every leaf walked so far with the report's requirement checks. The walk stops at the first
level with a leaf that meets every requirement on every target; nodes of deeper levels are not trained.
The walk is a strategy over the driver (:func:`edgedeploy.pipeline.driver.run`): each level is the driver's run of
one tree (task graph, run, gate) on the plan's inputs, loaded once.

The run manifest gets a ``walk`` record (``info.walk``): each level visited, its leaves and the nodes it
trained, each leaf's verdict per requirement and target, the recommended leaf and why the walk stopped.
When no level meets the requirements the walk says which requirement nothing met and by how much, and
raises :class:`~edgedeploy.errors.BudgetExceededError` (exit 8).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Sequence

from edgedeploy.errors import BudgetExceededError, UsageError
from edgedeploy.config.recipe import Recipe
from edgedeploy.core.manifest import now_iso
from edgedeploy.report import Requirements, build_report, leaf_level
from edgedeploy.report.judge import judge_leaves, meets_everywhere, pick, shortfalls
from edgedeploy.core.stage import RunContext
from edgedeploy.pipeline.run_plan import levels_of

if TYPE_CHECKING:
    from edgedeploy.pipeline.run_plan import Plan
    from edgedeploy.pipeline.tree_run import OptimizeOutcome

log = logging.getLogger("edgedeploy")

WALK_SCHEMA_VERSION = 1


@dataclass
class WalkOutcome:
    run_dir: Path
    record: dict[str, Any]
    compiled: list = field(default_factory=list)  # the compile StageRecords of the leaves walked

    @property
    def recommended(self) -> str | None:
        return self.record.get("recommended")


def walk(plan: Plan, run_level: Callable[[Recipe], OptimizeOutcome]) -> WalkOutcome:
    """Train, convert, compile and judge ``plan``'s leaves level by level, and stop at the first level that meets
    its requirements. ``run_level``: the driver's run of one tree (its task graph, run and gate) on the plan's
    inputs, loaded once (:func:`edgedeploy.pipeline.driver.run`), for a recipe of the leaves walked so far."""
    out, targets, requirements = Path(plan.out), plan.targets, plan.requirements
    if not targets:
        raise UsageError("a walk compiles each leaf for its targets, and none was given",
                         "name targets in the project file or with --target")
    plan.options.check()
    target_names = [t.name for t in targets]
    recipe = thin_toward(plan.recipe, requirements, target_names)
    state = _WalkState(levels_of(recipe.leaves), now_iso(), {
        "schema_version": WALK_SCHEMA_VERSION,
        "requirements": requirements.to_dict(),
        "targets": target_names,
        "leaves_asked": list(recipe.leaves),
        "levels": [],
    })
    for level, new in state.levels.items():
        if _walk_level(state, level, new, out, recipe, target_names, requirements, run_level):
            break
    _conclude(state, requirements, target_names)
    ctx = RunContext.open(out)
    ctx.manifest.info["walk"] = state.record
    ctx.manifest.save()
    if state.stopped_at is None:
        raise BudgetExceededError(f"walk through {', '.join(state.walked)}: {state.record['message']}",
                                  "relax the requirements, or add deeper leaves to the recipe "
                                  f"(the walk is recorded in {ctx.manifest.path})")
    return WalkOutcome(ctx.run_dir, state.record, state.compiled)


@dataclass
class _WalkState:
    """How far a walk got: the levels, what it walked, trained and compiled, and its record."""

    levels: dict[int, list[str]]
    started: str  # a node recorded before this was reused from the run folder, not trained
    record: dict[str, Any]
    walked: list[str] = field(default_factory=list)
    trained: set[str] = field(default_factory=set)
    compiled: list = field(default_factory=list)
    verdicts: dict[str, Any] = field(default_factory=dict)
    stopped_at: int | None = None
    t_start: float = field(default_factory=time.perf_counter)


def _walk_level(state: _WalkState, level: int, new: list[str], out: Path, recipe: Recipe, target_names: list[str],
                requirements: Requirements, run_level: Callable[[Recipe], OptimizeOutcome]) -> bool:
    """One level: train, convert and compile its leaves as one task graph (each leaf compiled as soon as it
    exists), judge every leaf walked so far, and record the level; whether a leaf meets everywhere."""
    t0 = time.perf_counter()
    state.walked += new
    log.info("walk: level %d (%s)", level, ", ".join(new))
    result = run_level(replace(recipe, leaves=tuple(state.walked)))
    state.compiled += [rec for rec in result.compiled.records if rec.variant in new]
    doc = build_report(out, requirements, compression=False)
    state.verdicts = verdicts = judge_leaves(doc, state.walked, target_names)
    meeting = [leaf for leaf in state.walked if meets_everywhere(verdicts[leaf])]
    nodes = [n for n in result.nodes if n not in state.trained]
    state.trained.update(result.nodes)
    reused = [n for n in nodes if (result.nodes[n].started or "") < state.started]
    state.record["levels"].append({
        "level": level, "leaves": list(new), "nodes_trained": [n for n in nodes if n not in reused],
        "nodes_reused": reused, "verdicts": {leaf: verdicts[leaf] for leaf in new}, "meeting": meeting,
        "seconds": round(time.perf_counter() - t0, 2)})
    if not meeting:
        return False
    state.stopped_at = level
    best, passed = pick(doc, meeting, target_names)
    state.record.update(stopped="met", recommended=best, recommended_level=leaf_level(best), passed_over=passed)
    costs = [v["over_reference"] for v in verdicts[best].values() if v.get("over_reference")]
    if costs:  # (only where ptq misses a requirement: a leaf costing more than it never beats it)
        state.record["recommended_costs_more"] = costs
    return True


def _conclude(state: _WalkState, requirements: Requirements, target_names: Sequence[str]) -> None:
    """The end of the walk's record: what was not walked, the nodes, the time, and why it stopped."""
    record, stopped_at = state.record, state.stopped_at
    skipped = [leaf for lv, leaves in state.levels.items() if stopped_at is not None and lv > stopped_at
               for leaf in leaves]
    record["not_walked"] = skipped
    record["nodes"] = sorted(state.trained)
    record["seconds"] = round(time.perf_counter() - state.t_start, 2)
    if stopped_at is None:
        unmet = shortfalls(state.verdicts)
        record.update(stopped="exhausted", recommended=None, unmet=unmet)
        if unmet:
            record["message"] = "no leaf meets " + "; ".join(u["text"] for u in unmet)
        else:
            record["message"] = ("each requirement is met by some leaf, but no leaf meets all of them on every target "
                                 f"({', '.join(target_names)})")
    else:
        what = ", ".join(sorted(requirements.given())) or "no requirements set"
        record["message"] = (f"level {stopped_at} is the first where a leaf meets every requirement ({what}) on "
                             f"{', '.join(target_names)}; recommend {record['recommended']}"
                             + "".join(f"; but {text}" for text in record.get("recommended_costs_more", []))
                             + (f"; not trained: {', '.join(skipped)}" if skipped else ""))


def thin_toward(recipe: Recipe, requirements: Requirements, target_names: Sequence[str]) -> Recipe:
    """The recipe whose thinned leaves aim at the walk's cycle or latency requirement on all its targets (what
    the recipe sets itself wins)."""
    from edgedeploy.config.tree import THINNED_NODES, nodes_for

    if not set(nodes_for(list(recipe.leaves))) & THINNED_NODES:
        return recipe
    changes: dict[str, Any] = {}
    if recipe.thin_targets == Recipe.thin_targets:
        changes["thin_targets"] = tuple(target_names)
    if requirements.max_npu_cycles is not None and not recipe.thin_max_npu_cycles:
        changes["thin_max_npu_cycles"] = int(requirements.max_npu_cycles)
    if requirements.max_latency_ms is not None and not recipe.thin_max_latency_ms:
        changes["thin_max_latency_ms"] = float(requirements.max_latency_ms)
    if {"thin_max_npu_cycles", "thin_max_latency_ms"} & set(changes) and recipe.thin_speedup == Recipe.thin_speedup:
        changes["thin_speedup"] = 1.0  # the requirement is the budget, not a default ratio
    return replace(recipe, **changes) if changes else recipe
