"""MkDocs hook: reference tables generated from the code's own tables, so the site cannot drift from it.

A page asks for a table with a marker line, e.g. ``<!-- generated: recipe-keys -->``. The hook replaces it
with Markdown built from the checkout's ``src/edgedeploy`` at build time: file keys (``recipe-keys``,
``project-keys``, ``target-keys``), the built-in targets (``targets``), the deployment tree (``tree``), the
exit codes (``exit-codes``) and a command's options (``options compile``, ``options fvp run`` ...).
An unknown marker, a key without a description, or a description of a key the code does not have is logged
as a warning, which ``mkdocs build --strict`` turns into a failed build.
"""

from __future__ import annotations

import ast
import logging
import re
import sys
import tempfile
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any, Callable

REPO = Path(__file__).resolve().parents[2]
MARKER = re.compile(r"^<!-- generated: ([a-z-]+)(?: ([a-z -]+))? -->$", re.M)
log = logging.getLogger("mkdocs.hooks.reference")


@dataclass(frozen=True)
class Row:
    path: str
    type: str
    default: Any
    choices: tuple = ()
    help: str = ""
    allowed: str = ""  # a range, in words, where there are no choices


# Pages written beside the code they document, and the nav section each joins when it is not listed in mkdocs.yml.
SECTIONS = {"tree.md": "Method notes", "sparsity.md": "Method notes", "emulate.md": "Commands",
            "files.md": "File reference", "results/": "Results"}


def on_config(config):
    """Document the checkout's own code, not whatever edgedeploy is installed; list every page in the nav."""
    src = str(REPO / "src")
    if src not in sys.path:
        sys.path.insert(0, src)
    for name in [m for m in sys.modules if m == "edgedeploy" or m.startswith("edgedeploy.")]:
        del sys.modules[name]
    if config.get("nav"):
        add_unlisted_pages(config["nav"], Path(config["docs_dir"]))
    return config


def add_unlisted_pages(nav: list, docs: Path) -> list[str]:
    """Put each page that mkdocs.yml does not list into its section (or "More"), so none is unreachable."""
    def listed(items) -> set[str]:
        out: set[str] = set()
        for item in items:
            values = item.values() if isinstance(item, dict) else [item]
            for v in values:
                out |= listed(v) if isinstance(v, list) else {str(v)}
        return out

    known = listed(nav)
    added = []
    for page in sorted(p.relative_to(docs).as_posix() for p in docs.rglob("*.md")):
        if page in known or page.startswith("hooks/"):
            continue
        section = next((name for prefix, name in SECTIONS.items()
                        if page == prefix or (prefix.endswith("/") and page.startswith(prefix))), "More")
        entry = next((item for item in nav if isinstance(item, dict) and section in item), None)
        if entry is None:
            entry = {section: []}
            nav.append(entry)
        entry[section].append(page)
        added.append(page)
        log.info("%s is not in mkdocs.yml's nav; listed under %s", page, section)
    return added


def on_page_markdown(markdown: str, page, config, files) -> str:
    def replace(match: re.Match) -> str:
        kind, arg = match.group(1), (match.group(2) or "").strip()
        if kind not in GENERATORS:
            log.warning("%s: unknown generated table '%s'", page.file.src_path, kind)
            return match.group(0)
        return GENERATORS[kind](arg)

    return MARKER.sub(replace, markdown)


# ---------------------------------------------------------------------------------------------------------------
# The one adapter between the code's key tables and the reference pages. When the config modules define
# RECIPE_KEYS / PROJECT_KEYS / TARGET_KEYS (tuples of settings.Key with path, type, default, choices, help),
# those are used as they are; until then the rows are read from the loaders' own tables below.


def key_rows(kind: str) -> list[Row]:
    module, name = {"recipe": ("recipe", "RECIPE_KEYS"), "project": ("project", "PROJECT_KEYS"),
                    "target": ("targets", "TARGET_KEYS")}[kind]
    table = _find_keys(module, name)
    if table is not None:
        rows, tables = [], set()
        for k in table:
            if kind == "project" and k.path.startswith("recipe."):
                continue  # the recipe page lists them
            row = _row_of_key(k)
            parts = row.path.split(".")
            for i in range(1, len(parts)):
                prefix = ".".join(parts[:i])
                if prefix not in tables and not prefix.endswith("NAME"):
                    tables.add(prefix)
                    rows.append(Row(prefix, "table", None, ()))
            rows.append(row)
        if kind == "recipe":  # [palette] defaults the sweep applies where the key table leaves them unset
            used = _palette_defaults()
            rows = [replace(r, default=used[r.path[8:]]) if r.default is None and r.path.startswith("palette.")
                    and used.get(r.path[8:]) is not None else r for r in rows]
        return rows
    rows = {"recipe": _recipe_rows, "project": _project_rows, "target": _target_rows}[kind]()
    return _with_help(kind, rows)


