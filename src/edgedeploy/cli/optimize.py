"""`edgedeploy optimize`: the deployment tree on a Keras model and real data."""

from __future__ import annotations

from pathlib import Path
from typing import List, Optional

import typer

EXAMPLE = "Example: edgedeploy optimize model.h5 --data data.npz -o out --leaves ptq,pcqat"


def register(app: typer.Typer) -> None:
    app.command("optimize", epilog=EXAMPLE)(optimize_cmd)


def optimize_cmd(
    model: Path = typer.Argument(..., help="Keras model (.h5 or .keras; saved by tf_keras, or by Keras 3 and rebuilt in tf_keras)."),
    data: Path = typer.Option(..., "--data", "-d", help=".npz with x, y, split (0 fine-tune, 1 eval) or x_train/y_train/x_test/y_test; "
                              "or a folder with a subfolder of images or WAV files per class (optionally under train/ and test/)."),
    out: Path = typer.Option(Path("edgedeploy-out"), "--out", "-o", help="Run folder (manifest and outputs)."),
    recipe: Optional[Path] = typer.Option(None, "--recipe", help="Recipe TOML (flags below override it)."),
    leaves: Optional[str] = typer.Option(None, "--leaves", help="Comma-separated leaves, e.g. ptq,pcqat (default: all)."),
    sparsity: Optional[float] = typer.Option(None, "--sparsity", help="Target sparsity of pruned layers (default 0.5)."),
    sparsity_pattern: Optional[str] = typer.Option(
        None, "--sparsity-pattern", help="unstructured (default) or 2:4: two zeros in every four input channels, "
        "which Ethos-U85 skips (pruned, pqat, pruned_clustered, pcqat and palette leaves)."),
    clusters: Optional[int] = typer.Option(None, "--clusters", help="Clusters per weight tensor (default 16)."),
    per_channel_clusters: Optional[bool] = typer.Option(None, "--per-channel-clusters/--per-tensor-clusters",
                                                        help="Cluster Conv2D kernels per output channel."),
    epochs: Optional[int] = typer.Option(None, "--epochs", help="Fine-tuning epochs per stage (default 4)."),
    batch_size: Optional[int] = typer.Option(None, "--batch-size", help="Training batch size (default 32)."),
    learning_rate: Optional[float] = typer.Option(None, "--learning-rate",
                                                  help="Peak Adam learning rate (default 5e-4; --plain: 1e-4)."),
    seed: Optional[int] = typer.Option(None, "--seed", help="Random seed (default 0)."),
    plain: Optional[bool] = typer.Option(None, "--plain", help="TFMOT's plain fine-tuning recipe: no distillation, "
                                         "one-shot sparsity, constant learning rate, batch norm trained, no hold-out "
                                         "(flags and recipe keys given still win)."),
    distill: Optional[bool] = typer.Option(None, "--distill/--no-distill",
                                           help="Learn the float model's outputs as well as the labels (default on)."),
    pruning_schedule: Optional[str] = typer.Option(
        None, "--pruning-schedule", help="polynomial (sparsity ramps up over the first stage, default) or constant "
        "(one-shot)."),
    lr_schedule: Optional[str] = typer.Option(None, "--lr-schedule", help="cosine (with warm-up, default) or constant."),
    freeze_batch_norm: Optional[bool] = typer.Option(None, "--freeze-batch-norm/--train-batch-norm",
                                                     help="Keep batch-norm statistics fixed while fine-tuning (default on)."),
    validation_fraction: Optional[float] = typer.Option(
        None, "--validation-fraction", help="Fine-tune samples held out to pick each stage's best epoch and stop early "
        "(default 0.1; 0 turns selection off)."),
    patience: Optional[int] = typer.Option(None, "--patience", help="Stop a stage after this many epochs without "
                                           "improvement on the hold-out (default 3; 0 never stops early)."),
    min_steps: Optional[int] = typer.Option(None, "--min-steps", help="Optimizer steps each trained stage takes at "
                                            "least; epochs are added on little data (default 300; 0: epochs as given)."),
    float_io: Optional[bool] = typer.Option(None, "--float-io/--int8-io", help="Keep float input/output tensors."),
    loss: Optional[str] = typer.Option(None, "--loss", help="A Keras built-in loss to fine-tune with, e.g. "
                                       "mean_squared_error (default: the model's compile config, else from the data)."),
    metric: Optional[str] = typer.Option(None, "--metric", help="The metric leaves are judged by: accuracy, "
                                         "top5_accuracy, mse, mae, psnr, auc, or module:function (runs that code)."),
    preprocess: Optional[str] = typer.Option(None, "--preprocess", help="module:function (or file.py:function) run on "
                                             "every sample first, e.g. an MFCC front end (runs that code)."),
    trust_lambda: bool = typer.Option(False, "--trust-lambda", help="Load models with Lambda layers (runs their code)."),
    json_out: bool = typer.Option(False, "--json", help="Print only JSON on stdout."),
    executor: str = typer.Option("local", "--executor", help="Where each stage runs: local (this process, or --jobs "
                                 "worker processes) or ray (every ready stage a Ray task; files travel through Ray)."),
    jobs: Optional[int] = typer.Option(None, "--jobs", "-j", help="Stages trained or converted at once in local worker "
                                       "processes (recipe key jobs; default 1: one at a time, in this process)."),
    ray_address: Optional[str] = typer.Option(None, "--ray-address", help="Ray cluster to join (default: RAY_ADDRESS, "
                                              "else a local Ray)."),
    walk: bool = typer.Option(False, "--walk", help="Train, convert and compile level by level for --target and stop "
                              "at the first level with a leaf meeting the --max-* requirements (exit 8 when none does)."),
    target: List[str] = typer.Option([], "--target", "-t", help="With --walk: target name or TOML file; repeat for several."),
    max_accuracy_drop: Optional[float] = typer.Option(None, "--max-accuracy-drop", metavar="PTS",
                                                      help="With --walk: most int8 accuracy points lost against ptq."),
    max_flash: Optional[str] = typer.Option(None, "--max-flash", metavar="BYTES", help="With --walk: largest compiled model."),
    max_sram: Optional[str] = typer.Option(None, "--max-sram", metavar="BYTES", help="With --walk: largest Vela SRAM estimate."),
    max_latency_ms: Optional[float] = typer.Option(None, "--max-latency-ms", metavar="MS", help="With --walk: longest latency."),
    max_npu_cycles: Optional[int] = typer.Option(None, "--max-npu-cycles", metavar="N", help="With --walk: most NPU cycles."),
    max_metric_drop: Optional[float] = typer.Option(None, "--max-metric-drop", metavar="X",
                                                    help="With --walk: most the metric may worsen against ptq (any task)."),
) -> None:
    """Run the deployment tree (prune / cluster / QAT), convert every leaf to int8 and score it on the host."""
    from .common import guard, out_console
    from ..report.render.tables import dumps

    with guard():
        from .. import api
        from ..errors import UsageError
        from edgedeploy.pipeline.tree_run import optimize
        from edgedeploy.config.recipe import load_recipe

        overrides = {
            "leaves": [s.strip() for s in leaves.split(",") if s.strip()] if leaves is not None else None,
            "sparsity": sparsity, "sparsity_pattern": sparsity_pattern, "clusters": clusters, "per_channel_clusters": per_channel_clusters,
            "epochs": epochs, "batch_size": batch_size, "learning_rate": learning_rate, "seed": seed,
            "float_io": float_io, "plain": plain, "distill": distill, "lr_schedule": lr_schedule,
            "pruning_schedule": pruning_schedule,
            "freeze_batch_norm": freeze_batch_norm, "validation_fraction": validation_fraction, "patience": patience,
            "min_steps": min_steps, "loss": loss, "metric": metric, "jobs": jobs, "preprocess": preprocess,
        }
        r = load_recipe(recipe, overrides)
        limits = (max_accuracy_drop, max_flash, max_sram, max_latency_ms, max_npu_cycles, max_metric_drop)
        if not walk and (target or any(v is not None for v in limits)):
            raise UsageError("--target and the --max-* requirements are for --walk",
                             "add --walk, or judge a finished run with `edgedeploy report RUN --max-...`")
        if walk:
            from edgedeploy.pipeline.compile import resolve_targets
            from ..report.render.walk import walk_lines
            from edgedeploy.pipeline.walk import requirements_from_options, walk as walk_tree

            req = requirements_from_options(*limits)
            options = api.CompileOptions(executor=executor, ray_address=ray_address)
            walked = walk_tree(model, data, out, r, resolve_targets(target), req, options, trust_lambda=trust_lambda)
            if json_out:
                typer.echo(dumps({"schema": "edgedeploy.walk", "schema_version": 1, "run_dir": str(walked.run_dir),
                                  "walk": walked.record}))
            else:
                for line in walk_lines(walked.record):
                    out_console.print(f"walk {line}", markup=False, highlight=False)
            return
        if executor not in ("local", "ray"):
            raise UsageError(f"--executor is '{executor}'", "use local or ray")
        outcome = optimize(model, data, out, r, trust_lambda=trust_lambda, executor=executor, ray_address=ray_address)
        doc = leaves_json(outcome)
        if json_out:
            typer.echo(dumps(doc))
        else:
            out_console.print(leaves_table(doc))
            from .common import err_console, escape

            for rec in list(outcome.nodes.values()) + list(outcome.leaves.values()):
                for w in rec.warnings:
                    err_console.print(f"[yellow]warning:[/] {escape(f'{rec.id}: {w}')}", highlight=False)
            err_console.print(f"manifest: {outcome.run_dir / 'manifest.json'}; compile the leaves with "
                              f"`edgedeploy compile {outcome.run_dir} -t TARGET`", highlight=False, markup=False)


