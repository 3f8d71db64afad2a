"""Project files listing several models ([[models]] tables): typed and checked like every other key; a bad
file is one line naming the file and the fix, with its own exit code, and nothing is written. No TensorFlow."""

from __future__ import annotations

from pathlib import Path

import pytest

from helpers import run_cli, run_in_process

from edgedeploy.errors import InvalidInputError, UsageError
from edgedeploy import api
from edgedeploy.pipeline.project import load_project

TOP = 'data = "d.npz"\nout = "out"\ntargets = ["ethos-u55-128"]\n[recipe]\nleaves = ["ptq", "pruned"]\nsparsity = 0.5\n'
TWO = TOP + ('[[models]]\nname = "a"\nmodel = "a.h5"\n'
             '[[models]]\nname = "b-2"\nmodel = "b.h5"\ndata = "e.npz"\ntrust_lambda = true\n'
             'recipe = { sparsity = 0.75, pruning = { end_fraction = 0.5 } }\n')


def write(tmp_path: Path, text: str) -> Path:
    for name in ("a.h5", "b.h5", "d.npz", "e.npz"):
        (tmp_path / name).write_bytes(b"")
    path = tmp_path / "edgedeploy.toml"
    path.write_text(text, encoding="utf-8")
    return path


def test_two_models_with_defaults_and_recipe_overrides(tmp_path):
    p = load_project(write(tmp_path, TWO))
    assert p.is_sweep and p.model is None and [m.name for m in p.models] == ["a", "b-2"]
    a, b = p.models
    assert a.model == tmp_path / "a.h5" and a.data == tmp_path / "d.npz" and a.trust_lambda is False
    assert b.data == tmp_path / "e.npz" and b.trust_lambda is True
    assert a.recipe.sparsity == 0.5 and b.recipe.sparsity == 0.75 and b.recipe.leaves == ("ptq", "pruned")
    assert b.recipe.pruning_end_fraction == 0.5 and a.recipe.pruning_end_fraction == 0.6


def test_the_one_model_form_is_unchanged(tmp_path):
    p = load_project(write(tmp_path, 'model = "a.h5"\n' + TOP))
    assert not p.is_sweep and p.models == () and p.model == tmp_path / "a.h5" and p.data == tmp_path / "d.npz"


@pytest.mark.parametrize("text,fragment", [
    (TOP + '[[models]]\nname = "a"\nmodle = "a.h5"\n', "[[models]] #1: unknown key `modle`. did you mean `model`?"),
    (TOP + '[[models]]\nname = "a"\n', "[[models]] #1: `model` is missing"),
    (TOP + '[[models]]\nmodel = "a.h5"\n', "[[models]] #1: `name` is missing"),
    (TOP + '[[models]]\nname = "a"\nmodel = "a.h5"\n[[models]]\nname = "a"\nmodel = "b.h5"\n',
     "two [[models]] tables are named 'a'. give each model its own name"),
    (TOP + '[[models]]\nname = "../up"\nmodel = "a.h5"\n', "[[models]] #1 `name` is '../up'; it must be 1-64 letters"),
    (TOP + '[[models]]\nname = "sweep.json"\nmodel = "a.h5"\n', "`name` is 'sweep.json'"),
    (TOP + '[[models]]\nname = 3\nmodel = "a.h5"\n', "`name` is 3; it must be a string"),
    (TOP + '[models]\nname = "a"\nmodel = "a.h5"\n', "`models` must be an array of tables"),
    (TOP.replace("data", "models = []\ndata", 1), "`models` must be an array of tables"),
    ('model = "a.h5"\n' + TOP + '[[models]]\nname = "a"\nmodel = "a.h5"\n', "both `model` and [[models]] are given"),
    (TOP.replace('data = "d.npz"\n', "") + '[[models]]\nname = "a"\nmodel = "a.h5"\n',
     "[[models]] 'a' has no data, and the file no top-level `data`"),
    (TOP + '[[models]]\nname = "a"\nmodel = "a.h5"\nrecipe = { sparsty = 0.7 }\n',
     "[[models]] 'a' recipe: unknown key `sparsty`"),
    (TOP + '[[models]]\nname = "a"\nmodel = "a.h5"\nrecipe = 3\n', "`recipe` is 3; it must be a table"),
    (TOP + '[[models]]\nname = "a"\nmodel = "a.h5"\ntrust_lambda = "yes"\n', "`trust_lambda` is 'yes'"),
    (TOP, "`model` is missing"),
])
def test_a_bad_models_table_is_one_line_naming_the_file_and_the_fix(tmp_path, text, fragment):
    path = write(tmp_path, text)
    with pytest.raises(UsageError) as err:
        load_project(path)
    line = err.value.one_line()
    assert fragment in line and str(path) in line and "\n" not in line


def test_a_missing_model_file_fails_before_anything_is_written(tmp_path):
    path = write(tmp_path, TWO.replace('model = "b.h5"', 'model = "gone.h5"'))
    with pytest.raises(InvalidInputError, match=r"\[\[models\]\] 'b-2': model file .*gone.h5 does not exist"):
        api.compile([path])
    assert not (tmp_path / "out").exists()
    with pytest.raises(UsageError, match="it is a sweep"):
        load_project(write(tmp_path, TWO)).entry
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "manifest.json").write_text("{}")
    with pytest.raises(UsageError, match="is the run folder of one model"):
        api.compile([path.with_name("edgedeploy.toml")])


@pytest.mark.parametrize("change,code,fragment,run", [
    (('name = "a"', 'name = "a b"'), 2, "`name` is 'a b'", run_cli),  # the console script, in its own process
    (('model = "b.h5"', 'model = "gone.h5"'), 3, "gone.h5 does not exist", run_in_process),
])
def test_compile_exits_with_one_line_and_writes_nothing(tmp_path, change, code, fragment, run):
    path = write(tmp_path, TWO.replace(*change))
    done = run("compile", path, cwd=tmp_path)
    assert done.returncode == code, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and fragment in lines[0] and str(path) in lines[0] and "Traceback" not in done.stderr
    assert done.stdout == "" and not (tmp_path / "out").exists()
