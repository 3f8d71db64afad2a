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

Several models in one file (a sweep): one ``[[models]]`` table per model instead of the top-level ``model``.
Each runs into its own run folder ``OUT/NAME`` (see :mod:`edgedeploy.pipeline.sweep`); ``data`` and ``trust_lambda``
default to the top-level ones, and a ``recipe`` table overrides keys of the shared ``[recipe]``.

    data = "speech_commands_subset.npz"
    [[models]]
    name = "dscnn"
    model = "dscnn_mlperf_float.h5"
    [[models]]
    name = "dscnn_sparse"
    model = "dscnn_mlperf_float.h5"
    recipe = { sparsity = 0.75 }
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Mapping

from edgedeploy.pipeline.compile import CompileOptions
from edgedeploy.errors import UsageError
from edgedeploy.core.names import check_name
from edgedeploy.config import DEFAULT_RUN_DIR
from edgedeploy.config.recipe import RECIPE_KEYS, Recipe, load_recipe
from edgedeploy.config.requirements import REQUIREMENTS, SIZE_KEYS, Requirement, check_requirements
from edgedeploy.config.keys import Key, lookup, read_toml, validate
from edgedeploy.vela.outputs import OPTIMISE_CHOICES
from edgedeploy.vela.pool import MAX_JOBS

_P = "fix the project file"


def _requirement_key(name: str, r: Requirement) -> Key:
    """The project key of one requirement: a size as text or a number; an integer from its lowest value; a
    number within its bounds (the upper bound of an integer is checked with the others by check_requirements)."""
    if name in SIZE_KEYS:
        return Key(f"requirements.{name}", str, None, r.what, numbers_ok=True)
    if r.kind is int:
        return Key(f"requirements.{name}", int, None, r.what, minimum=int(r.low) + (1 if r.low_open else 0))
    return Key(f"requirements.{name}", float, None, r.what, minimum=r.low, exclusive_minimum=r.low_open,
               maximum=r.high)


PROJECT_KEYS: tuple[Key, ...] = (
    Key("model", str, None, "the float Keras model (.h5 or .keras), relative to the project file",
        required_when="a project without [[models]]"),
    Key("data", str, None, "the data (.npz, or a folder with a subfolder per class), relative to the project file",
        required_when="a project without [[models]], or a [[models]] table without data"),
    Key("out", str, DEFAULT_RUN_DIR, "the run folder, relative to the project file"),
    Key("targets", list, [], "target names or target files (.toml, relative to the project file)", items=str),
    Key("trust_lambda", bool, False, "load Lambda layers (runs code stored in the model file)"),
    *(k.under("recipe") for k in RECIPE_KEYS),
    Key("compile.optimise", str, CompileOptions.optimise, "Vela's --optimise", choices=OPTIMISE_CHOICES),
    Key("compile.allow_cpu_ops", bool, CompileOptions.allow_cpu_ops, "accept operators that fall back to the CPU"),
    Key("compile.jobs", int, CompileOptions.jobs, "Vela worker processes (default: one per core)", minimum=1,
        maximum=MAX_JOBS),
    Key("compile.debug_db", bool, False, "ask Vela for its debug database (on when a palette leaf is asked for)"),
    # the limits of edgedeploy.config.requirements.REQUIREMENTS, bounded as the report and walk flags are
    *(_requirement_key(name, r) for name, r in REQUIREMENTS.items()),
    # [[models]]: one table per model of a sweep (checked one table at a time by load_project)
    Key("models.name", str, None, "[[models]]: the model's name, its run folder OUT/NAME (letters, digits, "
        "'-', '_')", required_when="each [[models]] table"),
    Key("models.model", str, None, "[[models]]: the float Keras model, relative to the project file",
        required_when="each [[models]] table"),
    Key("models.data", str, None, "[[models]]: the model's data (.npz); default: the top-level data"),
    Key("models.trust_lambda", bool, None, "[[models]]: load Lambda layers; default: the top-level trust_lambda"),
    Key("models.recipe", dict, None, "[[models]]: keys of [recipe] that differ for this model, e.g. "
        "recipe = { sparsity = 0.75 }"),
)
MODEL_KEYS: tuple[Key, ...] = tuple(
    replace(k, path=k.path.removeprefix("models."), required=k.path in ("models.name", "models.model"),
            required_when="") for k in PROJECT_KEYS if k.path.startswith("models."))


@dataclass(frozen=True)
class ModelEntry:
    """One model of a project: its name (the run folder under ``out``), files, recipe and trust."""

    name: str
    model: Path
    data: Path
    recipe: Recipe
    trust_lambda: bool


