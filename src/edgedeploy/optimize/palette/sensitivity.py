"""The sensitivity sweep: each layer and setting measured on fine-tune samples, in a local process pool or as
Ray tasks, and the encoded bytes of each setting from Vela."""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np

from edgedeploy.errors import UsageError
from edgedeploy.config.recipe import PALETTE_DEFAULTS
from edgedeploy.keras.saving import save_model_h5
from edgedeploy.optimize.palette.projection import PALETTE_LIMIT
from edgedeploy.optimize.palette.plan import (
    LayerSetting,
    candidate_settings,
    drop_per_loss,
    greedy_plan,
    memoized,
    plan_bytes,
    sized_plan,
    start_options,
)
from edgedeploy.vela.debugdb import attach_int8, layer_of_tensor, weight_layers
from edgedeploy.optimize.palette.models import _palette_opt, apply_plan, kernel_layers, scale_method
from edgedeploy.optimize.palette.plan import holdout_split

log = logging.getLogger("edgedeploy")

EXECUTORS = ("process", "ray")


MEASURE_SAMPLES = 4000  # most fine-tune samples the sweep measures drops on ([palette] measure_samples)
_WORKER: dict[str, Any] = {}  # what a sweep worker process loaded once


def _worker_init(model_path: str, x_path: str, y_path: str, hessian_path: str | None = None,
                 from_logits: bool = False, scales: str = "peak") -> None:
    from edgedeploy.keras import tfenv

    env = tfenv.load()
    _WORKER["model"] = env.keras.models.load_model(model_path, compile=False)
    _WORKER["x"] = np.load(x_path)
    _WORKER["y"] = np.load(y_path)
    _WORKER["hessians"] = load_hessians(Path(hessian_path)) if hessian_path else None
    _WORKER["from_logits"] = from_logits
    _WORKER["scales"] = scales


def save_hessians(hessians: Mapping[str, np.ndarray], path: Path) -> Path:
    """Write :func:`layer_hessians` to ``path`` (.npz, one array per layer)."""
    np.savez(path, allow_pickle=False, **{name: np.asarray(h) for name, h in hessians.items()})
    return path


def load_hessians(path: Path) -> dict[str, np.ndarray]:
    with np.load(path) as f:
        return {name: f[name] for name in f.files}


def _scores(model, x, y, from_logits: bool = False) -> tuple[float, float]:
    """Top-1 accuracy (%) and mean cross-entropy (nats) of ``model`` on labelled samples."""
    from edgedeploy.optimize.finetune.loop import log_probs

    lp = log_probs(model.predict(x, batch_size=512, verbose=0), from_logits)
    return float(np.mean(np.argmax(lp, axis=-1) == y)) * 100.0, float(-np.mean(lp[np.arange(len(y)), y]))


def evaluate_item(layer: str, setting: dict[str, Any], seed: int) -> dict[str, Any]:
    """One sweep item, in a worker: accuracy and loss on the measured samples with only ``layer`` projected."""
    model = _WORKER["model"]
    target = model.get_layer(layer)
    saved = target.get_weights()
    try:
        done = apply_plan(model, {layer: setting}, seed, _WORKER.get("hessians"), _WORKER["scales"])
        acc, loss = _scores(model, _WORKER["x"], _WORKER["y"], bool(_WORKER.get("from_logits")))
    finally:
        target.set_weights(saved)
    return {"layer": layer, "setting": setting, "accuracy": acc, "loss": loss, "projection": done.get(layer)}


def _ray_item(model_path: str, x, y, hessians, from_logits: bool, layer: str, setting: dict[str, Any],
              seed: int, scales: str = "peak") -> dict[str, Any]:
    if "model" not in _WORKER or _WORKER.get("path") != model_path:
        from edgedeploy.keras import tfenv

        _WORKER["model"] = tfenv.load().keras.models.load_model(model_path, compile=False)
        _WORKER["path"] = model_path
    _WORKER.update(x=x, y=y, hessians=hessians, from_logits=from_logits, scales=scales)
    return evaluate_item(layer, setting, seed)


