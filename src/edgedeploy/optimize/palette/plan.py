"""Per-layer palette plans and the search over them (pure): greedy and size-budgeted plans, and the
estimate of accuracy drop from the rise of the loss."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

import numpy as np



@dataclass(frozen=True)
class LayerSetting:
    """What the palette node does to one layer: ``clusters`` None keeps the layer as its parent left it."""

    clusters: int | None
    sparsity: float = 0.0

    @property
    def key(self) -> str:
        return "keep" if self.clusters is None else f"k{self.clusters}_s{self.sparsity:g}"

    def to_dict(self) -> dict[str, Any]:
        return {"clusters": self.clusters, "sparsity": self.sparsity}


def candidate_settings(clusters: Sequence[int], sparsities: Sequence[float]) -> list[LayerSetting]:
    return [LayerSetting(int(k), float(s)) for k in clusters for s in sparsities]


def start_options(options: Mapping[str, Sequence[Mapping[str, Any]]]) -> dict[str, Mapping[str, Any]]:
    """Per layer, the option a walk starts from: the most bytes (the sweep's largest palette), then least drop."""
    return {layer: max(opts, key=lambda o: (o["bytes"], -max(o["drop"], 0.0))) for layer, opts in options.items() if opts}


def memoized(joint_drop):
    """``joint_drop`` judging each plan (layer -> setting) once, however often it is asked."""
    memo: dict[str, Any] = {}

    def judged(plan: Mapping[str, Mapping[str, Any]]):
        key = json.dumps(sorted((k, sorted(v.items())) for k, v in plan.items()))
        if key not in memo:
            memo[key] = joint_drop(plan)
        return memo[key]

    return judged


def greedy_plan(options: Mapping[str, Sequence[Mapping[str, Any]]], joint_drop, budget: float
                ) -> tuple[dict[str, dict[str, Any]], list[dict[str, Any]]]:
    """Per layer, a setting such that the *joint* accuracy drop stays within ``budget``, fewest bytes first.

    ``options[layer]`` lists {"setting": LayerSetting-dict, "bytes": int, "drop": float (points, this layer
    alone)}; the option with the most bytes is where the layer starts (the sweep's largest palette). Drops of
    single layers do not add up (layers harmless one by one can lose points together), so every
    step is checked on the whole model: moves are tried in order (no measured loss first, then most bytes
    saved per point lost) and kept when ``joint_drop(plan)`` is within ``budget``. ``joint_drop`` returns the
    drop, or a mapping with the drop under ``"drop"`` and more facts to record with the step. Returns (plan,
    steps tried).
    """
    start = start_options(options)
    current = dict(start)
    moves = []
    for layer, opts in options.items():
        base = start.get(layer)
        for o in opts:
            if base is None or o["bytes"] >= base["bytes"] or o["drop"] > budget:
                continue
            saved = base["bytes"] - o["bytes"]
            moves.append((max(o["drop"], 0.0) > 0, -saved / max(o["drop"], 1e-3), -saved, layer, o))
    moves.sort(key=lambda m: m[:3])
    steps = []
    for _, _, _, layer, o in moves:
        if o["bytes"] >= current[layer]["bytes"]:
            continue
        trial = {**current, layer: o}
        judged = joint_drop({k: v["setting"] for k, v in trial.items()})
        extra = dict(judged) if isinstance(judged, Mapping) else {"drop": judged}
        drop = float(extra.pop("drop"))
        ok = drop <= budget
        steps.append({"layer": layer, "setting": o["setting"], "joint_drop": round(drop, 3), "kept": ok,
                      "encoded_bytes": int(sum(v["bytes"] for v in trial.values())), **extra})
        if ok:
            current = trial
    return {k: v["setting"] for k, v in current.items()}, steps


def plan_bytes(options: Mapping[str, Sequence[Mapping[str, Any]]], plan: Mapping[str, Mapping[str, Any]]) -> int:
    """Encoded bytes of ``plan`` (layer -> setting) as the sweep measured them for each layer alone."""
    total = 0
    for layer, setting in plan.items():
        total += next(int(o["bytes"]) for o in options[layer] if o["setting"] == setting)
    return total


def sized_plan(options: Mapping[str, Sequence[Mapping[str, Any]]], joint_drop, max_bytes: int, low: float,
               resolution: float = 0.02, rounds: int = 16) -> dict[str, Any]:
    """The plan of least joint drop whose encoded bytes fit ``max_bytes``: :func:`greedy_plan` at bisected budgets.

    A larger budget lets :func:`greedy_plan` take more moves, so its plan gets smaller as the budget grows
    (not strictly: every budget orders and filters the moves anew). The budget is bisected between ``low``
    (the drop every plan starts from) and the drop of the smallest plan (hundreds of points when every layer
    is at its smallest setting), on a log scale above ``low``, to ``resolution`` points or ``rounds`` walks;
    the fitting plan of least drop over all walks wins. Joint drops are memoised, so walks
    that share their first moves judge them once. Returns {"plan", "bytes", "drop", "fits", "walks" (budget,
    bytes, drop of each), "steps" (the chosen walk's)}; when even the smallest plan does not fit, that plan
    with ``fits`` False.
    """
    judged = memoized(joint_drop)

    def drop_of(plan: Mapping[str, Mapping[str, Any]]) -> float:
        value = judged(plan)
        return float(value["drop"] if isinstance(value, Mapping) else value)

    walks: list[dict[str, Any]] = []

    def walk(budget: float) -> dict[str, Any]:
        plan, steps = greedy_plan(options, judged, budget)
        result = {"budget": round(budget, 3), "bytes": plan_bytes(options, plan), "drop": round(drop_of(plan), 3),
                  "plan": plan, "steps": steps}
        walks.append(result)
        return result

    smallest = walk(float("inf"))
    if smallest["bytes"] > max_bytes:
        best = smallest
    else:
        lo, hi = low, max(smallest["drop"], low)
        for _ in range(rounds):
            if hi - lo <= resolution:
                break
            mid = low - resolution + math.sqrt((lo - low + resolution) * (hi - low + resolution))
            if walk(mid)["bytes"] <= max_bytes:
                hi = mid
            else:
                lo = mid
        best = min((w for w in walks if w["bytes"] <= max_bytes), key=lambda w: (w["drop"], w["bytes"]))
    return {"plan": best["plan"], "bytes": best["bytes"], "drop": best["drop"], "fits": best["bytes"] <= max_bytes,
            "walks": [{k: w[k] for k in ("budget", "bytes", "drop")} for w in walks], "steps": best["steps"]}


LINEAR_REGIME = 5.0  # points: single-layer items beyond this measured drop do not fit the loss-to-accuracy slope
MIN_SLOPE_ITEMS = 5


def drop_per_loss(measured_drops: Sequence[float], loss_rises: Sequence[float]) -> float | None:
    """Accuracy points lost per nat of cross-entropy gained, fitted over a sweep's single-layer items.

    A least-squares line through the origin over the items whose loss rose and whose measured drop is at most
    :data:`LINEAR_REGIME` points (accuracy saturates at chance while the loss keeps growing). None when fewer
    than :data:`MIN_SLOPE_ITEMS` items qualify or the fit is not positive.

    Why: an accuracy drop measured on samples the model was fine-tuned on is coarse (one sample is 1/n) and,
    far from the decision boundary, understates what unseen samples lose once many small changes add up,
    while the loss rise is smooth and carries over to unseen samples. Measured on the DS-CNN of this project:
    the slope fitted on fine-tune samples was 27-32 points per nat, the same fit on the evaluation split 32-35.
    """
    d = np.asarray(measured_drops, dtype=np.float64)
    r = np.asarray(loss_rises, dtype=np.float64)
    use = (r > 0) & (d <= LINEAR_REGIME) & np.isfinite(d) & np.isfinite(r)
    if int(use.sum()) < MIN_SLOPE_ITEMS:
        return None
    slope = float(d[use] @ r[use] / (r[use] @ r[use]))
    return slope if slope > 0 else None


def holdout_split(n: int, fraction: float, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Sorted indices (train, hold-out) of a fine-tune split of ``n`` samples; a seeded random ``fraction`` is held out."""
    k = max(1, round(n * fraction)) if fraction > 0 else 0
    hold = np.sort(np.random.default_rng(seed).permutation(n)[:k])
    return np.setdiff1d(np.arange(n), hold), hold