def _row_of_key(k: Any) -> Row:
    """A row from a ``settings.Key``: path ("*" shown as NAME), type, default or required, allowed values, help."""
    default = k.default
    if getattr(k, "required", False):
        default = "(required)"
    elif getattr(k, "required_when", ""):
        default = f"(required for {k.required_when})"
    def bound(value: float) -> str:
        return f"{int(value):,}" if float(value).is_integer() else f"{value:g}"

    lo, hi = getattr(k, "minimum", None), getattr(k, "maximum", None)
    allowed = " and ".join(
        f"{sign} {bound(v)}" for sign, v in ((">" if getattr(k, "exclusive_minimum", False) else "≥", lo),
                                              ("<" if getattr(k, "exclusive_maximum", False) else "≤", hi))
        if v is not None)
    items = getattr(k, "items", None)
    kind = _type_name(k.type) + (f" of {_type_name(items)}s" if items else "")
    return Row(k.path.replace("*", "NAME"), kind, default, tuple(k.choices or ()), k.help or "", allowed)


def _find_keys(module: str, name: str):
    import importlib

    for candidate in (f"edgedeploy.config.{module}", f"edgedeploy.{module}"):
        try:
            mod = importlib.import_module(candidate)
        except ModuleNotFoundError:
            continue
        return getattr(mod, name, None)
    raise ModuleNotFoundError(f"edgedeploy has no {module} module")


def _type_name(kind: Any) -> str:
    if isinstance(kind, str):
        return kind
    return {bool: "boolean", int: "integer", float: "number", str: "string", list: "list", tuple: "list",
            dict: "table"}.get(kind, getattr(kind, "__name__", str(kind)))


def _recipe_rows() -> list[Row]:
    from edgedeploy import recipe as r

    defaults = {f.name: (f.default if f.default is not f.default_factory else f.default_factory())  # type: ignore
                for f in fields(r.Recipe)}
    choices = {"leaves": tuple(r.LEAVES), "pruning_schedule": r.SCHEDULES, "centroid_init": r.CENTROID_INITS,
               "cluster_gradient_aggregation": r.GRADIENT_AGGREGATIONS, "lr_schedule": r.LR_SCHEDULES,
               "qat_ranges": r.QAT_RANGES, "selection_metric": r.SELECTION_METRICS}
    rows = [Row(key, _type_name(kind), defaults[key], choices.get(key, ())) for key, kind in r._SIMPLE.items()]
    for table, keys in r._TABLES.items():
        rows += [Row(f"{table}.{key}", _type_name(kind), defaults[name], choices.get(name, ()))
                 for key, (name, kind) in keys.items()]
    for stage in r.STAGE_KINDS:
        rows += [Row(f"stages.{stage}.epochs", "integer", "(the top-level `epochs`)"),
                 Row(f"stages.{stage}.learning_rate", "number", "(the top-level `learning_rate`)")]
    rows += [Row("layers.NAME.clusters", "integer", "(the top-level `clusters`)"),
             Row("layers.NAME.sparsity", "number", 0.0)]
    palette_defaults = _palette_defaults()
    rows += [Row(f"palette.{key}", _type_name(kind), palette_defaults.get(key), tuple(r.PALETTE_CHOICES.get(key, ())))
             for key, kind in r.PALETTE_KEYS.items()]
    return rows


