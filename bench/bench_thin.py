"""Thinned leaves against ptq: accuracy, MACs, NPU and total cycles and Vela-encoded weights on each target.

Per model (--models, default kws: the MLPerf DS-CNN, Speech Commands fine-tune split 0 -> eval split 1; ic: the
MLPerf ResNet-8, CIFAR-10 JPEG subset x_train -> x_test), `edgedeploy optimize` builds the leaves (--leaves,
default ptq,thinned,thinned_pcqat) with the thinned widths chosen on --thin-targets for --speedup, each leaf is
compiled with Vela 5.2 (--optimise Performance) for --targets, and the bench prints per leaf and target: int8
accuracy on the evaluation split, its difference to ptq with the paired standard error (the same samples scored
by both int8 models), MACs, NPU cycles, total cycles and encoded weight bytes, each also as a ratio to ptq's.

Run: python bench/bench_thin.py [--models kws] [--leaves ptq,thinned,thinned_pcqat] [--thin-epochs 30]
     [--epochs 4] [--speedup 0.75] [--thin-augment none] [--patience 0] [--pattern unstructured]
     [--prune-lr R] [--thin-lr R] [--prune-end-fraction F] [--label-weight W] [--skip-layers L1,L2]
     [--thin-trials 0] [--thin-trial-epochs 2]
     [--thin-targets ethos-u55-128] [--targets ethos-u55-128,ethos-u65-256,ethos-u85-256] [--seed 0]
     [--out DIR] [--markdown] [--json FILE]
Training runs on the CPU; Vela's cycle estimates are deterministic.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "bench"))
from bench_palette import MODELS, paired_deltas  # noqa: E402  (the same models and paired statistics)

KEYS = ("macs", "npu_cycles", "total_cycles", "encoded_weights_bytes")


def _compile(out: Path, leaves: dict, targets: list[str]) -> dict:
    from edgedeploy.pipeline.compile import CompileOptions, compile_variants
    from edgedeploy.core.stage import RunContext
    from edgedeploy.config.targets import get_target

    variants = [(leaf, out / rec.output("int8_model").path, rec.id) for leaf, rec in leaves.items()]
    outcome = compile_variants(RunContext.open(out), variants, [get_target(t) for t in targets],
                               CompileOptions(jobs=1, allow_cpu_ops=True))
    return {(r.variant, r.target): r for r in outcome.records}


def model_part(key: str, args) -> dict:
    from edgedeploy.errors import EdgeDeployError
    from edgedeploy.pipeline.driver import drive
    from edgedeploy.pipeline.run_plan import Plan
    from edgedeploy.config.recipe import load_recipe

    title, model, data = MODELS[key]
    targets = args.targets.split(",")
    recipe = load_recipe(
        overrides={"epochs": args.epochs, "seed": args.seed, "sparsity_pattern": args.pattern,
                   "thin_speedup": args.speedup, "thin_targets": tuple(args.thin_targets.split(",")),
                   "stage_epochs": {"thin": args.thin_epochs}, "patience": args.patience,
                   "thin_augment": args.thin_augment, "pruning_end_fraction": args.prune_end_fraction,
                   "stage_learning_rates": {**({"prune": args.prune_lr} if args.prune_lr else {}),
                                            **({"thin": args.thin_lr} if args.thin_lr else {})},
                   "skip_layers": tuple(n for n in args.skip_layers.split(",") if n),
                   "thin_trials": args.thin_trials, "thin_trial_epochs": args.thin_trial_epochs,
                   **({"distill_label_weight": args.label_weight} if args.label_weight is not None else {})})
    out = args.out / key / args.pattern.replace(":", "of")
    done, failed, nodes = {}, {}, {}
    for leaf in args.leaves.split(","):  # one leaf at a time: one that fails is reported, the others measured
        try:
            outcome = drive(Plan(args.data / model, args.data / data, out, _with(recipe, leaf))).tree
        except EdgeDeployError as exc:
            failed[leaf] = exc.one_line()
            print(f"{out}: leaf {leaf} failed: {exc.one_line()}", file=sys.stderr, flush=True)
            continue
        done.update(outcome.leaves)
        nodes.update(outcome.nodes)
    comp = _compile(out, done, targets)
    paired, _ = paired_deltas(done, out)
    rows = {}
    for leaf, rec in done.items():
        row = {"int8_accuracy": rec.metric("int8_accuracy"), **paired.get(leaf, {})}
        for t in targets:
            c = comp.get((leaf, t))
            row[t] = {k: None if c is None else c.metric(k) for k in KEYS}
        rows[leaf] = row
    base = rows.get("ptq", {})
    for row in rows.values():
        for t in targets:
            for k in KEYS:
                b, v = (base.get(t) or {}).get(k), row[t].get(k)
                row[t][f"{k}_vs_ptq"] = round(v / b, 3) if b and v is not None else None
    thinning = (nodes.get("thinned").details.get("thinning") if nodes.get("thinned") else None) or {}
    return {"key": key, "title": title, "run_dir": str(out), "leaves": rows, "failed": failed, "targets": targets,
            "widths": thinning.get("widths"), "full_widths": thinning.get("full_widths"),
            "held_on": (thinning.get("npu") or {}).get("held_on"), "trials": thinning.get("trials"),
            "thin_seconds": nodes["thinned"].metric("train_seconds") if "thinned" in nodes else None}


def recovery_part(part: dict, args) -> dict:
    """Before any fine-tuning, at the thinned widths found: float accuracy on the evaluation split with the
    channels chosen by each rule, with and without the least-squares refit of the layers that read them."""
    import numpy as np

    from edgedeploy.keras import tfenv
    from edgedeploy.config.data import load_dataset
    from edgedeploy.keras.channel_surgery import channel_groups, thin_model
    from edgedeploy.optimize.techniques.thin_recover import channel_scores, outputs, refit, top_channels

    keras = tfenv.load().keras
    if not part.get("widths"):
        return {}
    base = keras.models.load_model(Path(part["run_dir"]) / "optimize" / "baseline" / "model.h5", compile=False)
    _title, _model, data_file = MODELS[part["key"]]
    data = load_dataset(args.data / data_file, tuple(base.input_shape[1:]), int(base.output_shape[-1]))
    rng = np.random.default_rng(args.seed)
    x_fit = data.x_fit[rng.choice(len(data.x_fit), min(500, len(data.x_fit)), replace=False)]
    graph = channel_groups(base)
    energy = channel_scores(base, graph, x_fit)
    l1_bn = {}
    order = [layer.name for layer in base.layers]
    for g, group in graph.thinnable().items():  # L1 norm of each filter times its batch norm's |gamma / sigma|
        k = base.get_layer(g).get_weights()[0]
        score = np.abs(k.reshape(-1, k.shape[-1])).sum(axis=0)
        after = sorted((c for c in graph.channelwise if graph.kinds[c] == "BatchNormalization"
                        and graph.inputs[c][0][1][0][0] == graph.layouts[g][1][0][0]), key=order.index)
        if after:
            bn = base.get_layer(after[0])
            gamma = bn.gamma.numpy() if bn.scale else np.ones(group.size)
            score = score * np.abs(gamma) / np.sqrt(bn.moving_variance.numpy() + bn.epsilon)
        l1_bn[g] = score
    y = data.y_eval
    out = {"full": round(100 * float(np.mean(np.argmax(outputs(base, data.x_eval), -1) == y)), 2)}
    for rule, scores in (("energy", energy), ("l1_bn", l1_bn)):
        keep = {g: top_channels(scores[g], w) for g, w in part["widths"].items() if w < part["full_widths"][g]}
        for fitted in (False, True):
            model = thin_model(base, graph, keep)
            if fitted:
                refit(base, model, graph, keep, x_fit, seed=args.seed)
            acc = float(np.mean(np.argmax(outputs(model, data.x_eval), -1) == y))
            out[f"{rule}{'+refit' if fitted else ''}"] = round(100 * acc, 2)
    return out


def _with(recipe, leaf):
    from dataclasses import replace

    return replace(recipe, leaves=(leaf,))


def _f(v, spec=",.0f"):
    return "n/a" if v is None else format(v, spec)


def render(doc: dict, markdown: bool) -> str:
    lines = []

    def table(header, rows):
        from markdown_page import table as table_lines

        lines.extend(table_lines(header, rows, markdown))

    for key, part in doc["models"].items():
        lines.append(f"{'### ' if markdown else ''}{part['title']}: {doc['pattern']} pruning, thinned for "
                     f"{doc['speedup']}x NPU cycles held on {part['held_on']}, seed {doc['seed']}")
        lines.append("")
        if part.get("widths"):
            lines.append("Thinned widths: " + ", ".join(f"{g} {w}/{part['full_widths'][g]}"
                                                        for g, w in part["widths"].items()))
            lines.append("")
        for i, trial in enumerate(part.get("trials") or []):
            versus = trial.get("vs_search")
            lines.append(f"Trial {i + 1} ({trial['epochs']} epochs, {trial['seconds']:.0f} s): hold-out loss "
                         f"{trial['hold_out_loss']:.4f}, accuracy {_f(trial.get('hold_out_accuracy'), '.1f')}% at "
                         + ", ".join(f"{g} {w}" for g, w in trial["widths"].items())
                         + (f"; vs the search's {versus['difference']:+.4f} ± {versus['se']:.4f}" if versus
                            else " (the search's)")
                         + (" (kept)" if trial["widths"] == part["widths"] else ""))
        if part.get("trials"):
            lines.append("")
        header = ["leaf", "target", "int8 acc %", "Δ vs ptq (pt) ± SE", "MACs", "× ptq", "NPU cycles", "× ptq",
                  "total cycles", "× ptq", "enc. weights B", "× ptq"]
        rows = []
        for leaf in doc["leaves"]:
            r = part["leaves"].get(leaf)
            if r is None:
                rows.append([leaf, "", "failed: " + part["failed"].get(leaf, "not run")] + [""] * 9)
                continue
            for t in part["targets"]:
                c = r[t]
                rows.append([leaf, t, _f(r["int8_accuracy"], ".2f"),
                             f"{_f(r.get('delta_vs_ptq'), '+.2f')} ± {_f(r.get('delta_se'), '.2f')}",
                             *[x for k in KEYS for x in (_f(c[k]), _f(c[f"{k}_vs_ptq"], ".3f"))]])
        table(header, rows)
        before = part.get("before_fine_tuning")
        if before:
            lines.append("Float accuracy (%) on the evaluation split at these widths before fine-tuning, by channel "
                         "choice: " + ", ".join(f"{k} {v:.2f}" for k, v in before.items()))
            lines.append("")
    lines.append(f"Command: {doc['command']}")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", default="kws")
    ap.add_argument("--leaves", default="ptq,thinned,thinned_pcqat")
    ap.add_argument("--epochs", type=int, default=4, help="epochs of the prune, cluster and QAT stages")
    ap.add_argument("--thin-epochs", type=int, default=30, help="epochs of the thinned node's fine-tuning")
    ap.add_argument("--speedup", type=float, default=0.75)
    ap.add_argument("--thin-augment", default="none", choices=("none", "hflip"),
                    help="thin_augment: extra fine-tuning samples of the thinned node")
    ap.add_argument("--patience", type=int, default=0, help="hold-out epochs without improvement before a stage "
                    "stops (0: never; the best epoch is still kept)")
    ap.add_argument("--pattern", default="unstructured", choices=("unstructured", "2:4"))
    ap.add_argument("--prune-end-fraction", type=float, default=0.6,
                    help="pruning.end_fraction: share of the prune stage's steps after which the target is reached")
    ap.add_argument("--prune-lr", type=float, default=0.0,
                    help="[stages.prune] learning_rate (0: the recipe's learning_rate)")
    ap.add_argument("--thin-lr", type=float, default=0.0,
                    help="[stages.thin] learning_rate (0: the recipe's learning_rate)")
    ap.add_argument("--label-weight", type=float, default=None,
                    help="distillation's weight of the labels against the float model's outputs (default: the "
                         "recipe's)")
    ap.add_argument("--thin-trials", type=int, default=0, help="width choices fine-tuned briefly before the "
                    "thinned node's fine-tuning (the recipe's thin_trials)")
    ap.add_argument("--thin-trial-epochs", type=int, default=2, help="epochs of each trial (thin_trial_epochs)")
    ap.add_argument("--skip-layers", default="", help="comma-separated layers left unpruned (the recipe's "
                    "skip_layers; under 2:4 they stay dense, and the widths are chosen with them dense)")
    ap.add_argument("--thin-targets", default="ethos-u55-128")
    ap.add_argument("--targets", default="ethos-u55-128,ethos-u65-256,ethos-u85-256")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--data", type=Path, default=REPO.parent / "shared" / "data")
    ap.add_argument("--out", type=Path, default=Path("bench-out") / "thin")
    ap.add_argument("--markdown", action="store_true")
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args(argv)
    doc = {"seed": args.seed, "pattern": args.pattern, "speedup": args.speedup, "leaves": args.leaves.split(","),
           "command": "python bench/bench_thin.py " + " ".join(argv if argv is not None else sys.argv[1:]),
           "models": {k: model_part(k, args) for k in args.models.split(",") if k}}
    for part in doc["models"].values():
        part["before_fine_tuning"] = recovery_part(part, args)
    if args.json:
        args.json.write_text(json.dumps(doc, indent=1))
    print(render(doc, args.markdown))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
