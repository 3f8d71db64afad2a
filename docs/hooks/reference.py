"""MkDocs hook: reference tables generated from the code's own tables, so the site cannot drift from it.

A page asks for a table with a marker line, e.g. ``<!-- generated: recipe-keys -->``. The hook replaces it
with Markdown built from the checkout's ``src/edgedeploy`` at build time: file keys (``recipe-keys``,
``project-keys``, ``target-keys``), the built-in targets (``targets``), the deployment tree (``tree``), the
exit codes (``exit-codes``) and a command's options (``options compile``, ``options fvp run`` ...).
An unknown marker, a command the CLI does not have, or a key without help text is logged as a warning, which
``mkdocs build --strict`` turns into a failed build; a key table the code no longer has stops the build.
A page that ``mkdocs.yml`` leaves out of the nav is listed in its section (or under "More").
"""

from __future__ import annotations

import ast
import logging
import re
import sys
from dataclasses import dataclass, replace
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


# The one adapter between the code's key tables and the reference pages: RECIPE_KEYS, PROJECT_KEYS and
# TARGET_KEYS, tuples of settings.Key (path, type, default, choices, range, help, required ...).


def key_rows(kind: str) -> list[Row]:
    """The rows of one file kind's reference: a row per table, then its keys; a key without help is a warning."""
    module, name = {"recipe": ("recipe", "RECIPE_KEYS"), "project": ("project", "PROJECT_KEYS"),
                    "target": ("targets", "TARGET_KEYS")}[kind]
    table = _find_keys(module, name)
    if table is None:
        raise RuntimeError(f"edgedeploy's {module} module has no {name} table to document")
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
        if not row.help:
            log.warning("%s key '%s' has no help text in %s.%s", kind, row.path, module, name)
        rows.append(row)
    if kind == "recipe":  # [palette] defaults the sweep applies where the key table leaves them unset
        used = _palette_defaults()
        rows = [replace(r, default=used[r.path[8:]]) if r.default is None and r.path.startswith("palette.")
                and used.get(r.path[8:]) is not None else r for r in rows]
    return rows


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

    for candidate in (f"edgedeploy.config.{module}", f"edgedeploy.pipeline.{module}"):
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


def _palette_defaults() -> dict[str, Any]:
    """The defaults the sweep passes to ``_palette_opt(recipe, KEY, DEFAULT)``, read from the source that calls it."""
    from edgedeploy.config import recipe as r

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
    from edgedeploy.config.targets import list_targets

    lines = ["| name | kind | accelerator | Vela system config | memory mode | NPU clock (MHz) | description |",
             "|---|---|---|---|---|---|---|"]
    for t in list_targets():
        lines.append(f"| `{t.name}` | {t.kind} | `{t.accelerator_config}` | `{t.vela.system_config}` | "
                     f"`{t.vela.memory_mode}` | {t.npu_hz / 1e6:g} | {_cell(t.description)} |")
    return "\n".join(lines)


def _tree(_: str) -> str:
    """The node table and the leaves converted from each node (edgedeploy.config.tree)."""
    from edgedeploy.config.tree import LEAF_TABLE, NODE_TABLE

    lines = ["| node | parent | technique | level | leaves: conversion |", "|---|---|---|---|---|"]
    for node in NODE_TABLE.values():
        leaves = ", ".join(f"`{leaf.name}`: {leaf.conversion}" + ("" if leaf.default else " (asked for by name)")
                           for leaf in LEAF_TABLE.values() if leaf.node == node.name)
        lines.append(f"| `{node.name}` | {f'`{node.parent}`' if node.parent else ''} | {node.technique or ''} | "
                     f"{node.level} | {leaves} |")
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