def _palette_defaults() -> dict[str, Any]:
    """The defaults the sweep passes to ``_palette_opt(recipe, KEY, DEFAULT)``, read from the source that calls it."""
    from edgedeploy import recipe as r

    def constants(folder: Path) -> dict[str, Any]:
        names: dict[str, Any] = {}
        for path in sorted(folder.glob("*.py")):
            for node in ast.parse(path.read_text(encoding="utf-8")).body:
                if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
                    try:
                        names.setdefault(node.targets[0].id, ast.literal_eval(node.value))
                    except ValueError:
                        pass
        return names

    out: dict[str, Any] = {}
    for path in sorted((REPO / "src" / "edgedeploy").rglob("*.py")):
        text = path.read_text(encoding="utf-8")
        if "_palette_opt(" not in text:
            continue
        tree = ast.parse(text)
        names = constants(path.parent)

        def value(node: ast.AST) -> Any:
            if isinstance(node, ast.Name):
                return names.get(node.id, getattr(r, node.id, None))
            if isinstance(node, ast.Subscript) and getattr(node.value, "id", None) == "PALETTE_DEFAULTS":
                return r.PALETTE_DEFAULTS[ast.literal_eval(node.slice)]
            try:
                return ast.literal_eval(node)
            except ValueError:
                return None

        for node in ast.walk(tree):
            if (isinstance(node, ast.Call) and getattr(node.func, "id", None) == "_palette_opt"
                    and len(node.args) == 3 and isinstance(node.args[1], ast.Constant)):
                out.setdefault(node.args[1].value, value(node.args[2]))
    return out


def _project_rows() -> list[Row]:
    from edgedeploy import project as p
    from edgedeploy.compile import CompileOptions
    from edgedeploy.errors import UsageError
    from edgedeploy.report import Requirements

    top = {"model": Row("model", "string", "(required)"), "data": Row("data", "string", "(required)"),
           "out": Row("out", "string", "edgedeploy-out"), "targets": Row("targets", "list", []),
           "trust_lambda": Row("trust_lambda", "boolean", False), "recipe": Row("recipe", "table", {}),
           "compile": Row("compile", "table", {}), "requirements": Row("requirements", "table", {})}
    rows = [top.get(key, Row(key, "", None)) for key in sorted(p.KNOWN, key=lambda k: list(top).index(k)
                                                              if k in top else len(top))]
    # The [compile] keys the loader accepts, as its own error message lists them.
    with tempfile.TemporaryDirectory() as tmp:
        probe = Path(tmp) / "edgedeploy.toml"
        probe.write_text("[compile]\nzz_probe = 1\n", encoding="utf-8")
        try:
            p.load_project(probe)
            raise RuntimeError("the project loader accepted an unknown [compile] key")
        except UsageError as exc:
            compile_keys = [k.strip() for k in (exc.hint or "").split(":", 1)[1].split(",")]
    defaults = CompileOptions()
    types = {f.name: f.type for f in fields(CompileOptions)}
    rows += [Row(f"compile.{key}", _type_name(_annotation(types[key])), getattr(defaults, key)) for key in compile_keys]
    req_types = {f.name: f.type for f in fields(Requirements)}
    rows += [Row(f"requirements.{key}", _type_name(_annotation(req_types[key])), None) for key in Requirements.KEYS]
    return rows


def _annotation(text: Any) -> Any:
    text = str(text).replace(" | None", "")
    return {"int": int, "float": float, "bool": bool, "str": str}.get(text, text)


def _target_rows() -> list[Row]:
    """Every key the target loader reads, recorded while it loads the built-in target files."""
    from edgedeploy import targets as t

    seen: dict[str, Row] = {}
    required_in: dict[str, list[bool]] = {}
    base = t._Reader

    class Recording(base):  # type: ignore[misc, valid-type]
        def _note(self, key: str, kind: str, required: bool, allowed: tuple = ()) -> None:
            path = f"{self.prefix}{key}"
            required_in.setdefault(path, []).append(required)
            example = self.data.get(key)
            if path not in seen or (seen[path].default is None and example is not None and kind != "table"):
                seen[path] = Row(path, kind, None if kind == "table" else example, tuple(allowed or ()))

        def table(self, key, required=True):
            self._note(key, "table", required)
            return super().table(key, required)

        def string(self, key, allowed=None, required=True):
            self._note(key, "string", required, allowed or ())
            return super().string(key, allowed, required)

        def integer(self, key, minimum=0, required=True):
            self._note(key, "integer", required)
            seen[f"{self.prefix}{key}"] = replace(seen[f"{self.prefix}{key}"], allowed=f"≥ {minimum:,}")
            return super().integer(key, minimum, required)

    t._Reader = Recording
    files = sorted(t.builtin_targets_dir().glob("*.toml"))
    try:
        for path in files:
            import tomllib

            t._parse(path, tomllib.loads(path.read_text(encoding="utf-8")))
    finally:
        t._Reader = base
    def need(row: Row) -> Row:
        flags = required_in[row.path]
        if all(flags) and len(flags) == len(files):
            return Row(row.path, row.type, "(required)", row.choices)
        if any(flags):
            return Row(row.path, row.type, "(required for boards)", row.choices)
        return row

    rows = [need(r) for r in seen.values()]
    if "fvp.params" in seen:
        rows.append(Row("fvp.params.NAME", "string or number", None))
    return rows


