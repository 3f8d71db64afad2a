"""The docs site's file reference is generated from the loaders, and what it says is what they accept."""

from __future__ import annotations

import importlib.util
import logging
import sys
import tomllib
from pathlib import Path

import pytest

from edgedeploy.errors import EdgeDeployError
from edgedeploy.pipeline.project import load_project
from edgedeploy.config.recipe import load_recipe
from edgedeploy.config.targets import builtin_targets_dir

REPO = Path(__file__).resolve().parents[3]


@pytest.fixture(scope="module")
def ref():
    spec = importlib.util.spec_from_file_location("docs_reference_hook", REPO / "docs" / "hooks" / "reference.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclass looks its module up
    spec.loader.exec_module(module)
    return module


def _table(path: str, value) -> dict:
    """``{"a": {"b": value}}`` for the key path ``a.b``."""
    *tables, key = path.split(".")
    doc: dict = {}
    node = doc
    for t in tables:
        node = node.setdefault(t, {})
    node[key] = value
    return doc


def test_every_documented_recipe_key_is_accepted_with_its_documented_default(ref, caplog):
    with caplog.at_level(logging.WARNING):
        rows = ref.key_rows("recipe")
    assert not caplog.records, [r.getMessage() for r in caplog.records]  # every key described, none stale
    plain = load_recipe(table={})
    for row in rows:
        if row.default is None or str(row.default).startswith("("):
            continue
        path = row.path.replace("NAME", "conv2d")
        table = _table(path, list(row.default) if isinstance(row.default, tuple) else row.default)
        if path.startswith("palette.") and path != "palette.search":
            table["palette"]["search"] = True
        recipe = load_recipe(table=table)  # a wrong key or type raises UsageError
        if "." not in path:
            assert getattr(recipe, path) == getattr(plain, path), path
    with pytest.raises(EdgeDeployError, match="unknown key"):
        load_recipe(table={"not_a_recipe_key": 1})
    documented = {r.path.split(".")[0] for r in rows}
    assert {"leaves", "pruning", "clustering", "distillation", "training", "selection", "stages", "layers",
            "palette"} <= documented


def test_documented_choices_are_the_accepted_ones(ref):
    for row in ref.key_rows("recipe"):
        for choice in row.choices:
            if row.path == "leaves":
                load_recipe(table={"leaves": [choice]})
            else:
                table = _table(row.path, choice)
                if row.path.startswith("palette."):
                    table["palette"]["search"] = True
                load_recipe(table=table)
        if row.choices and row.path != "leaves":  # (a value of the choices' own type: an int key's, an int)
            numbers = all(isinstance(c, int) and not isinstance(c, bool) for c in row.choices)
            table = _table(row.path, max(row.choices) + 1 if numbers else "not-a-choice")
            if row.path.startswith("palette."):
                table["palette"]["search"] = True
            with pytest.raises(EdgeDeployError, match="allowed values"):
                load_recipe(table=table)


def test_target_keys_cover_every_key_of_every_built_in_file(ref):
    rows = {r.path: r for r in ref.key_rows("target")}

    def flatten(doc: dict, prefix: str = "") -> set[str]:
        """The paths of the values (not the tables) in a target file; ``fvp.params`` holds free names."""
        out = set()
        for key, value in doc.items():
            path = f"{prefix}{key}"
            if path == "fvp.params":
                out.add("fvp.params.NAME")
            elif isinstance(value, dict):
                out |= flatten(value, path + ".")
            else:
                out.add(path)
        return out

    used = set()
    for f in builtin_targets_dir().glob("*.toml"):
        used |= flatten(tomllib.loads(f.read_text(encoding="utf-8")))
    assert used <= set(rows), used - set(rows)
    assert rows["kind"].choices == ("npu", "board") and rows["name"].default == "(required)"
    assert rows["memory.sram_bytes"].default == "(required for boards)"


def test_project_keys_are_what_the_loader_accepts(ref, tmp_path):
    rows = ref.key_rows("project")
    compile_keys = [r.path.split(".", 1)[1] for r in rows if r.path.startswith("compile.")]
    assert {"optimise", "allow_cpu_ops", "jobs", "debug_db"} == set(compile_keys)
    (tmp_path / "m.h5").write_bytes(b"")
    (tmp_path / "d.npz").write_bytes(b"")
    values = {"optimise": "Size", "allow_cpu_ops": True, "jobs": 2, "debug_db": True}
    text = 'model = "m.h5"\ndata = "d.npz"\n[compile]\n' + "".join(
        f"{k} = {str(values[k]).lower() if isinstance(values[k], bool) else repr(values[k]).replace(chr(39), chr(34))}\n"
        for k in compile_keys)
    project = load_project(_write(tmp_path / "edgedeploy.toml", text))
    assert project.compile.optimise == "Size" and project.compile.jobs == 2 and project.compile.debug_db
    top = {r.path for r in rows if "." not in r.path}
    for key in top:
        assert key in {"model", "data", "out", "targets", "trust_lambda", "recipe", "compile", "requirements", "models"}


def _write(path: Path, text: str) -> Path:
    path.write_text(text, encoding="utf-8")
    return path


def test_a_key_without_help_is_a_warning_that_fails_a_strict_build(ref, caplog, monkeypatch):
    from edgedeploy.config import targets
    from edgedeploy.config.keys import Key

    monkeypatch.setattr(targets, "TARGET_KEYS", (*targets.TARGET_KEYS, Key("clocks.cpu_hz", int, minimum=1)))
    with caplog.at_level(logging.WARNING):
        rows = {r.path: r for r in ref.key_rows("target")}
    assert "target key 'clocks.cpu_hz' has no help text" in caplog.text
    assert rows["clocks.cpu_hz"].allowed == "≥ 1" and rows["clocks"].type == "table"


def test_generated_markers_are_replaced_and_unknown_ones_are_reported(ref, caplog):
    class Page:
        class file:
            src_path = "x.md"

    text = ("a\n<!-- generated: exit-codes -->\n<!-- generated: options compile -->\n<!-- generated: tree -->\n"
            "<!-- generated: nonsense -->\n")
    with caplog.at_level(logging.WARNING):
        out = ref.on_page_markdown(text, Page, None, None)
    assert "| 7 | `CpuFallbackError` |" in out and "| 10 | `RegressionError` |" in out
    assert "--target" in out and "--jobs" in out
    assert "| `pcqat` | `pruned_clustered` | qat |" in out and "`ptq_16x8`: int16x8" in out
    assert "<!-- generated: nonsense -->" in out and "unknown generated table 'nonsense'" in caplog.text


def test_a_page_missing_from_the_nav_joins_its_section(ref, tmp_path):
    for page in ("index.md", "commands/compile.md", "emulate.md", "results/startup.md", "notes.md"):
        (tmp_path / page).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / page).write_text("# x\n")
    nav = [{"Home": "index.md"}, {"Commands": [{"compile": "commands/compile.md"}]}]
    assert ref.add_unlisted_pages(nav, tmp_path) == ["emulate.md", "notes.md", "results/startup.md"]
    assert nav == [{"Home": "index.md"}, {"Commands": [{"compile": "commands/compile.md"}, "emulate.md"]},
                   {"More": ["notes.md"]}, {"Results": ["results/startup.md"]}]
