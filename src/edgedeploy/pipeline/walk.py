"""Walk the deployment tree level by level and stop at the first level where a leaf meets the requirements.

Arm's collaborative-optimization process: try the least-optimized leaves first (``ptq``, then ``qat``, then
pruned and clustered, then PQAT, CQAT and sparsity-preserving clustering, then PCQAT) and go deeper only
while nothing meets the accuracy, size and latency requirements. Each level trains and converts its leaves
(nodes already trained are reused from the run folder), compiles the new leaves for every target asked
for, and judges every leaf walked so far with the report's requirement checks. The walk stops at the first
level with a leaf that meets every requirement on every target; nodes of deeper levels are not trained.

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
from typing import Any, Mapping, Sequence

from edgedeploy.pipeline.compile import CompileOptions
from edgedeploy.errors import BudgetExceededError, UsageError
from edgedeploy.config.recipe import Recipe
from edgedeploy.core.manifest import now_iso
from edgedeploy.report import Requirements, build_report, leaf_level
from edgedeploy.report.judge import fmt_limit
from edgedeploy.report.recommend import dominates, objectives
from edgedeploy.core.stage import RunContext
from edgedeploy.config.targets import Target

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


def levels_of(leaves: Sequence[str]) -> dict[int, list[str]]:
    """The leaves grouped by tree level, least optimized first (the recipe's order within a level)."""
    out: dict[int, list[str]] = {}
    for leaf in leaves:
        level = leaf_level(leaf)
        if level is None:
            raise UsageError(f"leaf '{leaf}' has no level in the deployment tree", "walk only the tree's leaves")
        out.setdefault(level, []).append(leaf)
    return dict(sorted(out.items()))


def _check_cell(check: Mapping[str, Any]) -> dict[str, Any]:
    keep = ("met", "value", "limit", "unit", "excess", "excess_pct", "why")
    return {k: check[k] for k in keep if k in check and check[k] is not None or k == "met"}


def judge(doc: Mapping[str, Any], leaves: Sequence[str], targets: Sequence[str]) -> dict[str, dict[str, Any]]:
    """Each leaf's verdict per target: meets (True/False; None without requirements) and each requirement."""
    rows = {(r["leaf"], r["target"]): r for r in doc["rows"]}
    out: dict[str, dict[str, Any]] = {}
    for leaf in leaves:
        per_target = {}
        for t in targets:
            row = rows.get((leaf, t))
            if row is None:
                per_target[t] = {"meets": False, "why": f"{leaf} was not compiled for {t}", "requirements": {}}
                continue
            checks = row.get("requirements") or {}
            per_target[t] = {"meets": row.get("meets_requirements"),
                             "requirements": {n: _check_cell(c) for n, c in checks.items()}}
        out[leaf] = per_target
    return out


def meets_everywhere(verdict: Mapping[str, Any]) -> bool:
    return all(v["meets"] in (True, None) for v in verdict.values())


def pick(doc: Mapping[str, Any], meeting: Sequence[str], targets: Sequence[str]) -> tuple[str, dict[str, str]]:
    """The least-optimized meeting leaf that no other meeting leaf beats on accuracy, flash and cycles on every
    target at once; and the leaves passed over, each with a leaf that beats it."""
    rows = {(r["leaf"], r["target"]): r for r in doc["rows"]}
    points = {leaf: tuple(x for t in targets for x in objectives(rows[(leaf, t)])) for leaf in meeting}
    order = {leaf: (leaf_level(leaf), points[leaf][0], i) for i, leaf in enumerate(meeting)}
    beaten = {}
    for leaf in meeting:
        better = [o for o in meeting if o != leaf and dominates(points[o], points[leaf])]
        if better:
            beaten[leaf] = min(better, key=order.__getitem__)
    front = [leaf for leaf in meeting if leaf not in beaten]
    best = min(front, key=order.__getitem__)
    return best, {leaf: by for leaf, by in beaten.items() if order[leaf] < order[best]}


def shortfalls(verdicts: Mapping[str, Mapping[str, Any]]) -> list[dict[str, Any]]:
    """For each requirement no walked leaf meets on every target: the leaf that comes closest, and by how much
    it misses (its worst target)."""
    names = sorted({n for v in verdicts.values() for t in v.values() for n in t["requirements"]})
    out = []
    for name in names:
        best = None
        for leaf, per_target in verdicts.items():
            checks = [(t, v["requirements"].get(name)) for t, v in per_target.items()]
            if any(c is None for _, c in checks):
                continue
            if all(c["met"] is True for _, c in checks):
                best = None
                break
            # how far this leaf misses on its worst target, relative to the limit (unjudged: infinitely far)
            worst_t, worst = max(checks, key=lambda tc: _relative(tc[1]))
            if best is None or _relative(worst) < _relative(best[2]):
                best = (leaf, worst_t, worst)
        else:
            if best is not None:
                leaf, t, c = best
                entry = {"requirement": name, "closest_leaf": leaf, "target": t, "limit": c.get("limit"),
                         "value": c.get("value"), "excess": c.get("excess"), "excess_pct": c.get("excess_pct"),
                         "unit": c.get("unit", "")}
                if c["met"] is None or c.get("excess") is None:
                    entry["text"] = f"{name}: {leaf} on {t}: {c.get('why', 'cannot be judged')}"
                else:
                    unit = c.get("unit", "")
                    entry["text"] = (f"{name} {fmt_limit(c['limit'], unit)}: closest is {leaf} on {t} with "
                                     f"{fmt_limit(c['value'], unit)}, over by {fmt_limit(c['excess'], unit)}"
                                     + (f" ({c['excess_pct']:.1f}%)" if c.get("excess_pct") is not None else ""))
                out.append(entry)
    return out


def _relative(check: Mapping[str, Any]) -> float:
    if check.get("met") is True:
        return 0.0
    if check.get("met") is None or check.get("excess") is None:
        return float("inf")
    limit = check.get("limit")
    return check["excess"] / limit if limit else check["excess"]


def walk(
    model_path: Path,
    data_path: Path,
    out: Path,
    recipe: Recipe,
    targets: Sequence[Target],
    requirements: Requirements,
    options: CompileOptions | None = None,
    *,
    trust_lambda: bool = False,
    runner=None,
) -> WalkOutcome:
    """Train, convert, compile and judge the recipe's leaves level by level; stop at the first level that meets.
    ``runner`` (:func:`edgedeploy.pipeline.tree_run.make_runner`): where the stages run, shared with the caller (who closes
    it); by default one for this walk."""
    from edgedeploy.pipeline.tree_run import optimize
    from edgedeploy.pipeline.tree_run import make_runner

    if not targets:
        raise UsageError("a walk compiles each leaf for its targets, and none was given",
                         "name targets in the project file or with --target")
    options = options or CompileOptions()
    options.check()
    target_names = [t.name for t in targets]
    recipe = thin_toward(recipe, requirements, target_names)
    levels = levels_of(recipe.leaves)
    t_start, started = time.perf_counter(), now_iso()
    walked: list[str] = []
    trained: set[str] = set()
    visited: list[dict[str, Any]] = []
    compiled: list = []
    record: dict[str, Any] = {
        "schema_version": WALK_SCHEMA_VERSION,
        "requirements": requirements.to_dict(),
        "targets": target_names,
        "leaves_asked": list(recipe.leaves),
        "levels": visited,
    }
    doc: dict[str, Any] = {}
    verdicts: dict[str, Any] = {}
    stopped_at = None
    own_runner = runner is None
    if runner is None:  # one per walk (or the caller's): Ray starts once
        runner = make_runner(options.executor, options.ray_address, recipe.jobs)
    try:
        for level, new in levels.items():
            t0 = time.perf_counter()
            walked += new
            log.info("walk: level %d (%s)", level, ", ".join(new))
            # train, convert and compile as one task graph, each leaf compiled as soon as it exists
            result = optimize(model_path, data_path, out, replace(recipe, leaves=tuple(walked)), trust_lambda=trust_lambda,
                              executor=options.executor, ray_address=options.ray_address, targets=targets,
                              compile_options=options, runner=runner)
            compiled += [rec for rec in result.compiled.records if rec.variant in new]
            doc = build_report(out, requirements, compression=False)
            verdicts = judge(doc, walked, target_names)
            meeting = [leaf for leaf in walked if meets_everywhere(verdicts[leaf])]
            nodes = [n for n in result.nodes if n not in trained]
            trained.update(result.nodes)
            # a node recorded before this walk started was reused from the run folder, not trained again
            reused = [n for n in nodes if (result.nodes[n].started or "") < started]
            visited.append({"level": level, "leaves": list(new),
                            "nodes_trained": [n for n in nodes if n not in reused], "nodes_reused": reused,
                            "verdicts": {leaf: verdicts[leaf] for leaf in new}, "meeting": meeting,
                            "seconds": round(time.perf_counter() - t0, 2)})
            if meeting:
                stopped_at = level
                best, passed = pick(doc, meeting, target_names)
                record.update(stopped="met", recommended=best, recommended_level=leaf_level(best), passed_over=passed)
                break
    finally:
        if own_runner:
            runner.close()
    skipped = [leaf for lv, leaves in levels.items() if stopped_at is not None and lv > stopped_at for leaf in leaves]
    record["not_walked"] = skipped
    record["nodes"] = sorted(trained)
    record["seconds"] = round(time.perf_counter() - t_start, 2)
    if stopped_at is None:
        unmet = shortfalls(verdicts)
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
                             + (f"; not trained: {', '.join(skipped)}" if skipped else ""))
    ctx = RunContext.open(out)
    ctx.manifest.info["walk"] = record
    ctx.manifest.save()
    if stopped_at is None:
        raise BudgetExceededError(f"walk through {', '.join(walked)}: {record['message']}",
                                  "relax the requirements, or add deeper leaves to the recipe "
                                  f"(the walk is recorded in {ctx.manifest.path})")
    return WalkOutcome(ctx.run_dir, record, compiled)


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