# Descriptions of the keys while the code has none of its own (settings.Key.help replaces these).
HELP: dict[str, dict[str, str]] = {
    "recipe": {
        "leaves": "Leaves of the deployment tree to build (palette leaves only when named).",
        "sparsity": "Fraction of zeros the pruned node reaches.",
        "clusters": "Clusters per weight tensor (TFMOT clustering), palette values per tensor (palette leaves).",
        "per_channel_clusters": "TFMOT's per-channel clustering for convolutions.",
        "epochs": "Fine-tuning epochs of every stage.",
        "batch_size": "Training batch size.",
        "learning_rate": "Peak learning rate of the warm-up and cosine schedule.",
        "seed": "Seed of training, sample choices and calibration.",
        "skip_layers": "Layers never pruned or clustered.",
        "float_io": "Keep float input and output (QUANTIZE/DEQUANTIZE at the edges).",
        "calibration_samples": "Fine-tune samples (random, seeded) that calibrate PTQ leaves.",
        "sparsity_tolerance": "How far below its parent's sparsity a stage may fall before it fails (exit 9).",
        "fuse_relu": "Fold a separate ReLU after a Conv/Dense layer into it before QAT.",
        "plain": "TFMOT's plain fine-tuning recipe; keys given explicitly still win.",
        "pruning.schedule": "Gradual (polynomial) or one-shot (constant) pruning.",
        "pruning.end_fraction": "Fraction of the stage's steps by which the polynomial schedule reaches the target.",
        "clustering.centroid_init": "TFMOT's centroid initialisation.",
        "clustering.gradient_aggregation": "How TFMOT aggregates gradients of one cluster.",
        "distillation.enabled": "Distil from the float model (soft targets) besides the labels.",
        "distillation.temperature": "Softmax temperature of the soft targets.",
        "distillation.label_weight": "Weight of the labels' loss against the soft targets'.",
        "training.lr_schedule": "Learning-rate schedule.",
        "training.warmup_fraction": "Fraction of the steps spent warming the learning rate up.",
        "training.freeze_batch_norm": "Keep batch-norm statistics fixed while fine-tuning.",
        "training.freeze_batch_norm_after": "Epochs trained before batch norms are frozen.",
        "training.qat_ranges": "Where QAT activation ranges start: the float parent's, or TFMOT's [-6, 6].",
        "selection.validation_fraction": "Fine-tune samples held out to pick the best epoch (0: off).",
        "selection.patience": "Epochs without improvement before stopping (0: never stop early).",
        "selection.restore_best": "Keep the best epoch's weights rather than the last.",
        "selection.metric": "What judges the best epoch on the hold-out.",
        "stages.prune.epochs": "Epochs of the pruning stage.",
        "stages.prune.learning_rate": "Learning rate of the pruning stage.",
        "stages.cluster.epochs": "Epochs of the clustering stages.",
        "stages.cluster.learning_rate": "Learning rate of the clustering stages.",
        "stages.qat.epochs": "Epochs of the QAT stages.",
        "stages.qat.learning_rate": "Learning rate of the QAT stages.",
        "layers.NAME.clusters": "Palette values of this layer's kernel (2 to 32); wins over the sweep.",
        "layers.NAME.sparsity": "Extra pruning of this layer in the palette node; wins over the sweep.",
        "palette.search": "Run the per-layer sensitivity sweep.",
        "palette.accuracy_budget": "Points the sweep's plan may lose (as estimated).",
        "palette.holdout": "Fraction of fine-tune samples held out for the sweep's measurements.",
        "palette.clusters": "Palette sizes the sweep tries per layer.",
        "palette.sparsities": "Extra sparsities the sweep tries per layer.",
        "palette.executor": "Where the sweep's measurements run.",
        "palette.workers": "Worker processes of the sweep.",
        "palette.target": "Vela target whose encoded bytes the sweep counts.",
        "palette.measure_on": "Samples the sweep measures drops on.",
        "palette.measure_samples": "At most this many fine-tune samples (random, seeded) are measured.",
        "palette.budget_from": "Count the budget from every layer at 32 values, or from the pruned parent.",
        "palette.projection": "Error-compensating (GPTQ) or nearest-value projection onto the palette.",
        "palette.hessian_samples": "Fine-tune samples (random, seeded) behind each layer's input second moment.",
        "palette.drop_estimate": "Judge a drop by the loss rise times a fitted slope, or by the measured accuracy.",
        "palette.size_budget": "Instead of an accuracy budget: at most this fraction of ptq's encoded weights.",
        "palette.scales": "Channel scales: max|w|/127, or fitted together with the palette.",
    },
    "project": {
        "model": "Float Keras model (.h5 or .keras), relative to the project file.",
        "data": "Data set (.npz), relative to the project file.",
        "out": "Run folder, relative to the project file.",
        "targets": "Built-in target names, or paths of target files relative to the project file.",
        "trust_lambda": "Load tf_keras Lambda layers (they run code stored in the model file).",
        "recipe": "A recipe table: the keys of a recipe file (see below).",
        "compile": "Vela settings of the project's compiles.",
        "requirements": "What `edgedeploy report --project` judges the leaves against.",
        "compile.optimise": "Vela's --optimise (Performance or Size).",
        "compile.allow_cpu_ops": "Accept operators Vela leaves on the CPU instead of failing (exit 7).",
        "compile.jobs": "Vela worker processes (default: one per CPU, at most the number of compiles).",
        "compile.debug_db": "Vela's debug database: per-layer encoded weights (on by default with a palette leaf).",
        "requirements.max_accuracy_drop": "Points of int8 accuracy below the ptq leaf.",
        "requirements.max_flash": "Bytes of the compiled model (an integer, or a size such as \"512KiB\").",
        "requirements.max_sram": "Bytes of Vela's SRAM estimate (an integer or a size).",
        "requirements.max_latency_ms": "Milliseconds at the target's NPU clock.",
    },
    "target": {
        "schema_version": "Version of the target file format.",
        "name": "Name of the target.",
        "kind": "An NPU configuration, or a board (which adds cpu, memory and fvp).",
        "description": "One line shown by `edgedeploy targets list`.",
        "npu": "The NPU.",
        "npu.accelerator_config": "Vela's --accelerator-config.",
        "vela": "Vela's configuration file and sections.",
        "vela.config": "Vela's bundled Arm/vela.ini, or a path relative to the target file.",
        "vela.system_config": "A System_Config section of that file.",
        "vela.memory_mode": "A Memory_Mode section of that file.",
        "clocks": "Clocks.",
        "clocks.npu_hz": "NPU clock in Hz; latency = cycles / npu_hz.",
        "cpu": "The board's CPU (boards only).",
        "cpu.core": "CPU core, e.g. cortex-m55.",
        "memory": "The board's memories (boards only).",
        "memory.sram_bytes": "SRAM for the tensor arena.",
        "memory.flash_bytes": "Flash (or DRAM) the model is read from.",
        "memory.runtime_margin_bytes": "Bytes kept back for the runtime when judging whether a model fits.",
        "memory.model_section": "Linker section the exported model is placed in.",
        "fvp": "The board's Corstone FVP (boards only).",
        "fvp.binary": "FVP executable name.",
        "fvp.num_macs_param": "The FVP parameter that sets the NPU's MACs.",
        "fvp.model_address": "Address the compiled model is loaded at.",
        "fvp.input_address": "Address the input is loaded at.",
        "fvp.output_address": "Address the output is read from.",
        "fvp.params": "Further -C parameters of the FVP.",
        "fvp.params.NAME": "One -C NAME=VALUE parameter.",
    },
}


