"""Palette-aware leaves against TFMOT's PCQAT, measured in the NPU's currency.

For the MLPerf Tiny DS-CNN (Speech Commands: fine-tune split == 0 -> eval split == 1) and the MLPerf Tiny
ResNet-8 (CIFAR-10 JPEG subset: x_train -> x_test), and with --models kws_s also for Arm's DS-CNN-S (not part
of the goal: a third real model, with reshape layers TFMOT has no QAT config for), it runs `edgedeploy optimize`
with the leaves ptq, pcqat, pruned_clustered_palette and pcqat_palette, or those of --leaves (the palette node
runs the per-layer sensitivity sweep on samples of the fine-tune split), compiles every leaf with Vela (debug
database on) and prints per leaf:

- int8 accuracy on the evaluation split and its difference to the ptq leaf;
- Vela-encoded weights and NPU cycles on ethos-u55-128 and ethos-u85-256 (built-in targets, --optimise
  Performance), and the encoded weights as a fraction of the ptq leaf's;
- weight-read cycles (Vela's debug database, est_weight_read_cycles summed over layers) and total cycles on two
  weight-bandwidth-bound configurations: ethos-u55-128 with --optimise Size (weights streamed from its 0.5 GB/s
  flash) and the user target bench/targets/ethos-u85-256-flash.toml (Ethos_U85_SYS_Flash_High, Shared_Sram);
- the largest number of distinct int8 values in one weight tensor (Vela's palette holds 32);
- the paired standard error of each leaf's accuracy difference to ptq (the same evaluation samples scored by
  both int8 models): on small evaluation splits it is as large as the accuracy budget itself. With --seeds
  the whole run repeats per seed (fine-tuning, sweep samples, calibration) and a last table gives the mean
  difference over the seeds with its paired standard error, and the mean encoded-weights fraction;
- each leaf's difference to the float baseline (Keras) on the same samples, with its paired standard error:
  int8 conversion alone moves the ptq leaf away from the float model by tenths of a point on small splits.

The "best palette-aware leaf" is the one with the smallest encoded weights on ethos-u55-128 among the palette
leaves within --budget points of the ptq leaf's int8 accuracy (or, if none is, the most accurate one).

Run: python bench/bench_palette.py [--goal] [--models kws,ic,kws_s] [--epochs N] [--ic-epochs N] [--sparsity S] [--budget PTS] [--out DIR]
     [--data ../shared/data] [--no-search] [--projection gptq|nearest] [--scales peak|fitted]
     [--drop-estimate loss|accuracy]
     [--seed N | --seeds 0,1,2] [--qat-ranges calibrated|tfmot] [--size-budget FRACTION] [--palette-clusters 4,8,16] [--leaves ptq,cqat_palette]
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
MODELS = {
    "kws": ("MLPerf DS-CNN, Speech Commands (fine-tune split 0 -> eval split 1)", "kws/dscnn_mlperf_float.h5",
            "kws/speech_commands_v2_test_mfcc_mlperf.npz"),
    "ic": ("MLPerf ResNet-8, CIFAR-10 JPEG subset (x_train -> x_test)", "ic/resnet8_mlperf_float.h5",
           "ic/cifar10_jpeg_subset.npz"),
    # not part of the goal: a third real model, with reshapes TFMOT has no QAT config for
    "kws_s": ("Arm DS-CNN-S, Speech Commands, Arm's MFCC front end (fine-tune split 0 -> eval split 1)",
              "kws/ds_cnn_s_arm_float.h5", "kws/speech_commands_v2_test_mfcc_arm.npz"),
}
PALETTE_LEAVES = ["clustered_palette", "cqat_palette", "pruned_clustered_palette", "pcqat_palette"]
LEAVES = ["ptq", "pcqat", *PALETTE_LEAVES]  # the order of the tables; --leaves picks which run
DEFAULT_LEAVES = "ptq,pcqat,pruned_clustered_palette,pcqat_palette"
FLOAT = "float-vs-"  # per_sample_delta key prefix: a leaf's per-sample difference to the float baseline
GOAL_RATIO = 0.40  # the goal: encoded weights at most this fraction of ptq's, within the accuracy budget
MAIN_TARGETS = ["ethos-u55-128", "ethos-u85-256"]
FLASH_TARGET = str(REPO / "bench" / "targets" / "ethos-u85-256-flash.toml")


def _m(rec, name):
    return None if rec is None else rec.metric(name)


def _fmt(v, spec=","):
    return "n/a" if v is None else format(v, spec)


def run_model(key: str, args, seed: int | None = None, out: Path | None = None) -> dict:
    from dataclasses import replace

    from edgedeploy.pipeline.compile import CompileOptions, compile_variants
    from edgedeploy.errors import EdgeDeployError
    from edgedeploy.pipeline.driver import drive
    from edgedeploy.pipeline.run_plan import Plan
    from edgedeploy.config.recipe import load_recipe
    from edgedeploy.core.stage import RunContext
    from edgedeploy.config.targets import get_target

    title, model, data = MODELS[key]
    out = (out or args.out) / key
    sweep_budget = args.budget if args.sweep_budget is None else args.sweep_budget
    run_leaves = args.leaves.split(",")
    table = {"leaves": run_leaves, "palette": {"search": not args.no_search, "accuracy_budget": sweep_budget,
                                           "target": "ethos-u55-128", "workers": args.workers,
                                           "measure_on": args.measure_on, "budget_from": args.budget_from,
                                           "projection": args.projection, "scales": args.scales,
                                           "drop_estimate": args.drop_estimate,
                                           **({"sparsities": [float(v) for v in args.sparsities.split(",")]}
                                              if args.sparsities else {}),
                                           **({"clusters": [int(v) for v in args.palette_clusters.split(",")]}
                                              if args.palette_clusters else {}),
                                           **({"size_budget": args.size_budget} if args.size_budget else {})},
             "training": {"qat_ranges": args.qat_ranges}}
    epochs = args.ic_epochs if key == "ic" and args.ic_epochs is not None else args.epochs
    overrides = {"epochs": epochs, "sparsity": args.sparsity, "clusters": args.clusters, "seed": seed}
    recipe = load_recipe(table=table, overrides=overrides)
    t0 = time.perf_counter()
    # One leaf at a time (shared nodes are trained once and reused), so that a leaf whose stage fails (e.g. a
    # TFMOT preservation failure) is reported as such while the others are still measured.
    leaves, failed, nodes = {}, {}, {}
    for leaf in sorted(run_leaves, key=lambda x: x == "pcqat"):  # pcqat last
        try:
            outcome = drive(Plan(args.data / model, args.data / data, out, replace(recipe, leaves=(leaf,)))).tree
        except EdgeDeployError as exc:
            failed[leaf] = exc.one_line()
            print(f"{key}: leaf {leaf} failed: {exc.one_line()}", flush=True)
            continue
        leaves.update(outcome.leaves)
        nodes.update(outcome.nodes)
    t_opt = time.perf_counter() - t0
    variants = [(leaf, out / rec.output("int8_model").path, rec.id) for leaf, rec in leaves.items()]
    t1 = time.perf_counter()
    ctx = RunContext.open(out)
    perf = compile_variants(ctx, variants, [get_target(t) for t in [*MAIN_TARGETS, FLASH_TARGET]],
                            CompileOptions(debug_db=True, jobs=2))
    size_ctx = RunContext.open(out / "optimise-size")
    size = compile_variants(size_ctx, variants, [get_target("ethos-u55-128")],
                            CompileOptions(optimise="Size", debug_db=True, jobs=2))
    t_comp = time.perf_counter() - t1
    baseline = nodes.get("baseline")
    paired, per_sample = paired_deltas(leaves, out, None if baseline is None else out / baseline.output("keras_model").path)
    comp = {(r.variant, r.target): r for r in perf.records}
    comp_size = {r.variant: r for r in size.records}
    rows = {}
    for leaf, rec in leaves.items():
        row = {"int8_accuracy": rec.metric("int8_accuracy"), "float_accuracy": rec.metric("float_accuracy"),
               "gzip_bytes": rec.metric("gzip_bytes"),
               "max_distinct_per_tensor": max((len_distinct(r) for r in rec.details.get("preservation", [])),
                                              default=None),
               **paired.get(leaf, {})}
        for t in MAIN_TARGETS:
            c = comp.get((leaf, t))
            row[t] = {"encoded_weights_bytes": _m(c, "encoded_weights_bytes"), "npu_cycles": _m(c, "npu_cycles"),
                      "total_cycles": _m(c, "total_cycles"), "weight_read_cycles": _m(c, "weight_read_cycles")}
        c = comp.get((leaf, "ethos-u85-256-flash"))
        row["ethos-u85-256-flash"] = {"encoded_weights_bytes": _m(c, "encoded_weights_bytes"),
                                      "npu_cycles": _m(c, "npu_cycles"), "total_cycles": _m(c, "total_cycles"),
                                      "weight_read_cycles": _m(c, "weight_read_cycles")}
        c = comp_size.get(leaf)
        row["ethos-u55-128 --optimise Size"] = {"encoded_weights_bytes": _m(c, "encoded_weights_bytes"),
                                                "npu_cycles": _m(c, "npu_cycles"), "total_cycles": _m(c, "total_cycles"),
                                                "weight_read_cycles": _m(c, "weight_read_cycles")}
        if rec.details.get("plan"):
            row["plan"] = rec.details["plan"]
        rows[leaf] = row
    sweep = next((nodes[n] for n in ("pruned_clustered_palette", "clustered_palette") if n in nodes), None)
    return {"title": title, "rows": rows, "failed": failed, "optimize_seconds": round(t_opt), "compile_seconds": round(t_comp),
            "sweep": None if sweep is None else {k: v for k, v in sweep.details.get("sweep", {}).items()
                                                 if k in ("measured_on", "checks", "seconds", "budget_points", "executor",
                                                          "points_per_nat", "projection", "drop_estimate",
                                                          "size")},
            "recipe": recipe.to_dict(), "per_sample_delta": per_sample}


def paired_points(diff) -> tuple[float, float]:
    """The mean of per-sample differences (1, 0 or -1 each, or their mean over seeds) and its standard error,
    in points."""
    import numpy as np

    return round(100 * float(diff.mean()), 3), round(100 * float(diff.std(ddof=1)) / np.sqrt(len(diff)), 3)


def _vs_float(row: dict) -> str:
    """A leaf's difference to the float baseline ± its paired SE, as a table cell."""
    return f"{row['delta_vs_float']:+.2f} ± {row['float_se']:.2f}" if row.get("delta_vs_float") is not None else "n/a"