@dataclass(frozen=True)
class Project:
    path: Path
    model: Path | None  # None when the file lists [[models]]
    data: Path | None
    out: Path
    targets: tuple[str, ...]
    recipe: Recipe
    trust_lambda: bool
    compile: CompileOptions
    requirements: dict[str, Any] | None  # the [requirements] table as read (None: the file has none)
    models: tuple[ModelEntry, ...] = ()  # the [[models]] tables, in file order (empty: the one-model form)

    @property
    def is_sweep(self) -> bool:
        return bool(self.models)

    @property
    def entry(self) -> ModelEntry:
        """The model of a one-model project (its run folder is ``out`` itself)."""
        if self.is_sweep or self.model is None or self.data is None:
            raise UsageError(f"{self.path} lists [[models]]: it is a sweep, one run folder per model",
                             "run it with `edgedeploy compile PROJECT.toml`")
        return ModelEntry("", self.model, self.data, self.recipe, self.trust_lambda)


def _merged(shared: Mapping[str, Any], over: Mapping[str, Any]) -> dict[str, Any]:
    """``shared`` with the keys of ``over`` replacing its own (tables merged key by key)."""
    out = dict(shared)
    for k, v in over.items():
        out[k] = _merged(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def _load_recipe(path: Path, table: Mapping[str, Any], where: str) -> Recipe:
    try:
        return load_recipe(table=table)
    except UsageError as exc:  # the checks across keys, and a [[models]] recipe's own keys
        raise UsageError(exc.message.replace("recipe:", f"{path} {where}:", 1), exc.hint) from exc


def _model_entries(path: Path, doc: Mapping[str, Any], values: Mapping[str, Any]) -> tuple[ModelEntry, ...]:
    """The [[models]] tables, each checked against MODEL_KEYS; names unique; data given somewhere."""
    tables = doc.get("models")
    if tables is None:
        return ()
    hint = "write one [[models]] table per model, each with name and model"
    if not isinstance(tables, list) or not tables or not all(isinstance(t, dict) for t in tables):
        raise UsageError(f"{path}: `models` must be an array of tables ([[models]] with name and model)", hint)
    if "model" in values:
        raise UsageError(f"{path}: both `model` and [[models]] are given",
                         "move the top-level model into a [[models]] table, or remove the [[models]] tables")
    base = path.resolve().parent
    entries: list[ModelEntry] = []
    for i, table in enumerate(tables, 1):
        got = validate(table, MODEL_KEYS, f"{path} [[models]] #{i}", UsageError, _P)
        name = check_name("model", got["name"], f"{path}: [[models]] #{i} `name`")
        if any(e.name.lower() == name.lower() for e in entries):  # one folder on a case-insensitive disk
            raise UsageError(f"{path}: two [[models]] tables are named '{name}'", "give each model its own name")
        data = got.get("data", values.get("data"))
        if data is None:
            raise UsageError(f"{path}: [[models]] '{name}' has no data, and the file no top-level `data`",
                             f"set data = \"FILE.npz\" in the [[models]] table '{name}' or at the top")
        recipe = _load_recipe(path, _merged(doc.get("recipe", {}), got.get("recipe", {})),
                              f"[[models]] '{name}' recipe")
        entries.append(ModelEntry(name=name, model=(base / got["model"]).resolve(), data=(base / data).resolve(),
                                  recipe=recipe, trust_lambda=got.get("trust_lambda",
                                                                      values.get("trust_lambda", False))))
    return tuple(entries)


def load_project(path: Path) -> Project:
    path = Path(path)
    doc = read_toml(path, "project file", UsageError)
    values = validate({k: v for k, v in doc.items() if k != "models"}, PROJECT_KEYS, str(path), UsageError, _P)
    check_requirements({k.removeprefix("requirements."): v for k, v in values.items() if k.startswith("requirements.")},
                       f"{path}: `requirements.{{name}}`", UsageError, _P)  # the bounds flags are checked against
    models = _model_entries(path, doc, values)
    if not models and "model" not in values:
        raise UsageError(f"{path}: `model` is missing; it must be a string", _P + " (or list [[models]] tables)")
    if not models and "data" not in values:
        raise UsageError(f"{path}: `data` is missing; it must be a string", _P)
    base = path.resolve().parent

    def file_key(key: str) -> Path | None:
        if key not in values:
            return None
        return (base / values[key]).resolve()

    # a target given as a path is relative to the project file
    targets = [str((base / t).resolve()) if t.endswith(".toml") else t for t in values.get("targets", [])]
    recipe = _load_recipe(path, doc.get("recipe", {}), "[recipe]")
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
            debug_db=values.get("compile.debug_db", any("palette" in leaf for r in (recipe, *(m.recipe for m in models))
                                                        for leaf in r.leaves)),
        ),
        requirements=dict(doc["requirements"]) if "requirements" in doc else None,
        models=models,
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
