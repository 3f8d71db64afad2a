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

import tomllib
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Sequence

from .compile import CompileOptions, CompileOutcome, compile_variants, resolve_targets
from .errors import UsageError
from .recipe import Recipe, load_recipe

KNOWN = {"model", "data", "out", "targets", "trust_lambda", "recipe", "compile", "requirements"}


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
    try:
        doc = tomllib.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError as exc:
        raise UsageError(f"project file {path} does not exist", "check the path") from exc
    except tomllib.TOMLDecodeError as exc:
        raise UsageError(f"{path}: not valid TOML ({exc})", "fix the syntax") from exc
    for key in doc:
        if key not in KNOWN:
            raise UsageError(f"{path}: unknown key `{key}`", f"allowed keys: {', '.join(sorted(KNOWN))}")
    base = path.resolve().parent

    def file_key(key: str) -> Path:
        value = doc.get(key)
        if not isinstance(value, str) or not value:
            raise UsageError(f"{path}: `{key}` is missing or not a string", f"set {key} = \"path\" (relative to the project file)")
        return (base / value).resolve()

    targets = doc.get("targets", [])
    if not isinstance(targets, list) or not all(isinstance(t, str) for t in targets):
        raise UsageError(f"{path}: `targets` must be a list of target names", 'e.g. targets = ["ethos-u55-128"]')
    # a target given as a path is relative to the project file
    targets = [str((base / t).resolve()) if t.endswith(".toml") else t for t in targets]
    compile_table = doc.get("compile", {})
    unknown = set(compile_table) - {"optimise", "allow_cpu_ops", "jobs", "debug_db"}
    if unknown:
        raise UsageError(f"{path}: unknown key `compile.{sorted(unknown)[0]}`",
                         "allowed keys: optimise, allow_cpu_ops, jobs, debug_db")
    recipe_table = doc.get("recipe", {})
    try:
        recipe = load_recipe(table=recipe_table)
    except UsageError as exc:
        raise UsageError(exc.message.replace("recipe:", f"{path} [recipe]:", 1), exc.hint) from exc
    return Project(
        path=path,
        model=file_key("model"),
        data=file_key("data"),
        out=(base / doc.get("out", "edgedeploy-out")).resolve(),
        targets=tuple(targets),
        recipe=recipe,
        trust_lambda=bool(doc.get("trust_lambda", False)),
        compile=CompileOptions(
            optimise=compile_table.get("optimise", "Performance"),
            allow_cpu_ops=bool(compile_table.get("allow_cpu_ops", False)),
            jobs=compile_table.get("jobs"),
            # Vela's debug database (per-layer encoded weights): on by default when a palette leaf is asked for
            debug_db=bool(compile_table.get("debug_db", any("palette" in leaf for leaf in recipe.leaves))),
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
    from .optimize import optimize
    from .stages import RunContext

    project = load_project(path)
    targets = resolve_targets([*project.targets, *extra_targets])
    opts = merged_options(project, options)
    run_dir = out or project.out
    result = optimize(project.model, project.data, run_dir, project.recipe, trust_lambda=project.trust_lambda)
    ctx = RunContext.open(run_dir)
    variants = [(leaf, ctx.manifest.resolve(rec.output("int8_model")), rec.id) for leaf, rec in result.leaves.items()]
    return compile_variants(ctx, variants, targets, opts)