def run_items(items: Sequence[tuple[str, dict[str, Any]]], model_path: Path, x: np.ndarray, y: np.ndarray,
              work: Path, executor: str = "process", workers: int = 2, seed: int = 0,
              hessians: Mapping[str, np.ndarray] | None = None, from_logits: bool = False,
              scales: str = "peak") -> list[dict[str, Any]]:
    """Evaluate independent (layer, setting) items in a local process pool, or as Ray tasks.

    Each item gives the accuracy (%) and mean cross-entropy (``from_logits``: the model outputs logits) on
    ``x, y`` with only its layer projected.

    With ``hessians`` (the unprojected model's, :func:`layer_hessians`) items use the error-compensating
    projection, as the palette node does.
    """
    if executor not in EXECUTORS:
        raise UsageError(f"palette executor '{executor}' is unknown", f"use one of {', '.join(EXECUTORS)}")
    if executor == "ray":
        try:
            import ray
        except ImportError as exc:
            raise UsageError("palette executor 'ray' needs Ray", "pip install -e .[ray]") from exc
        from edgedeploy.vela.ray_pool import join_ray

        # a cluster (RAY_ADDRESS) sets its own CPUs
        started = join_ray(ray, os.environ.get("RAY_ADDRESS"), max(1, workers))
        try:
            task = ray.remote(_ray_item)
            xr, yr, hr = ray.put(x), ray.put(y), ray.put(None if hessians is None else dict(hessians))
            return ray.get([task.remote(str(model_path), xr, yr, hr, from_logits, layer, setting, seed, scales)
                            for layer, setting in items])
        finally:
            if started:
                from edgedeploy.vela.ray_pool import shutdown_ray

                shutdown_ray(ray)
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor
    from concurrent.futures.process import BrokenProcessPool

    from edgedeploy.errors import ToolFailedError

    x_path, y_path = work / "measure_x.npy", work / "measure_y.npy"
    np.save(x_path, x)
    np.save(y_path, y)
    h_path = None if hessians is None else str(save_hessians(hessians, work / "hessians.npz"))
    with ProcessPoolExecutor(max_workers=max(1, workers), mp_context=multiprocessing.get_context("spawn"),
                             initializer=_worker_init,
                             initargs=(str(model_path), str(x_path), str(y_path), h_path, from_logits,
                                       scales)) as pool:
        futures = [pool.submit(evaluate_item, layer, setting, seed) for layer, setting in items]
        try:
            return [f.result() for f in futures]
        except BrokenProcessPool as exc:
            raise ToolFailedError("a worker of the palette sweep stopped abruptly (out of memory, or a script "
                                  "that starts edgedeploy without an `if __name__ == \"__main__\":` guard)",
                                  "set [palette] workers = 1, or guard the script's entry point") from exc


ALL_WEIGHTS = "*"  # layer_bytes: the key of a model's encoded weights over every weight operator
REFERENCE = "reference"  # sensitivity_sweep: the model a size budget is a fraction of


