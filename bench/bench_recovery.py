"""Accuracy recovery with little fine-tuning data: edgedeploy's default fine-tuning next to TFMOT's plain recipe.

For the MLPerf Tiny DS-CNN (Speech Commands: the 3,066-clip fine-tune split -> the 1,824-clip eval split) it
runs the whole deployment tree twice, with edgedeploy's defaults (distillation from the float model, gradual
pruning, warm-up + cosine learning rate, frozen batch norm, best epoch on a hold-out slice of the fine-tune
split) and with `plain = true` (TFMOT's plain recipe: one-shot 50% ConstantSparsity, Adam 1e-4, batch 64,
4 epochs per stage, labels only), compiles every leaf with Vela for Ethos-U55-128 and prints per leaf: int8
accuracy on the eval split, the change against the ptq leaf, and Vela's encoded weight bytes. An ablation
then turns each technique off in turn (the defaults minus one) for the chain behind the pruned and pcqat
leaves. The same leaf table follows for the MLPerf Tiny ResNet-8 (CIFAR-10 JPEG subset, x_train -> x_test).

Stage folders are reused on a re-run with the same settings; each table gives the time the stages took when
they ran (from the manifest), and the machine's load while this script ran.

Run: python bench/bench_recovery.py [--models kws,ic] [--ic-epochs N] [--ablation-leaves pruned,pcqat] [--out DIR]
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
MODELS = {
    "kws": ("MLPerf Tiny DS-CNN, Speech Commands v0.02: fine-tune split (split == 0, 3,066 clips) -> eval split "
            "(split == 1, 1,824 clips)", "kws/dscnn_mlperf_float.h5", "kws/speech_commands_v2_test_mfcc_mlperf.npz"),
    "ic": ("MLPerf Tiny ResNet-8, CIFAR-10 JPEG subset: x_train (10,000 images) -> x_test (10,000 images)",
           "ic/resnet8_mlperf_float.h5", "ic/cifar10_jpeg_subset.npz"),
}
TARGET = "ethos-u55-128"
# The defaults minus one technique each: folder -> (row, flags, recipe tables).
ABLATIONS = {
    "distillation": ("- distillation (labels only)", {}, {"distillation": {"enabled": False}}),
    "gradual": ("- gradual pruning (one-shot ConstantSparsity)", {}, {"pruning": {"schedule": "constant"}}),
    "warm-up_cosine": ("- warm-up/cosine learning rate (constant)", {},
                       {"training": {"lr_schedule": "constant", "warmup_fraction": 0.0}}),
    "frozen": ("- frozen batch-norm statistics (trained)", {}, {"training": {"freeze_batch_norm": False}}),
    "hold-out": ("- hold-out selection and early stop (all samples train)", {},
                 {"selection": {"validation_fraction": 0.0}}),
    "larger": ("- step size (Adam 1e-4, batch 64 instead of 5e-4, batch 32)", {"learning_rate": 1e-4, "batch_size": 64},
               {}),
}


def load() -> str:
    one, five, fifteen = os.getloadavg()
    return f"load average {one:.2f} / {five:.2f} / {fifteen:.2f} (1/5/15 min) on {os.cpu_count()} cores"


def run_tree(model: Path, data: Path, out: Path, overrides: dict, table: dict):
    """optimize + Vela on every leaf; returns (outcome, {leaf: encoded weight bytes}, stage seconds, wall)."""
    from edgedeploy.pipeline.compile import CompileOptions, compile_variants, resolve_targets
    from edgedeploy.pipeline.driver import drive
    from edgedeploy.pipeline.run_plan import Plan
    from edgedeploy.config.recipe import load_recipe
    from edgedeploy.core.stage import RunContext

    recipe = load_recipe(overrides=overrides, table=table)
    t0 = time.perf_counter()
    outcome = drive(Plan(model, data, out, recipe)).tree
    wall = time.perf_counter() - t0
    ctx = RunContext.open(out)
    variants = [(leaf, ctx.manifest.resolve(r.output("int8_model")), r.id) for leaf, r in outcome.leaves.items()]
    compiled = compile_variants(ctx, variants, resolve_targets([TARGET]), CompileOptions())
    encoded = {r.variant: r.metric("encoded_weights_bytes") for r in compiled.records}
    stage_seconds = sum(r.seconds or 0.0 for r in [*outcome.nodes.values(), *outcome.leaves.values()])
    return outcome, encoded, stage_seconds, wall


def _acc(outcome, leaf):
    rec = outcome.leaves.get(leaf)
    return None if rec is None else rec.metric("int8_accuracy")


def _fmt(v, spec):
    return "n/a" if v is None else format(v, spec)


def leaf_table(runs: dict[str, tuple], leaves: list[str]) -> str:
    names = list(runs)
    head = "| leaf | " + " | ".join(f"{n}: int8 acc (%) | {n}: Δ vs ptq (pt) | {n}: encoded weights (B)"
                                     for n in names) + " |"
    lines = [head, "|---|" + "---|---|---|" * len(names)]
    for leaf in leaves:
        cells = []
        for n in names:
            outcome, encoded, *_ = runs[n]
            acc, base = _acc(outcome, leaf), _acc(outcome, "ptq")
            delta = None if acc is None or base is None else acc - base
            enc, enc_base = encoded.get(leaf), encoded.get("ptq")
            ratio = f" ({enc / enc_base:.2f}×)" if enc and enc_base else ""
            cells += [_fmt(acc, ".2f"), _fmt(delta, "+.2f"), (f"{enc:,}" if enc else "n/a") + ratio]
        lines.append(f"| {leaf} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def times(runs: dict[str, tuple]) -> str:
    return "\n".join(f"- {n}: stages {seconds:.0f} s (when they ran), this call {wall:.0f} s"
                     for n, (_, _, seconds, wall) in runs.items())


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", default="kws,ic")
    ap.add_argument("--out", type=Path, default=Path("bench-out/recovery"))
    ap.add_argument("--data", type=Path, default=REPO.parent / "shared" / "data")
    ap.add_argument("--ablation-leaves", default="pruned,pcqat", help="leaves of the ablation (comma-separated; '' skips it)")
    ap.add_argument("--ic-epochs", type=int, default=2, help="epochs per stage for ResNet-8 (both recipes)")
    ap.add_argument("--markdown", action="store_true", help="start with a results page head (docs/results/)")
    args = ap.parse_args()
    if args.markdown:
        from markdown_page import header

        print(header("Results: recovery, edgedeploy defaults against TFMOT's plain recipe"), flush=True)
    from edgedeploy.config.recipe import Recipe

    leaves = list(Recipe().leaves)
    print(f"machine: {load()} at start\n")
    for key in args.models.split(","):
        title, model, data = MODELS[key]
        model, data = args.data / model, args.data / data
        epochs = {"epochs": args.ic_epochs} if key == "ic" else {}
        runs = {
            "edgedeploy defaults": run_tree(model, data, args.out / key / "defaults", dict(epochs), {}),
            "TFMOT plain": run_tree(model, data, args.out / key / "plain", {"plain": True, **epochs}, {}),
        }
        print(f"### {title}\n")
        if epochs:
            print(f"{args.ic_epochs} epochs per stage for both recipes (the plain recipe's 4 would take too long on "
                  "this machine); accuracy on x_test.\n")
        else:
            print("4 epochs per stage for both recipes; accuracy on the eval split.\n")
        print(leaf_table(runs, leaves))
        print(f"\nEncoded weights: Vela {TARGET}, encoded_weights_bytes (ratio to the ptq leaf).")
        print("Whole tree (optimize + convert of all leaves, not Vela):\n" + times(runs) + f"\n- {load()}\n")
        ablation_leaves = [l for l in args.ablation_leaves.split(",") if l]
        if key == "kws" and ablation_leaves:
            rows = []
            base = runs["edgedeploy defaults"]
            for folder, (name, overrides, table) in ABLATIONS.items():
                outcome, encoded, seconds, _ = run_tree(model, data, args.out / key / f"minus-{folder}",
                                                        {"leaves": ["ptq", *ablation_leaves], **overrides}, table)
                rows.append((name, outcome, encoded, seconds))
            print("#### Ablation: the defaults minus one technique\n")
            head = "| recipe | " + " | ".join(f"{l}: int8 acc (%) | {l}: Δ vs ptq (pt) | {l}: encoded (B)"
                                             for l in ablation_leaves) + " | stages (s) |"
            print(head + "\n|---|" + "---|---|---|" * len(ablation_leaves) + "---|")
            chain = base[2]
            for name, outcome, encoded, seconds in [("edgedeploy defaults", base[0], base[1], chain), *rows,
                                                    ("TFMOT plain", *runs["TFMOT plain"][:3])]:
                cells = []
                for leaf in ablation_leaves:
                    acc, ptq = _acc(outcome, leaf), _acc(outcome, "ptq")
                    cells += [_fmt(acc, ".2f"), _fmt(None if acc is None else acc - ptq, "+.2f"),
                              f"{encoded[leaf]:,}" if encoded.get(leaf) else "n/a"]
                timing = f"{seconds:.0f}" + (" (whole tree)" if name in ("edgedeploy defaults", "TFMOT plain") else "")
                print(f"| {name} | " + " | ".join(cells) + f" | {timing} |")
            print(f"\n(ablation rows train only the chain behind {', '.join(ablation_leaves)}; {load()})\n")


if __name__ == "__main__":
    main()