def paired_deltas(leaves: dict, out: Path, baseline_model: Path | None = None) -> tuple[dict, dict]:
    """Per leaf: accuracy difference to ptq on the evaluation split and its paired standard error (points),
    and per leaf the per-sample differences (1: only the leaf right, -1: only ptq right) that give them.

    With ``baseline_model`` (the float Keras baseline) each leaf also gets its difference to the float model
    and its paired standard error (``delta_vs_float``, ``float_se``; per-sample differences under
    ``FLOAT + leaf``): int8 conversion alone moves accuracy on a small evaluation split by tenths of a point,
    either way, so the ptq leaf is a noisy reference of its own.
    """
    import numpy as np

    from edgedeploy.keras import tfenv
    from edgedeploy.tflite.convert import tflite_predict
    from edgedeploy.config.data import load_dataset

    if "ptq" not in leaves:
        return {}, {}
    info = leaves["ptq"].details["data"]
    data = load_dataset(Path(info["path"]), tuple(info["input_shape"]), len(info["labels"] or []) or 1000)

    def correct(rec) -> np.ndarray:
        outputs = tflite_predict((out / rec.output("int8_model").path).read_bytes(), data.x_eval)
        return (np.argmax(outputs.reshape(len(data.x_eval), -1), axis=-1) == data.y_eval).astype(np.float64)

    base = correct(leaves["ptq"])
    result, per_sample = {}, {}
    for leaf, rec in leaves.items():
        diff = correct(rec) - base
        per_sample[leaf] = diff
        delta, se = paired_points(diff)
        result[leaf] = {"delta_vs_ptq": delta, "delta_se": se, "eval_samples": int(len(diff))}
    if baseline_model is not None:
        model = tfenv.load().keras.models.load_model(baseline_model, compile=False)
        ref = (np.argmax(model.predict(data.x_eval, batch_size=256, verbose=0), axis=-1) == data.y_eval).astype(np.float64)
        for leaf in leaves:
            diff = per_sample[leaf] + base - ref
            per_sample[FLOAT + leaf] = diff
            result[leaf].update(zip(("delta_vs_float", "float_se"), paired_points(diff)))
    return result, per_sample