def layer_bytes(models: Mapping[str, Path], target_name: str, work: Path, layer_names: Sequence[str]
                ) -> dict[str, dict[str, int]]:
    """Vela-encoded weight bytes per Keras layer of each int8 model (key -> layer -> bytes), Vela in workers.

    Each model's entry also holds, under :data:`ALL_WEIGHTS`, its encoded weights over every NPU operator.
    """
    from edgedeploy.config.targets import get_target
    from edgedeploy.tflite.reader import read_tflite, read_weight_tensors
    from edgedeploy.vela.runner import DEBUG_DB_FLAG, NEEDED, VelaRequest, run_all

    target = get_target(target_name)
    requests = []
    for key, model in models.items():
        folder = work / f"vela_{key}"
        folder.mkdir(parents=True, exist_ok=True)
        requests.append(VelaRequest(model, target, folder, "Performance", (DEBUG_DB_FLAG,)))
    results = run_all(requests, need=NEEDED | {"debug_db"},
                      fix="check that the palette sweep's int8 models convert cleanly")
    out: dict[str, dict[str, int]] = {}
    for key, res in zip(models, results):
        rows = weight_layers(res.debug_tables or {})
        attach_int8(rows, read_tflite(models[key]).operators, read_weight_tensors(models[key]))
        sizes: dict[str, int] = {ALL_WEIGHTS: int(sum(int(r["encoded_weight_bytes"]) for r in rows))}
        for r in rows:
            layer = layer_of_tensor(r.get("tensor") or "", layer_names)
            if layer is not None:
                sizes[layer] = sizes.get(layer, 0) + int(r["encoded_weight_bytes"])
        out[key] = sizes
    return out


def sensitivity_sweep(model, data, recipe, work: Path, hessians: Mapping[str, np.ndarray] | None = None,
                      from_logits: bool = False, reference=None) -> dict[str, Any]:
    """Per layer x setting: accuracy drop and Vela-encoded bytes; then the plan that fits the budget.

    The budget is ``[palette] accuracy_budget`` (the plan of fewest bytes within it) or, when
    ``[palette] size_budget`` is set, a size: the plan of least drop whose encoded weights are at most that
    fraction of ``reference``'s (a float Keras model, converted to int8 as the ptq leaf is; the tree's
    baseline), found by :func:`sized_plan`.

    ``hessians`` (:func:`layer_hessians` of ``model``) make every projection of the sweep the error-compensating
    one the palette node then applies; without them layers snap to their nearest palette values.

    A drop is judged, by default (``[palette] drop_estimate = "loss"``), as the rise of the mean cross-entropy
    on the measured samples times the points-per-nat slope fitted over the sweep's own single-layer items
    (:func:`drop_per_loss`); ``"accuracy"`` takes the measured accuracy drop itself. Both are recorded.
    """
    t0 = time.perf_counter()
    clusters = tuple(_palette_opt(recipe, "clusters", (4, 8, 16)))
    sparsities = tuple(_palette_opt(recipe, "sparsities", (0.0, 0.6)))
    budget = float(_palette_opt(recipe, "accuracy_budget", 0.3))
    executor = str(_palette_opt(recipe, "executor", "process"))
    workers = int(_palette_opt(recipe, "workers", 2))
    target = str(_palette_opt(recipe, "target", "ethos-u55-128"))
    hold, hold_from = _measured_samples(data, recipe)
    x_hold, y_hold = data.x_fit[hold], data.y_fit[hold]
    layers = [name for name, _ in kernel_layers(model, recipe.skip_layers)]
    # Every layer gets a palette; the largest (Vela's limit) is where the walk starts.
    clusters = tuple(sorted(set(clusters) | {PALETTE_LIMIT}))
    settings = candidate_settings(clusters, sparsities)
    work.mkdir(parents=True, exist_ok=True)
    model_path = work / "parent.h5"
    save_model_h5(model, model_path)
    base_acc, base_loss = _scores(model, x_hold, y_hold, from_logits)
    items = [(layer, s.to_dict()) for layer in layers for s in settings]
    log.info("palette sweep: %d layers x %d settings on %d samples (%s)", len(layers), len(settings),
             len(hold), executor)
    scales = scale_method(recipe)
    results = run_items(items, model_path, x_hold, y_hold, work, executor, workers, recipe.seed, hessians,
                        from_logits, scales)
    judge, estimate, slope = _drop_judge(recipe, results, base_acc, base_loss)
    size_budget = _palette_opt(recipe, "size_budget", None)
    models = _setting_models(model, data, recipe, settings, layers, work, hessians, scales, reference, size_budget)
    sizes = layer_bytes(models, target, work, layers)
    options = _layer_options(results, sizes, layers, judge)

    # Single-layer drops do not add up: walk the moves and check each on the whole model.
    # Memoized: a size-budget walk that keeps no move asks again for the start plan judged here.
    @memoized
    def joint_drop(plan: Mapping[str, Mapping[str, Any]]) -> dict[str, float]:
        from edgedeploy.keras import tfenv

        m = tfenv.load().keras.models.clone_model(model)
        m.set_weights(model.get_weights())
        apply_plan(m, plan, recipe.seed, hessians, scales)
        return judge(*_scores(m, x_hold, y_hold, from_logits))

    walk = _walk(options, joint_drop, sizes, recipe, budget, size_budget)
    return {
        "plan": walk["plan"],
        "budget_points": None if walk["size"] else budget,
        "budget_from": walk["budget_from"],
        "effective_budget_points": None if walk["size"] else round(walk["effective"], 3),
        "size": walk["size"],
        "measured_on": {"samples": len(hold), "from": hold_from,
                        "baseline_accuracy": round(base_acc, 3), "baseline_loss": round(base_loss, 5)},
        "drop_estimate": (estimate if estimate == "accuracy" or slope is not None
                          else "accuracy (too few items for loss)"),
        "points_per_nat": None if slope is None else round(slope, 3),
        "target": target,
        "executor": executor,
        "projection": "gptq" if hessians is not None else "nearest",
        "settings": [s.to_dict() for s in settings],
        "options": options,
        "checks": walk["checks"],
        "steps": walk["steps"],
        "seconds": round(time.perf_counter() - t0, 1),
    }


