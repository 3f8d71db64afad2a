"""The ``thin`` technique: a dense model with fewer output channels, its widths chosen by the NPU's cycles.

1. The channel groups of the parent (:func:`edgedeploy.keras.channel_surgery.channel_groups`); layers that cannot be
   thinned are named with the reason (``details["thinning"]["not_thinned"]``).
2. Channel scores and each group's sensitivity on fine-tune samples (:mod:`.thin_recover`).
3. Each layer's cycle staircase from Vela on the recipe's ``thin_targets`` and the widths that meet the
   budget (:mod:`.thin_widths`): ``thin_speedup`` times the full model's NPU cycles, or ``thin_max_npu_cycles``,
   or ``thin_max_latency_ms``, whichever is least, on every target; a shortlist of choices near the budget
   is compiled, and the least expected loss that Vela puts within it is taken. With ``sparsity_pattern =
   "2:4"`` every candidate is compiled with the prune stage's 2:4 masks: the budget is held on what the
   ``thinned_pruned`` leaf costs (Ethos-U85 skips the zeros), still as a fraction of the dense full model's cycles.
4. With ``thin_trials``, the search's choice and its alternatives (:func:`.thin_widths.alternatives`, each checked
   by Vela) are each thinned, refitted and fine-tuned for ``thin_trial_epochs``; the one of least hold-out loss
   is kept where it beats the search's by more than the hold-out can tell (``details["thinning"]["trials"]``).
   The expected loss adds one-shot losses, and fine-tuning can recover a choice it ranks lower better than the
   one it ranks first.
5. The thinned model, its readers refitted by least squares, fine-tuned with distillation (the ``thin``
   stage's epochs, under ``min_steps``; with ``thin_augment = "hflip"`` on mirrored images as well, here and in
   the stages below).
"""

from __future__ import annotations

import logging
from functools import partial
from typing import Any

import numpy as np

from edgedeploy.errors import BudgetExceededError, UsageError
from edgedeploy.core.steptime import timed
from edgedeploy.keras.channel_surgery import channel_groups, kernel_channels, thin_model
from edgedeploy.optimize.finetune.fit import fine_tune, hold_out_losses, training_set
from .thin_widths import (Staircase, alternatives, candidate_widths, choose, colour_groups, learn,
                       orthogonal_rows, shortlist)
from .thin_recover import channel_scores, refit, sensitivity, top_channels
from .thin_vela import TRACE, compile_models, layer_of
from edgedeploy.optimize.leaf import tfenv_seed
from .selection import mirrored, optimizable
from .two_of_four import pruned_copy

log = logging.getLogger("edgedeploy")

GRID_CALIBRATION = 16  # samples that calibrate each candidate of the grid (cycles do not depend on ranges)
CHECKS = 4  # rounds of compiled shortlists, each tightening the budget of a target the prediction missed


def _edges(graph) -> list[tuple[str, str]]:
    names = {g.gid: n for n, g in graph.thinnable().items()}
    edges = []
    for layer, kind in graph.kinds.items():
        if kind in ("Conv2D", "Dense") and layer in graph.inputs and graph.layouts[layer][0] == "ch":
            out = names.get(graph.root(graph.layouts[layer][1][0][0]))
            for gid, _ in graph.inputs[layer][0][-1]:
                src = names.get(graph.root(gid))
                if src and out:
                    edges.append((src, out))
    return edges


def _op_groups(graph, name: str | None) -> tuple[str | None, str | None]:
    """(group read, group written) of the Keras layer behind a Vela operator row."""
    if name is None or name not in graph.layouts:
        return None, None
    names = {g.gid: n for n, g in graph.thinnable().items()}

    def first(layout):
        return next((names[graph.root(gid)] for gid, _ in layout[-1] if graph.root(gid) in names), None)

    out = first(graph.layouts[name])
    if graph.kinds[name] in ("Conv2D", "Dense") and name in graph.inputs:
        return first(graph.inputs[name][0]), out
    return out, out


