"""The deployment tree on real models and data: the published collaborative-optimization table, measured here.

For the MLPerf Tiny DS-CNN (Speech Commands, fine-tune split -> eval split) and the MLPerf Tiny ResNet-8
(CIFAR-10 JPEG subset, x_train -> x_test) it runs `edgedeploy optimize` with the default recipe (or the
flags given) and prints, per leaf: float and int8 accuracy, TFLite and gzip bytes, gzip compression
against the ptq leaf, and the wall time of each stage on this machine.

``--models ad`` is a model that is not a classifier: an MLPerf Tiny AD-style Dense autoencoder (490 -> 128 ->
128 -> 8 -> 128 -> 128 -> 490, batch norms, linear output), trained here for ``--ad-epochs`` on the MFCC
features of six Speech Commands classes (seeded choice, standardized on their fine-tune clips), the other
classes being its anomalies (``y_anomaly`` of the evaluation split). The data file holds no targets, so the tree
trains it as reconstruction; per leaf it prints float and int8 MSE, Δ MSE vs ptq, the ROC AUC of the
reconstruction error, gzip bytes and Vela-encoded weight bytes (``--target``, default ethos-u55-128).

Run: python bench/bench_tree.py [--models kws,ic,ad] [--epochs N] [--out DIR] [--data ../shared/data] [--markdown]
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


AD_UNITS = (128, 128, 8, 128, 128)


def ad_model_and_data(data: Path, out: Path, epochs: int, seed: int = 0) -> tuple[Path, Path]:
    """The autoencoder (trained, saved without its compile config) and its inputs-only data file."""
    import numpy as np

    from edgedeploy.keras import tfenv

    out.mkdir(parents=True, exist_ok=True)
    d = np.load(data / "kws" / "speech_commands_v2_test_mfcc_mlperf.npz")
    x, y, split = d["x"].reshape(len(d["x"]), -1).astype(np.float32), d["y"], d["split"]
    is_normal = np.isin(y, np.random.default_rng(seed).choice(np.unique(y), 6, replace=False))
    keep, fit = (split == 1) | ((split == 0) & is_normal), (split == 0) & is_normal
    mu, sd = x[fit].mean(axis=0), x[fit].std(axis=0) + 1e-6
    data_path = out / "ad.npz"
    np.savez(data_path, x=((x - mu) / sd)[keep], split=split[keep], y_anomaly=(~is_normal[keep]).astype(np.int64))
    env = tfenv.load()
    tfenv.set_seed(seed)
    keras = env.keras
    xs = ((x - mu) / sd)[fit]
    inp = keras.Input((xs.shape[1],))
    h = inp
    for n in AD_UNITS:
        h = keras.layers.ReLU()(keras.layers.BatchNormalization()(keras.layers.Dense(n)(h)))
    model = keras.Model(inp, keras.layers.Dense(xs.shape[1])(h))
    model.compile(keras.optimizers.Adam(1e-3), "mse")
    model.fit(xs, xs, epochs=epochs, batch_size=64, verbose=0)
    plain = keras.models.clone_model(model)
    plain.set_weights(model.get_weights())
    model_path = out / "autoencoder.h5"
    plain.save(model_path, include_optimizer=False)
    return model_path, data_path


def task_table(title: str, outcome, target: str, markdown: bool) -> str:
    """Per leaf: float and int8 metric, Δ vs ptq, ROC AUC, gzip and Vela-encoded weight bytes."""
    from edgedeploy.core.manifest import Manifest

    compiles = {r.variant: r for r in Manifest.load(outcome.run_dir).find(stage="compile", target=target)
                if r.status == "ok"}
    spec = next(iter(outcome.leaves.values())).details["metric"]
    key = spec["key"]
    head = ["leaf", f"float {key}", f"int8 {key}", f"Δ {key} vs ptq", "float AUC (%)", "int8 AUC (%)", "gzip (B)",
            f"Vela-encoded weights (B, {target})"]
    base = outcome.leaves.get("ptq")
    rows = []
    for leaf, rec in outcome.leaves.items():
        f, i = rec.metric(f"float_{key}"), rec.metric(f"int8_{key}")
        delta = f"{i - base.metric(f'int8_{key}'):+.4g}" if base else "n/a"
        enc = compiles[leaf].metric("encoded_weights_bytes") if leaf in compiles else None
        fa, ia = rec.metric("float_auc"), rec.metric("int8_auc")
        rows.append([leaf, f"{f:.4g}", f"{i:.4g}", delta, "n/a" if fa is None else f"{fa:.2f}",
                     "n/a" if ia is None else f"{ia:.2f}", f"{rec.metric('gzip_bytes'):,}",
                     "n/a" if enc is None else f"{int(enc):,}"])
    direction = "lower is better" if not spec["higher_is_better"] else "higher is better"
    if markdown:
        lines = [f"### {title} ({key}: {direction})", "", "| " + " | ".join(head) + " |",
                 "|" + "---|" * len(head)]
        lines += ["| " + " | ".join(r) + " |" for r in rows]
    else:
        widths = [max(len(str(x)) for x in col) for col in zip(head, *rows)]
        lines = [f"{title} ({key}: {direction})"]
        lines += ["  ".join(str(x).rjust(w) for x, w in zip(r, widths)) for r in [head, *rows]]
    return "\n".join(lines)


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
    ap.add_argument("--ad-epochs", type=int, default=8, help="epochs the float autoencoder (--models ad) trains")
    ap.add_argument("--target", default="ethos-u55-128", help="Vela target of the encoded bytes (--models ad)")
    ap.add_argument("--markdown", action="store_true", help="start with a results page head (docs/results/); "
                    "Markdown tables")
    args = ap.parse_args()
    if args.markdown:
        from markdown_page import header

        print(header("Results: the deployment tree"), flush=True)
    from edgedeploy.pipeline.driver import drive
    from edgedeploy.pipeline.run_plan import Plan
    from edgedeploy.config.recipe import load_recipe

    overrides = {"epochs": args.epochs, "leaves": args.leaves.split(",") if args.leaves else None}
    recipe = load_recipe(overrides=overrides)
    print(f"recipe: {json.dumps(recipe.to_dict())}")
    for key in args.models.split(","):
        if key == "ad":
            from edgedeploy.pipeline.compile import compile_run

            t0 = time.perf_counter()
            ad_recipe = load_recipe(overrides={**overrides, "leaves": (args.leaves.split(",") if args.leaves else
                                                                        ["ptq", "qat", "pruned", "pqat", "pcqat"])})
            model_path, data_path = ad_model_and_data(args.data, args.out / "ad_input", args.ad_epochs)
            outcome = drive(Plan(model_path, data_path, args.out / key, ad_recipe)).tree
            compile_run(outcome.run_dir, [args.target])
            print(task_table("MLPerf Tiny AD-style autoencoder, Speech Commands MFCC (6 normal classes), eval split",
                             outcome, args.target, args.markdown))
            print(f"\nwall time: {time.perf_counter() - t0:.0f} s\n")
            continue
        title, model, data = MODELS[key]
        t0 = time.perf_counter()
        outcome = drive(Plan(args.data / model, args.data / data, args.out / key, recipe)).tree
        timings = {n: r.metric("train_seconds") or 0.0 for n, r in outcome.nodes.items()}
        print(table(title, outcome, timings))
        print(f"\nwall time: {time.perf_counter() - t0:.0f} s (stages reused from {args.out / key} are not re-run)\n")


if __name__ == "__main__":
    main()
