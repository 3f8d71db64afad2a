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
    for name in ("optimize", "walk", "build_report", "export_bundle", "emulate_bundle", "serve_bundle",
                 "verify_run", "fvp_run", "doctor", "list_targets", "get_target", "read_tflite", "load_recipe"):
        assert name in PUBLIC


def test_the_api_has_one_compile_and_leaves_the_command_line_s_tables_to_it():
    """A script compiles .tflite files, a run folder or a project with ``api.compile`` alone; the rows, columns
    and rich tables the command line prints are its own (``api.process``), not the face's."""
    from edgedeploy.api import process

    assert [name for name in PUBLIC if name.startswith("compile") and not name[0].isupper()] == ["compile",
                                                                                                 "compile_json"]
    assert not set(PUBLIC) & set(process.__all__)
    for name in ("leaves_table", "compile_rows", "compile_columns", "sweep_columns"):
        assert name in process.__all__ and not hasattr(api, name)


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


def _walk(model):
    return api.walk(model, "d.npz", "out", api.load_recipe(), ["ethos-u55-128"], api.requirements(max_npu_cycles=9))


@pytest.mark.parametrize("call,line", [
    (lambda: edgedeploy_optimize({}, "d.npz", "out"),
     "model is a dict, not a Keras model or the path of a .h5 or .keras file. pass a tf_keras or Keras 3 model"),
    (lambda: edgedeploy_optimize(None, "d.npz", "out"), "model is None, not a Keras model or the path of a .h5"),
    (lambda: edgedeploy_optimize(5, "d.npz", "out"), "model is an int, not a Keras model or the path of a .h5"),
    (lambda: edgedeploy_optimize("m.h5", "d.npz", None), "out is None, not a folder"),
    (lambda: edgedeploy_optimize("m.h5", "d.npz", "out", recipe=3), "recipe is an int, not a recipe .toml file"),
    (lambda: edgedeploy_optimize("m.h5", "d.npz", "out", bogus_key=1),
     "recipe with the options given by name: unknown key `bogus_key`"),
    (lambda: edgedeploy_optimize("m.h5", "d.npz", "out", epochz=1), "unknown key `epochz`. did you mean `epochs`?"),
    (lambda: api.optimize("m.h5", "d.npz", "out", settings={"lr_shedule": "cosine"}),
     "unknown key `lr_shedule`. did you mean `lr_schedule`?"),
    (lambda: api.optimize(b"m.h5", "d.npz", "out"), "model is a bytes, not a Keras model"),
    (lambda: edgedeploy_optimize("m.h5", 5, "out"),
     "data is an int, not (x, y) arrays, ((x_train, y_train), (x_test, y_test)), a dict of .npz arrays, "
     "a tf.data.Dataset, or the path of an .npz file or a data folder. pass e.g. (x, y) numpy arrays"),
    (lambda: edgedeploy_optimize("m.h5", None, "out"), "data is None, not (x, y) arrays"),
    (lambda: edgedeploy_optimize("m.h5", [1, 2], "out"), "data is a list, not (x, y) arrays"),
    (lambda: edgedeploy_optimize("m.h5", (1, 2, 3), "out"), "data is a tuple of 3, not (x, y) arrays"),
    (lambda: edgedeploy_optimize("m.h5", "d.npz", "out", calibration=5),
     "calibration is an int, not a representative_dataset-style function, an iterable of input arrays"),
    (lambda: edgedeploy_optimize("m.h5", "d.npz", "out", calibration="cal.npz"), "calibration is a str, not a"),
    (lambda: edgedeploy_optimize("m.h5", "d.npz", "out", preprocess=3),
     "preprocess is an int, not a function or its module:function name"),
    (lambda: edgedeploy_optimize("m.h5", "d.npz", "out", labels="yes,no"), "labels is a str, not a list of class"),
    (lambda: edgedeploy_optimize("m.h5", "d.npz", "out", batched="yes"), "batched is a str, not True, False or None"),
    (lambda: _walk({"layers": []}), "model is a dict, not the path of a .h5 or .keras file"),
    (lambda: api.optimize(None, "d.npz", "out", recipe=api.load_recipe()), "model is None, not a Keras model or the"),
    (lambda: api.optimize("m.h5", 7, "out", recipe=api.load_recipe()), "data is an int, not (x, y) arrays"),
    (lambda: api.optimize("m.h5", "d.npz", "out", recipe=api.load_recipe(), settings={"epochs": 1}),
     "a loaded Recipe is given with settings beside it"),
    (lambda: api.optimize("m.h5", "d.npz", "out", executor="spark"), "--executor is 'spark'"),
    (lambda: api.compile(5, ["ethos-u55-128"], "out"), "sources is an int, not a list of paths (each a model file"),
    (lambda: api.compile([None], ["ethos-u55-128"], "out"), "sources[0] is None, not a model file, a run folder"),
    (lambda: api.compile(["m.tflite"], 5, "out"), "targets is an int, not a list of target names or files"),
    (lambda: api.compile([{}], ["ethos-u55-128"], "out"), "sources[0] is a dict, not a model file, a run folder"),
    (lambda: api.compile(["m.tflite"], ["ethos-u55-128"], 5), "out is an int, not a folder"),
    (lambda: api.read_tflite(5), "path is an int, not a .tflite file"),
])
def test_arguments_of_the_wrong_kind_are_one_usage_error_naming_the_argument(tmp_path, monkeypatch, call, line):
    """What is not a model, a path or a recipe key is refused where the Python API receives it, with one line
    (exit 2 on the command line), before TensorFlow is imported or anything is written."""
    from edgedeploy.errors import UsageError

    monkeypatch.chdir(tmp_path)
    with pytest.raises(UsageError) as err:
        call()
    assert line in err.value.one_line() and "\n" not in err.value.one_line()
    assert list(tmp_path.iterdir()) == []


def test_one_target_name_or_path_alone_is_a_list_of_one():
    from edgedeploy.interactive.arguments import as_paths, target_names

    assert target_names("ethos-u55-128") == ["ethos-u55-128"]
    assert [p.name for p in as_paths("m.tflite", "models", "a file")] == ["m.tflite"]


def edgedeploy_optimize(*args, **kwargs):
    import edgedeploy

    return edgedeploy.optimize(*args, **kwargs)