@timed("candidate_int8")
def _candidate(model, graph, scores, widths, values, calibration, recipe, dense: bool = False) -> bytes:
    """The int8 model at the widths ``values``; under 2:4 (unless ``dense``) with the prune stage's 2:4 masks."""
    from edgedeploy.tflite.convert import convert_int8

    keep = {g: top_channels(scores[g], widths[g][v]) for g, v in values.items() if widths[g][v] < widths[g][0]}
    thinned = thin_model(model, graph, keep) if keep else model
    if recipe.sparsity_pattern == "2:4" and not dense:
        thinned = pruned_copy(thinned, lambda layer: optimizable(layer, recipe))
    return convert_int8(thinned, calibration, float_io=recipe.float_io, source="thinned candidate")


def _budgets(recipe, stair: Staircase, totals: dict[str, float]) -> dict[str, dict[str, Any]]:
    """The NPU cycle budget on each thin target and the key it comes from. A latency at or below what the target
    spends on the model beyond its NPU cycles (the fixed time no width removes) is refused: no width can meet it."""
    from edgedeploy.config.targets import get_target

    out = {}
    for t in recipe.thin_targets:
        full = stair.full[t]
        options = {"thin_speedup": recipe.thin_speedup * full}
        if recipe.thin_max_npu_cycles:
            options["thin_max_npu_cycles"] = float(recipe.thin_max_npu_cycles)
        if recipe.thin_max_latency_ms:  # total cycles within the latency, less what is not NPU work
            hz = get_target(t).npu_hz
            fixed = totals[t] - full
            options["thin_max_latency_ms"] = recipe.thin_max_latency_ms * 1e-3 * hz - fixed
            if options["thin_max_latency_ms"] <= 0:
                fixed_ms = fixed / hz * 1e3
                raise BudgetExceededError(
                    f"thinned: thin_max_latency_ms = {recipe.thin_max_latency_ms:g} ms is within the time {t} "
                    f"spends on this model beyond its NPU cycles ({fixed_ms:.4g} ms: {fixed:.0f} cycles at "
                    f"{hz / 1e6:g} MHz), which no width removes",
                    f"ask for more than {fixed_ms:.4g} ms (the latency the walk aims at is --max-latency-ms), or "
                    "leave thin_max_latency_ms at 0")
        key = min(options, key=lambda k: options[k])
        out[t] = {"npu_cycles": options[key], "from": key, "ptq_npu_cycles": full}
    return out