def _with_help(kind: str, rows: list[Row]) -> list[Row]:
    helps = HELP[kind]
    paths = {r.path for r in rows}
    for stale in sorted(set(helps) - paths):
        log.warning("docs/hooks/reference.py describes %s key '%s', which the code does not have", kind, stale)
    for row in rows:
        if row.path not in helps:
            log.warning("%s key '%s' has no description in docs/hooks/reference.py", kind, row.path)
    return [Row(r.path, r.type, r.default, r.choices, helps.get(r.path, "")) for r in rows]


# ---------------------------------------------------------------------------------------------------------------
# Markdown


def _cell(value: Any) -> str:
    text = str(value).replace("|", "\\|").replace("\n", " ")
    return text


def _code(value: Any) -> str:
    if value is None or value == "":
        return ""
    if isinstance(value, bool):
        return f"`{str(value).lower()}`"
    if isinstance(value, (tuple, list)):
        return "`[" + ", ".join(f'"{v}"' if isinstance(v, str) else str(v) for v in value) + "]`"
    if isinstance(value, dict):
        return "" if not value else f"`{value}`"
    if isinstance(value, str) and value.startswith("("):
        return value
    if isinstance(value, str):
        return f'`"{value}"`'
    return f"`{value}`"


def _keys_table(kind: str) -> str:
    lines = ["| key | type | default | allowed values | what it sets |", "|---|---|---|---|---|"]
    for r in key_rows(kind):
        lines.append(f"| `{r.path}` | {r.type} | {_cell(_code(r.default))} | {_allowed(r)} | {_cell(r.help)} |")
    return "\n".join(lines)