def summarize_seeds(runs: dict[int, dict], budget: float) -> tuple[str, dict]:
    """Over several seeds of one model: per leaf the mean accuracy difference to ptq, its standard error, and
    the mean encoded weights as a fraction of ptq's.

    Every seed is scored on the same evaluation samples, so the seeds' differences are not independent: the
    standard error is that of the per-sample difference averaged over the seeds (paired by sample).
    """
    import numpy as np

    seeds = sorted(runs)
    summary = {}
    for leaf in LEAVES:
        if not all(leaf in runs[s]["rows"] and leaf in runs[s]["per_sample_delta"] for s in seeds):
            continue
        diff = np.mean([runs[s]["per_sample_delta"][leaf] for s in seeds], axis=0)
        ratios = [runs[s]["rows"][leaf]["ethos-u55-128"]["encoded_weights_bytes"]
                  / runs[s]["rows"]["ptq"]["ethos-u55-128"]["encoded_weights_bytes"] for s in seeds]
        vs_float = (np.mean([runs[s]["per_sample_delta"][FLOAT + leaf] for s in seeds], axis=0)
                    if all(FLOAT + leaf in runs[s]["per_sample_delta"] for s in seeds) else None)
        summary[leaf] = {**dict(zip(("delta_vs_ptq", "delta_se"), paired_points(diff))),
                         **(dict(zip(("delta_vs_float", "float_se"), paired_points(vs_float)))
                            if vs_float is not None else {}),
                         "encoded_vs_ptq": round(float(np.mean(ratios)), 4),
                         "per_seed_delta": [runs[s]["rows"][leaf]["delta_vs_ptq"] for s in seeds],
                         "per_seed_encoded_vs_ptq": [round(r, 4) for r in ratios]}
    lines = [f"### {runs[seeds[0]]['title']}: mean over seeds {', '.join(map(str, seeds))}", "",
             "| leaf | Δ vs ptq ± paired SE (pt) | per seed Δ (pt) | Δ vs float baseline ± paired SE (pt) | "
             "U55-128 enc. weights vs ptq | per seed |",
             "|---|---|---|---|---|---|"]
    for leaf, r in summary.items():
        lines.append(f"| {leaf} | {r['delta_vs_ptq']:+.2f} ± {r['delta_se']:.2f} | "
                     f"{' / '.join(f'{d:+.2f}' for d in r['per_seed_delta'])} | {_vs_float(r)} | {r['encoded_vs_ptq']:.3f} | "
                     f"{' / '.join(f'{x:.3f}' for x in r['per_seed_encoded_vs_ptq'])} |")
    best = pick_best({leaf: r["delta_vs_ptq"] for leaf, r in summary.items()},
                     {leaf: r["encoded_vs_ptq"] for leaf, r in summary.items()}, budget)
    if best:
        b = summary[best]
        met = goal_met(b["encoded_vs_ptq"], b["delta_vs_ptq"], budget)
        lines += ["", f"best palette-aware leaf over the seeds: {best}: encoded weights {b['encoded_vs_ptq']:.3f} of ptq, "
                  f"int8 accuracy {b['delta_vs_ptq']:+.2f} ± {b['delta_se']:.2f} points against ptq; goal (≤ {GOAL_RATIO:.2f} "
                  f"of ptq at ≤ {budget} points lost): " + ("met" if met else "NOT met") + " on the mean"]
    return "\n".join(lines), {"seeds": seeds, "leaves": summary, "best_palette": best}


