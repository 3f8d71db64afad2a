"""The deployment tree on real models and data: the published collaborative-optimization table, measured here.

For the MLPerf Tiny DS-CNN (Speech Commands, fine-tune split -> eval split) and the MLPerf Tiny ResNet-8
(CIFAR-10 JPEG subset, x_train -> x_test) it runs `edgedeploy optimize` with the default recipe (or the
flags given) and prints, per leaf: float and int8 accuracy, TFLite and gzip bytes, gzip compression
against the ptq leaf, and the wall time of each stage on this machine.

Run: python bench/bench_tree.py [--models kws,ic] [--epochs N] [--out DIR] [--data ../shared/data]
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
MODELS = {
    "kws": ("MLPerf DS-CNN, Speech Commands eval split", "kws/dscnn_mlperf_float.h5", "kws/speech_commands_v2_test_mfcc_mlperf.npz"),
    "ic": ("MLPerf ResNet-8, CIFAR-10 x_test", "ic/resnet8_mlperf_float.h5", "ic/cifar10_jpeg_subset.npz"),
}


def table(title: str, outcome, timings: dict[str, float]) -> str:
    lines = [f"### {title}", "",
             "| leaf | float acc (%) | int8 acc (%) | Δ vs ptq (pt) | tflite (B) | gzip (B) | gzip compression vs ptq | stage time (s) |",
             "|---|---|---|---|---|---|---|---|"]
    base = outcome.leaves.get("ptq")
    for leaf, rec in outcome.leaves.items():
        fa, ia = rec.metric("float_accuracy"), rec.metric("int8_accuracy")
        tb, gz = rec.metric("tflite_bytes"), rec.metric("gzip_bytes")
        delta = f"{ia - base.metric('int8_accuracy'):+.2f}" if base else "n/a"
        comp = f"{100 * (1 - gz / base.metric('gzip_bytes')):.2f}%" if base else "n/a"
        node = rec.details["node"]
        lines.append(f"| {leaf} | {fa:.2f} | {ia:.2f} | {delta} | {tb:,} | {gz:,} | {comp} | "
                     f"{timings.get(node, 0):.0f} train + {rec.metric('convert_seconds'):.0f} convert |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", default="kws,ic")
    ap.add_argument("--epochs", type=int, default=None)
    ap.add_argument("--leaves", default=None)
    ap.add_argument("--out", type=Path, default=Path("bench-out"))
    ap.add_argument("--data", type=Path, default=REPO.parent / "shared" / "data")
    ap.add_argument("--markdown", action="store_true", help="start with a results page head (docs/results/)")
    args = ap.parse_args()
    if args.markdown:
        from markdown_page import header

        print(header("Results: the deployment tree"), flush=True)
    from edgedeploy.optimize import optimize
    from edgedeploy.recipe import load_recipe

    overrides = {"epochs": args.epochs, "leaves": args.leaves.split(",") if args.leaves else None}
    recipe = load_recipe(overrides=overrides)
    print(f"recipe: {json.dumps(recipe.to_dict())}")
    for key in args.models.split(","):
        title, model, data = MODELS[key]
        t0 = time.perf_counter()
        outcome = optimize(args.data / model, args.data / data, args.out / key, recipe)
        timings = {n: r.metric("train_seconds") or 0.0 for n, r in outcome.nodes.items()}
        print(table(title, outcome, timings))
        print(f"\nwall time: {time.perf_counter() - t0:.0f} s (stages reused from {args.out / key} are not re-run)\n")


if __name__ == "__main__":
    main()
