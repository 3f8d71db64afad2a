"""Project files (``edgedeploy.toml``): model, data, recipe, targets and requirements in one place.

``edgedeploy compile edgedeploy.toml`` runs optimize -> convert -> Vela in one command; stages whose
inputs and settings are unchanged are reused from the run folder.

    model = "dscnn_mlperf_float.h5"      # paths are relative to the project file
    data = "speech_commands_subset.npz"
    out = "edgedeploy-out"
    targets = ["ethos-u55-128", "ethos-u85-256"]
    trust_lambda = false

    [recipe]                             # the keys of a recipe file
    leaves = ["ptq", "pcqat"]
    epochs = 2

    [compile]
    optimise = "Performance"
    allow_cpu_ops = false

    [requirements]                       # read by `edgedeploy report --project`
    max_accuracy_drop = 1.0
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Sequence

from .compile import CompileOptions, CompileOutcome, compile_variants, resolve_targets
from .errors import UsageError
from .recipe import RECIPE_KEYS, Recipe, load_recipe
from .settings import Key, lookup, read_toml, validate
from .vela import OPTIMISE_CHOICES

_P = "fix the project file"
PROJECT_KEYS: tuple[Key, ...] = (
    Key("model", str, None, "the float Keras model (.h5 or .keras), relative to the project file", required=True),
    Key("data", str, None, "the data (.npz), relative to the project file", required=True),
    Key("out", str, "edgedeploy-out", "the run folder, relative to the project file"),
    Key("targets", list, [], "target names or target files (.toml, relative to the project file)", items=str),
    Key("trust_lambda", bool, False, "load Lambda layers (runs code stored in the model file)"),
    *(k.under("recipe") for k in RECIPE_KEYS),
    Key("compile.optimise", str, "Performance", "Vela's --optimise", choices=OPTIMISE_CHOICES),
    Key("compile.allow_cpu_ops", bool, False, "accept operators that fall back to the CPU"),
    Key("compile.jobs", int, None, "Vela worker processes (default: one per core)", minimum=1, maximum=256),
    Key("compile.debug_db", bool, False, "ask Vela for its debug database (on when a palette leaf is asked for)"),
    Key("requirements.max_accuracy_drop", float, None, "int8 accuracy points below the ptq leaf", minimum=0),
    Key("requirements.max_metric_drop", float, None, "the leaf's metric (MSE, PSNR ...) worse than the ptq leaf's, "
        "in its unit", minimum=0),
    Key("requirements.max_flash", str, None, "bytes of the compiled model, e.g. 512KiB", numbers_ok=True),
    Key("requirements.max_sram", str, None, "bytes of Vela's SRAM estimate, e.g. 256KiB", numbers_ok=True),
    Key("requirements.max_latency_ms", float, None, "milliseconds per inference", minimum=0),
    Key("requirements.max_npu_cycles", int, None, "NPU cycles per inference (Vela's estimate)", minimum=0),
)


@dataclass(frozen=True)
class Project:
    path: Path
    model: Path
    data: Path
    out: Path
    targets: tuple[str, ...]
    recipe: Recipe
    trust_lambda: bool
    compile: CompileOptions
    requirements: dict[str, Any]


def load_project(path: Path) -> Project:
    path = Path(path)
    doc = read_toml(path, "project file", UsageError)
    values = validate(doc, PROJECT_KEYS, str(path), UsageError, _P)
    base = path.resolve().parent

    def file_key(key: str) -> Path:
        value = values[key]
        if "\0" in value:
            raise UsageError(f"{path}: `{key}` holds a NUL character", f"set {key} = \"path\" (relative to the project file)")
        return (base / value).resolve()

    # a target given as a path is relative to the project file
    targets = [str((base / t).resolve()) if t.endswith(".toml") else t for t in values.get("targets", [])]
    try:
        recipe = load_recipe(table=doc.get("recipe", {}))
    except UsageError as exc:  # the checks across keys (the keys themselves were checked above)
        raise UsageError(exc.message.replace("recipe:", f"{path} [recipe]:", 1), exc.hint) from exc
    get = lambda key: values.get(key, lookup(PROJECT_KEYS, key).default)  # noqa: E731
    return Project(
        path=path,
        model=file_key("model"),
        data=file_key("data"),
        out=(base / get("out")).resolve(),
        targets=tuple(targets),
        recipe=recipe,
        trust_lambda=get("trust_lambda"),
        compile=CompileOptions(
            optimise=get("compile.optimise"),
            allow_cpu_ops=get("compile.allow_cpu_ops"),
            jobs=get("compile.jobs"),
            # Vela's debug database (per-layer encoded weights): on by default when a palette leaf is asked for
            debug_db=values.get("compile.debug_db", any("palette" in leaf for leaf in recipe.leaves)),
        ),
        requirements=dict(doc.get("requirements", {})),
    )


def merged_options(project: Project, options: CompileOptions | None) -> CompileOptions:
    """The project's compile options, with command-line options that differ from the defaults winning."""
    opts = project.compile
    if options is not None:
        defaults = CompileOptions()
        opts = replace(opts, **{k: getattr(options, k) for k in ("optimise", "jobs", "allow_cpu_ops", "executor", "ray_address",
                                                         "debug_db")
                                if getattr(options, k) != getattr(defaults, k)})
    opts.check()
    return opts


def run_project(
    path: Path,
    extra_targets: Sequence[str] = (),
    out: Path | None = None,
    options: CompileOptions | None = None,
) -> CompileOutcome:
    """Optimize, convert and compile every leaf of the project's recipe for its targets."""
    project = load_project(path)
    return run_model(project.model, project.data, out or project.out, project.recipe,
                     resolve_targets([*project.targets, *extra_targets]), merged_options(project, options),
                     trust_lambda=project.trust_lambda)


def run_model(model: Path, data: Path, run_dir: Path, recipe: Recipe, targets: Sequence, opts: CompileOptions, *,
              trust_lambda: bool = False) -> CompileOutcome:
    """One model's pipeline: its tree (optimize), then every leaf compiled for every target, into ``run_dir``."""
    from .optimize import optimize

    # one task graph: each leaf compiles for every target as soon as it is converted (edgedeploy.taskgraph)
    return optimize(model, data, run_dir, recipe, trust_lambda=trust_lambda, executor=opts.executor,
                    ray_address=opts.ray_address, targets=targets, compile_options=opts).compiled