def _allowed(r: Row) -> str:
    return ", ".join(f"`{c}`" for c in r.choices) if r.choices else _cell(r.allowed)


def _target_keys_table(_: str) -> str:
    lines = ["| key | type | required, or an example from the built-in files | allowed values | what it is |",
             "|---|---|---|---|---|"]
    for r in key_rows("target"):
        lines.append(f"| `{r.path}` | {r.type} | {_cell(_code(r.default))} | {_allowed(r)} | {_cell(r.help)} |")
    return "\n".join(lines)


def _targets(_: str) -> str:
    from edgedeploy.targets import list_targets

    lines = ["| name | kind | accelerator | Vela system config | memory mode | NPU clock (MHz) | description |",
             "|---|---|---|---|---|---|---|"]
    for t in list_targets():
        lines.append(f"| `{t.name}` | {t.kind} | `{t.accelerator_config}` | `{t.vela.system_config}` | "
                     f"`{t.vela.memory_mode}` | {t.npu_hz / 1e6:g} | {_cell(t.description)} |")
    return "\n".join(lines)


def _tree(_: str) -> str:
    from edgedeploy.recipe import LEAVES, NODES

    lines = ["| node | parent | technique | leaf (converted to int8) |", "|---|---|---|---|"]
    converted = {node: leaf for leaf, node in LEAVES.items() if leaf != "ptq"}
    for node, (parent, technique) in NODES.items():
        leaf = "`ptq`" if node == "baseline" else (f"`{converted[node]}`" if node in converted else "")
        lines.append(f"| `{node}` | {f'`{parent}`' if parent else ''} | {technique or ''} | {leaf} |")
    return "\n".join(lines)


def _exit_codes(_: str) -> str:
    from edgedeploy import errors

    classes = [c for c in vars(errors).values()
               if isinstance(c, type) and issubclass(c, errors.EdgeDeployError) and c is not errors.EdgeDeployError]
    lines = ["| exit | error | when |", "|---|---|---|"]
    for c in sorted(classes, key=lambda c: c.exit_code):
        lines.append(f"| {c.exit_code} | `{c.__name__}` | {_cell((c.__doc__ or '').strip().splitlines()[0])} |")
    return "\n".join(lines)


def _options(command: str) -> str:
    import typer

    cmd: Any = typer.main.get_command(_cli_app())
    for word in command.split():
        cmd = (getattr(cmd, "commands", None) or {}).get(word)
        if cmd is None:
            log.warning("no command '%s' in the command line", command)
            return ""
    ctx = cmd.make_context(command.split()[-1], [], resilient_parsing=True)
    lines = ["| argument or option | what it does (as `--help` says it) |", "|---|---|"]
    for p in cmd.params:
        if getattr(p, "hidden", False) or p.name == "help":
            continue
        record = p.get_help_record(ctx)
        if record is None:  # an argument
            name = f"`{p.name.upper()}`" + (" …" if p.nargs == -1 else "")
            record = (name, getattr(p, "help", "") or "")
            lines.append(f"| {record[0]} | {_cell(record[1])} |")
        else:
            lines.append(f"| `{record[0]}` | {_cell(record[1])} |")
    return "\n".join(lines)


def _cli_app():
    """The typer application of the command line (``edgedeploy.cli.app.app``)."""
    from edgedeploy.cli.app import app

    return app


GENERATORS: dict[str, Callable[[str], str]] = {
    "recipe-keys": lambda _: _keys_table("recipe"),
    "project-keys": lambda _: _keys_table("project"),
    "target-keys": _target_keys_table,
    "targets": _targets,
    "tree": _tree,
    "exit-codes": _exit_codes,
    "options": _options,
}
