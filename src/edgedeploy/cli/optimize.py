"""`edgedeploy optimize`: the deployment tree on a Keras model and real data.

The options that set a recipe key take their help (the key's help, its values, its default and what ``--plain``
sets) from the recipe key table through :func:`edgedeploy.api.recipe_key`, where the defaults are written once.
Each such option's own default is None: a value given on the command line wins over the recipe file's.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, List, Optional

import typer
from typer.core import TyperCommand

from ..api import DEFAULT_RUN_DIR

EXAMPLE = "Example: edgedeploy optimize model.h5 --data data.npz -o out --leaves ptq,pcqat"

# Option name -> the recipe key it sets (the option's value, when given, overrides the recipe file's).
RECIPE_OPTIONS = {
    "leaves": "leaves", "sparsity": "sparsity", "sparsity_pattern": "sparsity_pattern", "clusters": "clusters",
    "per_channel_clusters": "per_channel_clusters", "epochs": "epochs", "batch_size": "batch_size",
    "learning_rate": "learning_rate", "seed": "seed", "float_io": "float_io", "plain": "plain",
    "distill": "distillation.enabled", "lr_schedule": "training.lr_schedule",
    "pruning_schedule": "pruning.schedule", "freeze_batch_norm": "training.freeze_batch_norm",
    "validation_fraction": "selection.validation_fraction", "patience": "selection.patience",
    "min_steps": "training.min_steps", "loss": "loss", "metric": "metric", "jobs": "jobs",
    "preprocess": "data.preprocess",
}
_FROM_KEY = "recipe key: "  # an option help that RecipeHelpCommand writes from the key table
# Option help that says more than the key's own help (the key's default is still added).
_LEADS = {"leaves": "Comma-separated leaves of the deployment tree to convert, e.g. ptq,pcqat"}


def _key(option: str) -> str:
    return _FROM_KEY + option


def register(app: typer.Typer) -> None:
    app.command("optimize", epilog=EXAMPLE, cls=RecipeHelpCommand)(optimize_cmd)


def _shown(value: Any) -> str:
    if isinstance(value, bool):
        return "on" if value else "off"
    if isinstance(value, (list, tuple)):
        return ",".join(map(str, value))
    return f"{value:g}" if isinstance(value, float) else str(value)


def recipe_help(option: str) -> str:
    """The help of the option that sets a recipe key: the key's help (or :data:`_LEADS`'), the values it takes,
    its default and, where ``--plain`` sets another, that one."""
    from .. import api

    key = api.recipe_key(RECIPE_OPTIONS[option])
    first = key.help.split(" ", 1)[0].rstrip(",")
    code = ":" in first or first in map(str, key.choices or ())  # a help that starts with a value keeps its case
    text = _LEADS.get(option) or (key.help if code else key.help[:1].upper() + key.help[1:])
    if key.choices and key.type is not list and not all(str(c) in key.help for c in key.choices):
        text += f": {' or '.join(map(str, key.choices))}"  # the values, unless the help names them already
    plain = api.plain_settings().get(key.name)
    if key.default in ("", None):
        return f"{text}."
    also = f" (--plain: {_shown(plain)})" if plain is not None and plain != key.default else ""
    return f"{text}. Default {_shown(key.default)}{also}."


class RecipeHelpCommand(TyperCommand):
    """The optimize command. The help of its recipe options is written from the key table when its parameters are
    first used (its help, its parse, the docs' option table), so the other commands start without that table."""

    _filled = False

    @property
    def params(self) -> list:
        if not self._filled:
            self._filled = True
            for p in self._params:
                if isinstance(p.help, str) and p.help.startswith(_FROM_KEY):
                    p.help = recipe_help(p.help.removeprefix(_FROM_KEY))
        return self._params

    @params.setter
    def params(self, value: list) -> None:
        self._params, self._filled = value, False


# typer declares the command's options as its parameters: the signature is the option list (37 options).
def optimize_cmd(
    model: Path = typer.Argument(..., help="Keras model (.h5 or .keras; saved by tf_keras, or by Keras 3 and rebuilt in tf_keras)."),
    data: Path = typer.Option(..., "--data", "-d", help=".npz with x, y, split (0 fine-tune, 1 eval) or x_train/y_train/x_test/y_test; "
                              "or a folder with a subfolder of images or WAV files per class (optionally under train/ and test/)."),
    out: Path = typer.Option(Path(DEFAULT_RUN_DIR), "--out", "-o", help="Run folder (manifest and outputs)."),
    recipe: Optional[Path] = typer.Option(None, "--recipe", help="Recipe TOML (flags below override it)."),
    leaves: Optional[str] = typer.Option(None, "--leaves", help=_key("leaves")),
    sparsity: Optional[float] = typer.Option(None, "--sparsity", help=_key("sparsity")),
    sparsity_pattern: Optional[str] = typer.Option(None, "--sparsity-pattern", help=_key("sparsity_pattern")),
    clusters: Optional[int] = typer.Option(None, "--clusters", help=_key("clusters")),
    per_channel_clusters: Optional[bool] = typer.Option(None, "--per-channel-clusters/--per-tensor-clusters",
                                                        help=_key("per_channel_clusters")),
    epochs: Optional[int] = typer.Option(None, "--epochs", help=_key("epochs")),
    batch_size: Optional[int] = typer.Option(None, "--batch-size", help=_key("batch_size")),
    learning_rate: Optional[float] = typer.Option(None, "--learning-rate", help=_key("learning_rate")),
    seed: Optional[int] = typer.Option(None, "--seed", help=_key("seed")),
    plain: Optional[bool] = typer.Option(None, "--plain", help=_key("plain")),
    distill: Optional[bool] = typer.Option(None, "--distill/--no-distill", help=_key("distill")),
    pruning_schedule: Optional[str] = typer.Option(None, "--pruning-schedule", help=_key("pruning_schedule")),
    lr_schedule: Optional[str] = typer.Option(None, "--lr-schedule", help=_key("lr_schedule")),
    freeze_batch_norm: Optional[bool] = typer.Option(None, "--freeze-batch-norm/--train-batch-norm",
                                                     help=_key("freeze_batch_norm")),
    validation_fraction: Optional[float] = typer.Option(None, "--validation-fraction",
                                                       help=_key("validation_fraction")),
    patience: Optional[int] = typer.Option(None, "--patience", help=_key("patience")),
    min_steps: Optional[int] = typer.Option(None, "--min-steps", help=_key("min_steps")),
    float_io: Optional[bool] = typer.Option(None, "--float-io/--int8-io", help=_key("float_io")),
    loss: Optional[str] = typer.Option(None, "--loss", help=_key("loss")),
    metric: Optional[str] = typer.Option(None, "--metric", help=_key("metric")),
    preprocess: Optional[str] = typer.Option(None, "--preprocess", help=_key("preprocess")),
    trust_lambda: bool = typer.Option(False, "--trust-lambda", help="Load models with Lambda layers (runs their code)."),
    json_out: bool = typer.Option(False, "--json", help="Print only JSON on stdout."),
    executor: str = typer.Option("local", "--executor", help="Where each stage runs: local (this process, or --jobs "
                                 "worker processes) or ray (every ready stage a Ray task; files travel through Ray)."),
    jobs: Optional[int] = typer.Option(None, "--jobs", "-j", help=_key("jobs")),
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
    values = dict(locals())  # every option by name, as the helpers below read them
    from .common import guard

    with guard():
        _optimize(values)


def _optimize(values: dict[str, Any]) -> None:
    from .. import api
    from ..errors import UsageError

    overrides = {name: values[name] for name in RECIPE_OPTIONS}
    if values["leaves"] is not None:
        overrides["leaves"] = [s.strip() for s in values["leaves"].split(",") if s.strip()]
    r = api.load_recipe(values["recipe"], overrides)
    if not values["walk"] and (values["target"] or any(values[k] is not None for k in api.Requirements.KEYS)):
        raise UsageError("--target and the --max-* requirements are for --walk",
                         "add --walk, or judge a finished run with `edgedeploy report RUN --max-...`")
    if values["walk"]:
        _walk(values, r)
        return
    if values["executor"] not in ("local", "ray"):
        raise UsageError(f"--executor is '{values['executor']}'", "use local or ray")
    outcome = api.optimize(values["model"], values["data"], values["out"], recipe=r,
                           trust_lambda=values["trust_lambda"], executor=values["executor"],
                           ray_address=values["ray_address"])
    _print_leaves(outcome, values["json_out"])


def _walk(values: dict[str, Any], r: Any) -> None:
    from .. import api
    from .common import out_console

    req = api.requirements(**{k: values[k] for k in api.Requirements.KEYS})
    options = api.CompileOptions(executor=values["executor"], ray_address=values["ray_address"])
    walked = api.walk(values["model"], values["data"], values["out"], r, values["target"], req, options,
                      trust_lambda=values["trust_lambda"])
    if values["json_out"]:
        typer.echo(api.dumps({"schema": "edgedeploy.walk", "schema_version": 1, "run_dir": str(walked.run_dir),
                              "walk": walked.walk}))
    else:
        for line in api.walk_lines(walked.walk):
            out_console.print(f"walk {line}", markup=False, highlight=False)


def _print_leaves(outcome: Any, json_out: bool) -> None:
    from .. import api
    from ..api import process
    from .common import err_console, escape, out_console

    doc = api.leaves_json(outcome)
    if json_out:
        typer.echo(api.dumps(doc))
        return
    out_console.print(process.leaves_table(doc))
    for rec in list(outcome.nodes.values()) + list(outcome.leaves.values()):
        for w in rec.warnings:
            err_console.print(f"[yellow]warning:[/] {escape(f'{rec.id}: {w}')}", highlight=False)
    err_console.print(f"manifest: {outcome.run_dir / 'manifest.json'}; compile the leaves with "
                      f"`edgedeploy compile {outcome.run_dir} -t TARGET`", highlight=False, markup=False)