def _measured_samples(data, recipe) -> tuple[np.ndarray, str]:
    """The fine-tune samples the sweep measures drops on (indices), and where they come from in words."""
    if _palette_opt(recipe, "measure_on", "fine-tune") == "fine-tune":
        # Drops are paired differences (the same samples with and without a setting), so the samples the
        # parent was fine-tuned on serve; the whole labelled fine-tune split resolves them ten times finer than
        # a 10% hold-out, where one sample of 300 is already a third of a point.
        hold = np.flatnonzero(np.asarray(data.y_fit) >= 0)
        hold_from = "every labelled sample of the fine-tune split"
        cap = int(_palette_opt(recipe, "measure_samples", MEASURE_SAMPLES))
        if len(hold) > cap:  # the sweep's time grows with the samples; a few thousand resolve 0.05 points
            hold = np.sort(np.random.default_rng(recipe.seed).choice(hold, cap, replace=False))
            hold_from = f"{cap} labelled samples of the fine-tune split (random, seed {recipe.seed})"
    else:
        _, hold, hold_from = sweep_holdout(data, recipe)
    if len(hold) == 0:
        raise UsageError("the palette sweep has no labelled samples to measure on",
                         "set [selection] validation_fraction > 0 or [palette] holdout = 0.2")
    return hold, hold_from


def _drop_judge(recipe, results: Sequence[Mapping[str, Any]], base_acc: float, base_loss: float
                ) -> tuple["_DropJudge", str, float | None]:
    """How drops are judged (``[palette] drop_estimate``), that estimate's name and the points-per-nat slope
    fitted over the single-layer ``results`` (None when too few)."""
    estimate = str(_palette_opt(recipe, "drop_estimate", PALETTE_DEFAULTS["drop_estimate"]))
    slope = drop_per_loss([base_acc - r["accuracy"] for r in results], [r["loss"] - base_loss for r in results])
    if estimate == "loss" and slope is None:
        log.warning("palette sweep: too few single-layer items to relate loss to accuracy; judging measured drops")
    return _DropJudge(base_acc, base_loss, slope if estimate == "loss" else None), estimate, slope


