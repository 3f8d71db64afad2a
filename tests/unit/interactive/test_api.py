"""edgedeploy.api: every public name typed and documented, light to import, and the recipe defaults written once."""

from __future__ import annotations

import dataclasses
import inspect
import subprocess
import sys

import pytest
from typer.testing import CliRunner

from edgedeploy import api

PUBLIC = sorted(api.__all__)


# Dataclasses whose only text is the one dataclasses writes (their fields): none.
FIELDS_ONLY: set[str] = set()


@pytest.mark.parametrize("name", PUBLIC)
def test_every_public_name_has_a_docstring_and_a_typed_signature(name):
    obj = getattr(api, name)
    doc = (inspect.getdoc(obj) or "").strip()
    assert doc, f"api.{name} has no docstring"
    if inspect.isclass(obj):
        written = not doc.startswith(f"{obj.__name__}(")  # not the text dataclasses generates
        assert written or name in FIELDS_ONLY, f"api.{name} has no docstring of its own"
        return
    sig = inspect.signature(obj)
    loose = [p.name for p in sig.parameters.values() if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
    assert not loose, f"api.{name} takes *{loose}: name its parameters"
    untyped = [p.name for p in sig.parameters.values() if p.annotation is inspect.Parameter.empty]
    assert not untyped, f"api.{name}: parameters without a type: {untyped}"
    assert sig.return_annotation is not inspect.Signature.empty, f"api.{name} has no return type"


def test_the_public_names_exist_once_and_include_each_command_s_entry_point():
    assert len(PUBLIC) == len(set(PUBLIC))
    for name in ("optimize", "optimize_tree", "build_report", "export_bundle", "emulate_bundle", "serve_bundle",
                 "verify_run", "fvp_run", "doctor", "list_targets", "get_target", "read_tflite", "load_recipe"):
        assert name in PUBLIC


def test_importing_the_api_imports_no_heavy_module():
    code = ("import sys, edgedeploy.api; "
            "print(sorted(m for m in ('tensorflow', 'numpy', 'ethosu', 'edgedeploy.pipeline', 'edgedeploy.report', "
            "'edgedeploy.config.recipe') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_the_recipe_defaults_are_the_key_table_s():
    from edgedeploy.config.recipe import RECIPE_KEYS, Recipe

    keys = {k.name: k for k in RECIPE_KEYS if not k.path.startswith(("stages.", "layers.", "palette."))}
    tables = {"stage_epochs", "stage_learning_rates", "layers", "palette"}  # [stages], [layers.NAME], [palette]
    fields = {f.name: f for f in dataclasses.fields(Recipe)}
    assert set(fields) - tables == set(keys)  # every field has its key, and every key its field
    recipe = Recipe()
    for name, key in keys.items():
        expected = tuple(key.default) if isinstance(key.default, list) else key.default
        assert getattr(recipe, name) == expected, name


def test_the_optimize_help_is_written_from_the_key_table():
    from edgedeploy.cli import optimize as command
    from edgedeploy.cli.app import app
    from edgedeploy.config.recipe import PLAIN

    for option, path in command.RECIPE_OPTIONS.items():
        key = api.recipe_key(path)
        text = command.recipe_help(option)
        if key.default not in ("", None):
            assert f"Default {command._shown(key.default)}" in text, option
        if key.name in PLAIN and PLAIN[key.name] != key.default:
            assert f"(--plain: {command._shown(PLAIN[key.name])})" in text, option
    result = CliRunner().invoke(app, ["optimize", "--help"], env={"COLUMNS": "400", "NO_COLOR": "1"})
    assert result.exit_code == 0, result.output
    line = next(line for line in result.output.splitlines() if "--batch-size" in line)
    assert "Fine-tuning batch size. Default 32 (--plain: 64)." in line
    assert "recipe key: " not in result.output  # every marker was replaced


def test_an_option_given_on_the_command_line_wins_over_the_recipe_file_and_one_left_out_does_not(tmp_path):
    recipe = tmp_path / "r.toml"
    recipe.write_text("epochs = 7\nseed = 3\n")
    assert api.load_recipe(recipe, {"epochs": 2, "seed": None}).epochs == 2
    assert api.load_recipe(recipe, {"epochs": 2, "seed": None}).seed == 3