def len_distinct(row: dict) -> int | None:
    return row.get("distinct", row.get("unique"))


def pick_best(delta: dict, size: dict, budget: float) -> str | None:
    """The palette leaf with the smallest ``size`` among those within ``budget`` points of ptq (``delta``:
    accuracy difference to ptq), or, if none is, the one with the largest ``delta``."""
    cands = [leaf for leaf in PALETTE_LEAVES if leaf in delta]
    ok = [leaf for leaf in cands if delta[leaf] >= -budget]
    if ok:
        return min(ok, key=lambda leaf: size[leaf] if size[leaf] is not None else float("inf"))
    return max(cands, key=lambda leaf: delta[leaf], default=None)


def goal_met(ratio: float | None, delta: float, budget: float) -> bool:
    return ratio is not None and ratio <= GOAL_RATIO and delta >= -budget


def best_palette(rows: dict, budget: float) -> str | None:
    ptq = rows["ptq"]["int8_accuracy"]
    return pick_best({leaf: r["int8_accuracy"] - ptq for leaf, r in rows.items()},
                     {leaf: r["ethos-u55-128"]["encoded_weights_bytes"] for leaf, r in rows.items()}, budget)


def _delta(row: dict, ptq: dict) -> str:
    delta = row["int8_accuracy"] - ptq["int8_accuracy"]
    return f"{delta:+.2f}" + (f" ± {row['delta_se']:.2f}" if row.get("delta_se") is not None else "")