@dataclass(frozen=True)
class _DropJudge:
    """The accuracy drop of a projected model's (accuracy, loss) on the measured samples: its loss rise times
    ``slope`` (points per nat), or without a slope the measured drop itself."""

    base_acc: float
    base_loss: float
    slope: float | None

    def __call__(self, acc: float, loss: float) -> dict[str, float]:
        measured = self.base_acc - acc
        drop = self.slope * (loss - self.base_loss) if self.slope is not None else measured
        return {"drop": round(drop, 3), "measured_drop": round(measured, 3),
                "loss_rise": round(loss - self.base_loss, 5)}


def _setting_models(model, data, recipe, settings: Sequence[LayerSetting], layers: Sequence[str], work: Path,
                    hessians: Mapping[str, np.ndarray] | None, scales: str, reference, size_budget: Any
                    ) -> dict[str, Path]:
    """One int8 model per setting, every layer projected alike (Vela encodes each layer alone), and with a size
    budget the reference model it is a fraction of (under :data:`REFERENCE`)."""
    from edgedeploy.keras import tfenv
    from edgedeploy.tflite.convert import convert_int8

    calibration, _ = data.calibration(recipe.calibration_samples, recipe.seed)
    models = {}
    keras = tfenv.load().keras
    for key, setting in [(s.key, s) for s in settings]:
        m = keras.models.clone_model(model)
        m.set_weights(model.get_weights())
        apply_plan(m, {layer: setting.to_dict() for layer in layers}, recipe.seed, hessians, scales)
        path = work / f"{key}.tflite"
        path.write_bytes(convert_int8(m, calibration, float_io=recipe.float_io))
        models[key] = path
    if size_budget is not None:
        if reference is None:
            raise UsageError("the palette sweep's size budget needs the model it is a fraction of",
                             "run it from `edgedeploy optimize`, which passes the baseline")
        models[REFERENCE] = work / f"{REFERENCE}.tflite"
        models[REFERENCE].write_bytes(convert_int8(reference, calibration, float_io=recipe.float_io))
    return models


def _layer_options(results: Sequence[Mapping[str, Any]], sizes: Mapping[str, Mapping[str, int]],
                   layers: Sequence[str], judge: _DropJudge) -> dict[str, list[dict[str, Any]]]:
    """Per layer, each setting Vela encoded with its bytes and judged drop (layers with none left out)."""
    options: dict[str, list[dict[str, Any]]] = {layer: [] for layer in layers}
    for r in results:
        s = LayerSetting(r["setting"]["clusters"], r["setting"]["sparsity"])
        b = sizes.get(s.key, {}).get(r["layer"])
        if b is None:
            continue
        options[r["layer"]].append({"setting": s.to_dict(), "bytes": b, **judge(r["accuracy"], r["loss"]),
                                    "accuracy": round(r["accuracy"], 3)})
    return {k: v for k, v in options.items() if v}


def _walk(options: Mapping[str, Sequence[Mapping[str, Any]]], joint_drop, sizes: Mapping[str, Mapping[str, int]],
          recipe, budget: float, size_budget: Any) -> dict[str, Any]:
    """The plan within the accuracy budget (fewest bytes) or the size budget (least drop), the steps that found
    it and the whole-model checks of its start and its end."""
    start = start_options(options)
    start_judged = joint_drop({k: v["setting"] for k, v in start.items()})
    start_drop = start_judged["drop"]
    # "palette" (default): the budget counts from the start (every layer at Vela's 32 values, which every
    # palette leaf needs anyway and which QAT trains back), so a model whose 32-value palette alone is over
    # budget can still trade accuracy for bytes; when the start loses nothing this is the same as "parent",
    # where the budget counts from the parent model.
    budget_from = str(_palette_opt(recipe, "budget_from", "palette"))
    effective = budget + (max(start_drop, 0.0) if budget_from == "palette" else 0.0)
    sized = None
    if size_budget is None:
        chosen, steps = greedy_plan(options, joint_drop, effective)
    else:
        chosen, steps, sized = _sized_walk(options, joint_drop, sizes, float(size_budget), start_drop)
    kept = [st for st in steps if st["kept"]]
    final = joint_drop(chosen)  # judged already (as the start or a step), so read from the memo
    checks = {"start": f"every layer at {PALETTE_LIMIT} palette values", "start_drop": round(start_drop, 3),
              "start_measured_drop": start_judged["measured_drop"],
              "start_encoded_bytes": int(sum(o["bytes"] for o in start.values())),
              "steps_tried": len(steps), "steps_kept": len(kept),
              "drop": final["drop"], "measured_drop": final["measured_drop"],
              "encoded_bytes": plan_bytes(options, chosen)}
    return {"plan": chosen, "steps": steps, "size": sized, "budget_from": budget_from,
            "effective": effective, "checks": checks}