def requirements_from_options(max_accuracy_drop: float | None = None, max_flash: str | None = None,
                              max_sram: str | None = None, max_latency_ms: float | None = None,
                              max_npu_cycles: int | None = None, max_metric_drop: float | None = None) -> Requirements:
    """Requirements given as command-line options (sizes as text, e.g. 32KiB), checked by
    :func:`edgedeploy.config.requirements.check_requirements` like those of a project file."""
    from edgedeploy.config.requirements import check_requirements

    given = check_requirements({
        "max_accuracy_drop": max_accuracy_drop, "max_metric_drop": max_metric_drop, "max_latency_ms": max_latency_ms,
        "max_npu_cycles": max_npu_cycles, "max_flash": max_flash, "max_sram": max_sram,
    }, "--{flag}", UsageError)
    return Requirements(**given, sources=("command line",) if given else ())


def walk_project(
    path: Path,
    extra_targets: Sequence[str] = (),
    out: Path | None = None,
    options: CompileOptions | None = None,
    requirements: Requirements | None = None,
) -> WalkOutcome:
    """``edgedeploy compile PROJECT.toml --walk``: the project's model, data, recipe, targets and requirements
    (``requirements`` given here win over the project file's)."""
    from edgedeploy.pipeline.compile import resolve_targets
    from edgedeploy.pipeline.project import load_project, merged_options
    from edgedeploy.report import requirements_from_project

    project = load_project(path)
    if project.is_sweep:
        raise UsageError(f"{path} lists [[models]]: it is a sweep, one walk per model",
                         "run it with `edgedeploy compile PROJECT.toml --walk` (edgedeploy.pipeline.sweep.run_sweep)")
    req = requirements_from_project(Path(path))
    if requirements is not None:
        req = requirements.over(req)
    targets = resolve_targets([*project.targets, *extra_targets])
    return walk(project.model, project.data, out or project.out, project.recipe, targets, req,
                merged_options(project, options), trust_lambda=project.trust_lambda)