def _keras_layer(tensor: str) -> str:
    """``model/quant_conv2d/Conv2D`` (an int8 kernel's tensor) -> ``conv2d``."""
    parts = tensor.split("/")
    return (parts[1] if len(parts) > 1 else tensor).removeprefix("quant_")


def leaves_json(outcome) -> dict:
    from .. import __version__

    base = outcome.leaves.get("ptq")
    base_gzip = base.metric("gzip_bytes") if base else None
    base_acc = base.metric("int8_accuracy") if base else None
    leaves = []
    for leaf, rec in outcome.leaves.items():
        m = {k: v.to_dict() for k, v in rec.metrics.items()}
        gz, acc = rec.metric("gzip_bytes"), rec.metric("int8_accuracy")
        judged = rec.details.get("metric")  # a leaf judged by another metric than accuracy (edgedeploy.config.task)
        extra = {}
        if judged:
            mine, theirs = rec.metric(f"int8_{judged['key']}"), base.metric(f"int8_{judged['key']}") if base else None
            extra = {"metric": judged, "delta_int8_metric_vs_ptq": None if mine is None or theirs is None
                     else round(mine - theirs, 6)}
        kept = [r for r in rec.details.get("preservation", []) if r["status"] not in ("ok",)]
        # palette leaves check 2:4 on their int8 file only: name the layers that check left out, too
        kept += [{**r, "layer": _keras_layer(r["layer"])} for r in rec.details.get("pattern_2of4", [])
                 if r["status"] == "left out" and _keras_layer(r["layer"]) not in {k["layer"] for k in kept}]
        leaves.append({
            "leaf": leaf,
            "node": rec.details.get("node"),
            "metrics": m,
            "delta_int8_accuracy_vs_ptq": None if base_acc is None or acc is None else round(acc - base_acc, 3),
            "gzip_compression_vs_ptq_pct": None if not base_gzip or gz is None else round(100 * (1 - gz / base_gzip), 2),
            "int8_model": rec.output("int8_model").path,
            "preservation_notes": kept,
            "warnings": rec.warnings,
            **extra,
        })
    return {"schema": "edgedeploy.optimize", "schema_version": 1, "edgedeploy_version": __version__,
            "run_dir": str(outcome.run_dir), "leaves": leaves}