def render(result: dict, budget: float) -> str:
    rows = result["rows"]
    ptq = rows["ptq"]
    best = best_palette(rows, budget)
    lines = [f"### {result['title']}", "",
             *[f"leaf {leaf} FAILED: {why}" for leaf, why in result.get("failed", {}).items()],
             ("| leaf | int8 acc (%) | Δ vs ptq ± paired SE (pt) | Δ vs float ± paired SE (pt) | U55-128 enc. weights (B) | "
              "vs ptq | U55-128 NPU cycles | "
              "U85-256 enc. weights (B) | U85-256 NPU cycles | U55-128 Size: weight-read / total cycles | "
              "U85-256 flash: weight-read / total cycles | max distinct int8 / tensor |"),
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    base_w = ptq["ethos-u55-128"]["encoded_weights_bytes"]
    for leaf in LEAVES:
        if leaf not in rows:
            continue
        r = rows[leaf]
        u55, u85 = r["ethos-u55-128"], r["ethos-u85-256"]
        size, flash = r["ethos-u55-128 --optimise Size"], r["ethos-u85-256-flash"]
        ratio = "n/a" if not base_w or u55["encoded_weights_bytes"] is None else f"{u55['encoded_weights_bytes'] / base_w:.3f}"
        name = leaf + (" (best palette)" if leaf == best else "")
        lines.append(
            f"| {name} | {r['int8_accuracy']:.2f} | {_delta(r, ptq)} | {_vs_float(r)} | "
            f"{_fmt(u55['encoded_weights_bytes'])} | {ratio} | {_fmt(u55['npu_cycles'])} | "
            f"{_fmt(u85['encoded_weights_bytes'])} | {_fmt(u85['npu_cycles'])} | "
            f"{_fmt(size['weight_read_cycles'])} / {_fmt(size['total_cycles'])} | "
            f"{_fmt(flash['weight_read_cycles'])} / {_fmt(flash['total_cycles'])} | {_fmt(r['max_distinct_per_tensor'])} |")
    if best:
        b = rows[best]
        ratio = b["ethos-u55-128"]["encoded_weights_bytes"] / base_w if base_w else None
        drop = ptq["int8_accuracy"] - b["int8_accuracy"]
        met = goal_met(ratio, -drop, budget)
        lines += ["", f"best palette-aware leaf: {best}: encoded weights {_fmt(ratio, '.3f')} of ptq on ethos-u55-128, "
                  f"int8 accuracy {_delta(b, ptq)} points against ptq; goal (≤ {GOAL_RATIO:.2f} of ptq at ≤ {budget} points "
                  "lost): " + ("met" if met else "NOT met") + " on the point estimate"]
        pc = rows.get("pcqat")
        if pc:
            lines.append(f"TFMOT pcqat: encoded weights {pc['ethos-u55-128']['encoded_weights_bytes'] / base_w:.3f} of ptq, "
                         f"int8 accuracy {_delta(pc, ptq)} points against ptq")
    if result.get("sweep"):
        s = result["sweep"]
        lines.append(f"sweep: {s.get('seconds')} s, measured on {s.get('measured_on')}, "
                     f"{s.get('points_per_nat')} points per nat, joint checks {s.get('checks')}")
    lines.append(f"wall time: optimize {result['optimize_seconds']} s, compile {result['compile_seconds']} s "
                 "(stages reused from an earlier run of the same folder are not re-run)")
    return "\n".join(lines)


# --goal: the goal's check, one configuration for both models (the flash budget at the least estimated loss)
GOAL_PRESET = {"seeds": "0,1,2", "size_budget": GOAL_RATIO, "scales": "fitted", "leaves": "ptq,pcqat,pcqat_palette",
               "ic_epochs": 2}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--goal", action="store_true",
                    help="the goal's check: " + ", ".join(f"--{k.replace('_', '-')} {v}" for k, v in GOAL_PRESET.items())
                         + " (options given beside it win)")
    ap.add_argument("--models", default="kws,ic", help=f"comma-separated, of {','.join(MODELS)} (kws and ic: the goal's)")
    ap.add_argument("--leaves", default=DEFAULT_LEAVES,
                    help=f"comma-separated leaves to run, ptq among them (palette leaves: {', '.join(PALETTE_LEAVES)})")
    ap.add_argument("--epochs", type=int, default=None, help="fine-tuning epochs per stage (recipe default)")
    ap.add_argument("--ic-epochs", type=int, default=None, help="epochs per stage for ResNet-8 (default: --epochs)")
    ap.add_argument("--sparsity", type=float, default=None)
    ap.add_argument("--clusters", type=int, default=None)
    ap.add_argument("--seed", type=int, default=None)
    ap.add_argument("--seeds", default=None,
                    help="several seeds, e.g. 0,1,2: each runs into OUT/seedN, then the mean over them is printed")
    ap.add_argument("--budget", type=float, default=0.3, help="accuracy budget (points) of the sweep and the goal")
    ap.add_argument("--sparsities", default=None, help="extra-sparsity candidates of the sweep, e.g. 0,0.6,0.75")
    ap.add_argument("--palette-clusters", default=None, help="palette-size candidates of the sweep, e.g. 4,8,12,16,24")
    ap.add_argument("--budget-from", default="palette", choices=["parent", "palette"],
                    help="where the sweep's budget counts from ([palette] budget_from)")
    ap.add_argument("--measure-on", default="fine-tune", choices=["holdout", "fine-tune"],
                    help="samples the sweep measures accuracy drops on ([palette] measure_on)")
    ap.add_argument("--sweep-budget", type=float, default=None,
                    help="accuracy budget (points on the hold-out) of the sweep alone, before QAT (default: --budget)")
    ap.add_argument("--size-budget", type=float, default=None,
                    help="the sweep meets this fraction of the ptq leaf's encoded weights at the least estimated "
                         f"loss ([palette] size_budget; e.g. {GOAL_RATIO}) instead of the accuracy budget")
    ap.add_argument("--projection", default="gptq", choices=["gptq", "nearest"],
                    help="how kernels are snapped to their palettes ([palette] projection)")
    ap.add_argument("--scales", default="peak", choices=["peak", "fitted"],
                    help="each channel's int8 scale: its largest weight / 127, or fitted with clipping ([palette] scales)")
    ap.add_argument("--drop-estimate", default="loss", choices=["loss", "accuracy"],
                    help="how the sweep judges a drop ([palette] drop_estimate)")
    ap.add_argument("--qat-ranges", default="calibrated", choices=["calibrated", "tfmot"],
                    help="where QAT's activation ranges start ([training] qat_ranges)")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--no-search", action="store_true", help="no per-layer sweep: every layer at --clusters")
    ap.add_argument("--out", type=Path, default=Path("bench-palette-out"))
    ap.add_argument("--data", type=Path, default=REPO.parent / "shared" / "data")
    ap.add_argument("--markdown", action="store_true", help="start with a results page head (docs/results/)")
    if ap.parse_known_args()[0].goal:
        ap.set_defaults(**GOAL_PRESET)
    args = ap.parse_args()
    if args.goal and args.seed is not None and args.seeds == GOAL_PRESET["seeds"]:
        args.seeds = None  # --goal --seed N: that seed alone
    if "ptq" not in args.leaves.split(","):
        ap.error("--leaves needs ptq: every difference is measured against it")
    if args.markdown:
        from markdown_page import header

        print(header("Results: palette-aware leaves"), flush=True)
    print(f"machine: {os.cpu_count()} cores, load average {os.getloadavg()[0]:.2f} at start", flush=True)
    seeds = [int(v) for v in args.seeds.split(",")] if args.seeds else [args.seed]
    results = {}
    for key in args.models.split(","):
        runs, summary = {}, None
        for seed in seeds:
            out = args.out / f"seed{seed}" if args.seeds else args.out
            runs[seed] = run_model(key, args, seed, out)
            print(render(runs[seed], args.budget), flush=True)
            print(flush=True)
        if args.seeds:
            text, summary = summarize_seeds(runs, args.budget)
            print(text, flush=True)
            print(flush=True)
        stored = {s: {k: v for k, v in r.items() if k != "per_sample_delta"} for s, r in runs.items()}
        results[key] = ({"seeds": {str(s): r for s, r in stored.items()}, "summary": summary} if args.seeds
                        else stored[seeds[0]])
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "bench_palette.json").write_text(json.dumps(results, indent=1, default=str) + "\n")
    print(f"machine load average at the end: {os.getloadavg()[0]:.2f}; results: {args.out / 'bench_palette.json'}")


if __name__ == "__main__":
    main()