def _check(stair: Staircase, widths, drops, values: dict[str, int], cycles: dict[str, float],
           budgets: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """One compiled choice of the shortlist: its widths, expected loss, predicted and Vela's NPU cycles."""
    return {"widths": {g: widths[g][values[g]] for g in stair.groups},
            "expected_loss": round(sum(drops[g][v] for g, v in values.items()), 5),
            "predicted": {t: round(stair.predict(t, values)) for t in cycles}, "npu_cycles": cycles,
            "met": all(c <= budgets[t]["npu_cycles"] for t, c in cycles.items())}


def _width_key(widths, values: dict[str, int]) -> tuple[int, ...]:
    """The widths a choice of value indices gives, group by group: choices of one key are one model (two candidate
    values of a narrow group can be the same width)."""
    return tuple(widths[g][values[g]] for g in widths)


def _checked(options: list[dict[str, int]], checks: list[dict[str, Any]], widths, compile_choices, row
             ) -> tuple[list[dict[str, Any]], bool]:
    """The row of ``checks`` for each choice of ``options``, compiling (once each, added to ``checks``) the choices
    not compiled yet; and whether any was."""
    known = {tuple(c["widths"][g] for g in widths) for c in checks}
    new = []
    for v in options:
        key = _width_key(widths, v)
        if key not in known:
            known.add(key)
            new.append(v)
    got = compile_choices(new) if new else {}
    checks += [row(v, {t: runs[i]["npu_cycles"] for t, runs in got.items()}) for i, v in enumerate(new)]
    by_key = {tuple(c["widths"][g] for g in widths): c for c in checks}
    return [by_key[_width_key(widths, v)] for v in options], bool(new)


def _grid_or_new(choices, keys, grid_keys, grid, compile_new) -> dict[str, list[dict[str, Any]]]:
    """Per target, per choice (of width tuple ``keys``), the grid's compile where the choice is one of its rows
    (``grid_keys``, ``grid``: the same model, converted and compiled alike), else the compile of those that are not,
    by ``compile_new``: no model is compiled twice."""
    new = [v for v, k in zip(choices, keys) if k not in grid_keys]
    got = compile_new(new) if new else {}
    at = {k: i for i, k in enumerate(k for k in keys if k not in grid_keys)}
    return {t: [got[t][at[k]] if k in at else grid[t][grid_keys.index(k)] for k in keys] for t in grid}


@timed("search")
def npu_widths(model, graph, scores, drops, widths, recipe, data, out
               ) -> tuple[dict[str, int], dict[str, Any], list[dict[str, int]]]:
    """The value index per group that meets the budget (see the module), the record of the search, and the
    choices to try by fine-tuning (``thin_trials``): that one first, then :func:`.thin_widths.alternatives` that
    Vela puts within the budget."""
    groups = list(widths)
    colours = colour_groups(groups, _edges(graph))
    fixed = {g: 0 for g, c in colours.items() if c > recipe.thin_candidates}  # (beyond the array's columns: full)
    design = orthogonal_rows(min(recipe.thin_candidates + 1, max(colours.values()) + 1), recipe.thin_candidates)
    assignments = [{g: row[colours[g]] if g not in fixed else 0 for g in groups} for row in design]
    calibration, _ = data.calibration(GRID_CALIBRATION, recipe.seed)
    unique = list(dict.fromkeys(_width_key(widths, a) for a in assignments))
    tflites = [_candidate(model, graph, scores, widths, {g: widths[g].index(w) for g, w in zip(groups, u)},
                          calibration, recipe) for u in unique]  # (repeated widths converted once)
    compiled = compile_models(tflites, recipe.thin_targets, out / TRACE, jobs=1)
    measured = {t: [runs[unique.index(_width_key(widths, a))] for a in assignments]
                for t, runs in compiled.items()}
    first = measured[recipe.thin_targets[0]][0]
    kinds = dict(graph.kinds)
    ops = [_op_groups(graph, layer_of(key[0], kinds)) for key, _ in first["keyed"]]
    stair = Staircase(groups, widths, colours, ops)
    keys = [key for key, _ in first["keyed"]]
    per_target = {t: [{"npu_cycles": r["npu_cycles"], "rows": [dict(r["keyed"]).get(k, 0.0) for k in keys]}
                      for r in runs] for t, runs in measured.items()}
    learn(assignments, per_target, stair)
    totals = {t: float(runs[0]["total_cycles"]) for t, runs in measured.items()}
    if recipe.sparsity_pattern == "2:4":  # the budget is a fraction of the dense full model's (ptq's) cycles
        dense = compile_models([_candidate(model, graph, scores, widths, {}, calibration, recipe, dense=True)],
                               recipe.thin_targets, out / TRACE, jobs=1)
        stair.full = {t: float(runs[0]["npu_cycles"]) for t, runs in dense.items()}
        totals = {t: float(runs[0]["total_cycles"]) for t, runs in dense.items()}
    budgets = _budgets(recipe, stair, totals)
    limits = {t: b["npu_cycles"] for t, b in budgets.items()}
    checks: list[dict[str, Any]] = []  # every choice compiled, once

    def compile_choices(choices):
        return _grid_or_new(choices, [_width_key(widths, v) for v in choices], unique, compiled,
                            lambda new: compile_models([_candidate(model, graph, scores, widths, v, calibration, recipe)
                                                        for v in new], recipe.thin_targets, out / TRACE, jobs=1))

    row = partial(_check, stair, widths, drops, budgets=budgets)

    values, steps = choose(stair, limits, drops, fixed)
    final: dict[str, float] = {}
    for _ in range(CHECKS):  # the shortlist compiled; the least expected loss that Vela finds within budget
        options = shortlist(stair, limits, drops, fixed)
        rows, compiled_any = _checked(options, checks, widths, compile_choices, row)
        met = [i for i, r in enumerate(rows) if r["met"]]
        pick = (min(met, key=lambda i: (rows[i]["expected_loss"], i)) if met else  # (else the nearest to it)
                min(range(len(rows)), key=lambda i: (max(c / budgets[t]["npu_cycles"]
                                                         for t, c in rows[i]["npu_cycles"].items()), i)))
        values, final = options[pick], rows[pick]["npu_cycles"]
        if met or not compiled_any:
            break
        tightened = False
        for t, cycles in final.items():  # below this choice's prediction, by what the prediction missed
            if cycles > budgets[t]["npu_cycles"]:
                limit = min(limits[t], stair.predict(t, values) * budgets[t]["npu_cycles"] / cycles) - 1
                if limit > 0:  # (none left to aim at below a budget this far under every choice's cycles)
                    limits[t], tightened = limit, True
        if not tightened:
            break
    ratios = {t: final[t] / budgets[t]["npu_cycles"] for t in final}
    tried = [values]
    if recipe.thin_trials > 1 and all(r <= 1.0 for r in ratios.values()):
        others = alternatives(stair, limits, drops, values, fixed, count=recipe.thin_trials - 1)
        rows, _ = _checked(others, checks, widths, compile_choices, row)
        tried += [v for v, r in zip(others, rows) if r["met"]]
    held_on = max(ratios, key=lambda t: ratios[t])
    record = {
        "targets": list(recipe.thin_targets), "held_on": held_on,
        "cycles_of": "the thinned model pruned 2:4" if recipe.sparsity_pattern == "2:4" else "the thinned model",
        "budget": {t: {**b, "npu_cycles": round(b["npu_cycles"])} for t, b in budgets.items()},
        "met": all(r <= 1.0 for r in ratios.values()),
        "npu_cycles": final, "cycles_vs_ptq": {t: round(final[t] / stair.full[t], 4) for t in final},
        "grid": {"assignments": len(assignments), "compiles_per_target": len(unique), "colours": colours,
                 "widths": {g: widths[g] for g in groups}, **({"held_at_full_width": sorted(fixed)} if fixed else {})},
        "steps": steps, "checks": checks,
    }
    return values, record, tried


def thin_node(run) -> Any:
    """The ``thinned`` node: see the module."""
    env, recipe, data = run.env, run.recipe, run.data
    from edgedeploy.config.targets import get_target

    if not recipe.thin_targets:  # (a Recipe built in Python, not loaded: the loader refuses an empty list)
        raise UsageError(f"stage {run.node.name}: the recipe's thin_targets is empty",
                         'name the targets whose NPU cycles choose the widths, e.g. thin_targets = ["ethos-u55-128"]')
    for name in recipe.thin_targets:  # (a wrong name fails before any work)
        get_target(name)
    clock = _Clock()
    model = run.parent()
    graph = channel_groups(model)
    groups = graph.thinnable()
    held = graph.held()
    if not groups:
        reasons = "; ".join(f"{k}: {v}" for k, v in held.items()) or "it has no Conv2D or Dense layer"
        raise UsageError(f"stage {run.node.name}: no layer of the model can be thinned ({reasons})",
                         f"leave the {run.node.name} leaves out of the recipe")
    ts = training_set(data, recipe)
    rng = np.random.default_rng(recipe.seed)
    x_fit = ts.x[rng.choice(len(ts.x), min(len(ts.x), recipe.calibration_samples), replace=False)]
    x_hold = ts.x_val if len(ts.x_val) else x_fit
    scores = channel_scores(model, graph, x_fit)
    block = 4 if recipe.sparsity_pattern == "2:4" else 1  # (the thinned_pruned leaf keeps U85's 2:4 speed)
    widths = {g: candidate_widths(groups[g].size, block, recipe.thin_candidates) for g in groups}
    classifier = getattr(run.loss, "classifier", True)
    drops = sensitivity(model, graph, scores, widths, x_fit[:256], x_hold, classifier,
                        bool(getattr(run.loss, "from_logits", False)))
    clock.lap("sensitivity")
    values, npu, choices = npu_widths(model, graph, scores, drops, widths, recipe, data, run.out)
    clock.lap("candidate_compiles")
    trials, kept = _trials(run, model, graph, scores, widths, choices, x_fit) if len(choices) > 1 else ([], 0)
    clock.lap("trials")
    if recipe.thin_trials > 1 and len(choices) == 1:
        log.info("thinned: no trial, no other choice is within the budget by Vela")
    if trials:
        values = choices[kept]
        _take(npu, values, choices[0], widths)
    keep = _keep(scores, widths, values)
    thinned = thin_model(model, graph, keep) if keep else model
    refitted = refit(model, thinned, graph, keep, x_fit, seed=recipe.seed) if keep else {}
    clock.lap("refit")
    run.details["thinning"] = {
        "widths": {g: int(len(keep[g])) if g in keep else groups[g].size for g in groups},
        "full_widths": {g: groups[g].size for g in groups},
        "coupled": {g: groups[g].producers for g in groups if len(groups[g].producers) > 1},
        "not_thinned": held,
        "channel_choice": "energy of each channel in what its readers compute, on "
                          f"{len(x_fit)} fine-tune samples",
        "sensitivity": {"loss": "KL divergence to the unthinned model" if classifier else "mean square error",
                        "hold_out_samples": int(len(x_hold)), "per_width": {g: [round(d, 5) for d in drops[g]]
                                                                            for g in groups}},
        "npu": npu,
        **({"trials": trials} if recipe.thin_trials > 1 else {}),  # (empty: nothing but the search's was tried)
        "refit": refitted,
        "kernel_channels": {k: list(v) for k, v in kernel_channels(thinned).items()},
        "seconds": clock.laps,  # where the node's time went, by step (fine_tuning added below)
    }
    log.info("thinned: widths %s; %s NPU cycles on %s (budget held there: %s)",
             ", ".join(f"{g} {w}/{groups[g].size}" for g, w in run.details["thinning"]["widths"].items()),
             ", ".join(f"{r}x" for r in npu["cycles_vs_ptq"].values()), ", ".join(npu["cycles_vs_ptq"]),
             npu["held_on"])
    if not npu["met"]:
        run.warnings.append(f"thinned: the widths found miss the cycle budget on {npu['held_on']} "
                            f"({npu['npu_cycles'][npu['held_on']]} > {npu['budget'][npu['held_on']]['npu_cycles']} "
                            "NPU cycles); every candidate width was tried")
    if trials:  # (the kept choice trains from the seed, as it would have without the trials before it)
        tfenv_seed(recipe.seed)
    fine_tune(env, thinned, data, recipe, "thin", run.loss, run.node.name, record=run.training,
              mirrored=mirrored(run))
    clock.lap("fine_tuning")
    return thinned


class _Clock:
    """Seconds per step of the thinned node: each :meth:`lap` records the time since the one before."""

    def __init__(self) -> None:
        import time

        self._now = time.monotonic
        self._last = self._now()
        self.laps: dict[str, float] = {}

    def lap(self, step: str) -> None:
        now = self._now()
        self.laps[step] = round(now - self._last, 1)
        self._last = now


def _keep(scores, widths, values: dict[str, int]) -> dict[str, np.ndarray]:
    """The channels each thinned group keeps at the value indices ``values``."""
    return {g: top_channels(scores[g], widths[g][v]) for g, v in values.items() if widths[g][v] < widths[g][0]}


TRIAL_Z = 2.0  # standard errors by which a tried choice must beat the search's on the hold-out to be kept


@timed("trials")
def _trials(run, model, graph, scores, widths, choices: list[dict[str, int]], x_fit
            ) -> tuple[list[dict[str, Any]], int]:
    """``thin_trials``: each choice thinned, refitted and fine-tuned for ``thin_trial_epochs`` as the thinned node
    would be; per choice its widths, hold-out loss and accuracy, its difference to the search's choice (the first)
    in hold-out loss, sample by sample, with its standard error, and its seconds. Returns the rows and the index of
    the choice kept: the least hold-out loss where it is below the search's by more than :data:`TRIAL_Z`
    standard errors, else the search's (choices a hold-out cannot tell apart are left to the search). No row
    without a hold-out (``selection.validation_fraction = 0``)."""
    import time
    from dataclasses import replace

    recipe = run.recipe
    if recipe.validation_fraction <= 0:
        run.warnings.append("thin_trials: no choice tried, there is no hold-out to score them "
                            "(selection.validation_fraction = 0)")
        return [], 0
    short = replace(recipe, stage_epochs={**recipe.stage_epochs, "thin": recipe.thin_trial_epochs})
    ts = training_set(run.data, short, mirrored(run))  # (one split for every trial, and its hold-out)
    if not len(ts.x_val):  # (too few fine-tune samples to hold any out)
        run.warnings.append("thin_trials: no choice tried, the hold-out is empty")
        return [], 0
    rows, losses = [], []
    for i, values in enumerate(choices):
        start = time.monotonic()
        keep = _keep(scores, widths, values)
        trial = thin_model(model, graph, keep)
        refit(model, trial, graph, keep, x_fit, seed=recipe.seed)
        tfenv_seed(recipe.seed)
        done: dict[str, Any] = {}
        fine_tune(run.env, trial, run.data, short, "thin", run.loss, f"{run.node.name} trial {i + 1}/{len(choices)}",
                  train_set=ts, record=done)
        per = hold_out_losses(run.env, trial, ts, short, run.loss)
        losses.append(per)
        curve = {e["epoch"]: e for e in done.get("curve", [])}
        best = curve.get((done.get("selection") or {}).get("best_epoch"), {})
        diff = per - losses[0]
        rows.append({"widths": {g: widths[g][values[g]] for g in widths}, "hold_out_loss": round(float(per.mean()), 5),
                     **({"hold_out_accuracy": best["val_accuracy"]} if "val_accuracy" in best else {}),
                     **({"vs_search": {"difference": round(float(diff.mean()), 5),
                                       "se": round(float(diff.std(ddof=1) / np.sqrt(len(diff))), 5)}} if i else {}),
                     "epochs": recipe.thin_trial_epochs, "seconds": round(time.monotonic() - start, 1)})
        log.info("thinned trial %d/%d: hold-out loss %.4f at %s", i + 1, len(choices), per.mean(),
                 ", ".join(f"{g} {w}" for g, w in rows[-1]["widths"].items()))
    best_i = min(range(len(rows)), key=lambda i: (rows[i]["hold_out_loss"], i))
    versus = rows[best_i].get("vs_search")
    kept = best_i if versus and versus["difference"] < -TRIAL_Z * versus["se"] else 0
    return rows, kept


def _take(npu: dict[str, Any], values: dict[str, int], first: dict[str, int], widths) -> None:
    """Point the search's record at the tried choice ``values`` when it is not the search's own (``first``)."""
    key, own = ({g: widths[g][v] for g, v in c.items()} for c in (values, first))
    if key == own:
        return
    check = next(c for c in npu["checks"] if c["widths"] == key)
    npu["search_choice"] = own
    npu["npu_cycles"] = check["npu_cycles"]
    npu["cycles_vs_ptq"] = {t: round(c / npu["budget"][t]["ptq_npu_cycles"], 4) for t, c in check["npu_cycles"].items()}
    npu["held_on"] = max(check["npu_cycles"], key=lambda t: check["npu_cycles"][t] / npu["budget"][t]["npu_cycles"])