def leaves_table(doc: dict):
    from rich.table import Table

    from ..report.render.tables import fmt_bytes, fmt_num

    from ..report.columns import metric_label

    judged = next((leaf["metric"] for leaf in doc["leaves"] if leaf.get("metric")), None)
    name = metric_label(judged["name"]) if judged else "accuracy"  # the task's metric: MSE, PSNR ...
    unit = (f" ({judged['unit']})" if judged["unit"] else "") if judged else " (%)"
    t = Table(title=f"Deployment tree leaves ({name} on the evaluation split"
              + (", lower is better)" if judged and not judged["higher_is_better"] else ")"), title_justify="left")
    for h in ("Leaf", f"Float {name}{unit}", f"Int8 {name}{unit}", "Δ vs ptq", "TFLite", "gzip", "gzip vs ptq (%)",
              "Notes"):
        t.add_column(h, justify="left" if h in ("Leaf", "Notes") else "right")
    for leaf in doc["leaves"]:
        m = leaf["metrics"]
        notes = {f"{r['layer']}: {r['status']}" for r in leaf["preservation_notes"] if r["status"] != "not optimized"}
        depthwise = any(r["status"] == "not optimized" for r in leaf["preservation_notes"])
        text = "; ".join(sorted(notes)[:3]) + ("; depthwise kept dense (TFMOT)" if depthwise else "")
        key, digits, delta = "accuracy", 2, leaf["delta_int8_accuracy_vs_ptq"]
        if leaf.get("metric"):
            key, digits, delta = leaf["metric"]["key"], 4, leaf.get("delta_int8_metric_vs_ptq")
        t.add_row(leaf["leaf"], fmt_num(m.get(f"float_{key}", {}).get("value"), digits),
                  fmt_num(m.get(f"int8_{key}", {}).get("value"), digits),
                  fmt_num(delta, digits), fmt_bytes(m["tflite_bytes"]["value"]),
                  fmt_bytes(m["gzip_bytes"]["value"]), fmt_num(leaf["gzip_compression_vs_ptq_pct"], 1), text.strip("; "))
    return t