def _sized_walk(options: Mapping[str, Sequence[Mapping[str, Any]]], joint_drop, sizes: Mapping[str, Mapping[str, int]],
                size_budget: float, start_drop: float) -> tuple[dict[str, Any], list[dict[str, Any]], dict[str, Any]]:
    """The plan of least drop whose encoded weights are at most ``size_budget`` of the reference's, its steps,
    and the record of the size it reached."""
    # Weight operators outside the sweep's layers (skipped layers) keep their bytes in every plan.
    fixed = max(v[ALL_WEIGHTS] - sum(v.get(layer, 0) for layer in options) for k, v in sizes.items()
                if k != REFERENCE)
    reference_bytes = sizes[REFERENCE][ALL_WEIGHTS]
    limit = int(size_budget * reference_bytes) - fixed
    found = sized_plan(options, joint_drop, limit, max(start_drop, 0.0))
    sized = {"size_budget": size_budget, "reference_encoded_bytes": reference_bytes,
             "fixed_encoded_bytes": fixed, "encoded_bytes": found["bytes"] + fixed,
             "fraction_of_reference": round((found["bytes"] + fixed) / reference_bytes, 4),
             "fits": found["fits"], "walks": found["walks"]}
    if not found["fits"]:
        log.warning("palette sweep: even the smallest plan (%d encoded bytes, %.3f of the baseline's) is over "
                    "the size budget of %.3f; add smaller [palette] clusters or larger sparsities",
                    found["bytes"] + fixed, sized["fraction_of_reference"], size_budget)
    return found["plan"], found["steps"], sized


def sweep_holdout(data, recipe) -> tuple[np.ndarray, np.ndarray, str]:
    """Indices (train, hold-out) of the fine-tune split for the sweep, and where the hold-out comes from.

    By default the sweep uses the stage training's own hold-out (``[selection] validation_fraction``: no node
    trains on it); ``[palette] holdout = F`` sets aside a seeded random fraction F of the fine-tune split instead.
    Unlabelled samples are never in the hold-out. The evaluation split is never used.
    """
    fraction = _palette_opt(recipe, "holdout", None)
    shared = float(getattr(recipe, "validation_fraction", 0.0) or 0.0)
    y = np.asarray(data.y_fit)
    if fraction is None and shared > 0 and getattr(data, "labelled", True):
        from edgedeploy.optimize.finetune.loop import holdout_split as stratified

        train, hold = stratified(y, shared, recipe.seed)
        return train, hold[y[hold] >= 0], (f"the stage training's hold-out ({shared:g} of the fine-tune split, "
                                           f"stratified, seed {recipe.seed})")
    fraction = 0.2 if fraction is None else float(fraction)
    train, hold = holdout_split(len(y), fraction, recipe.seed)
    if not getattr(data, "labelled", True):  # target values (regression, reconstruction): no unlabelled samples
        return train, hold, f"a random {fraction:g} of the fine-tune split (seed {recipe.seed})"
    return train, hold[y[hold] >= 0], f"a random {fraction:g} of the fine-tune split (seed {recipe.seed})"
