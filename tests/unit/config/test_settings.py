"""The key tables of recipe, project and target files, and the one validator over them (no TensorFlow)."""

from __future__ import annotations

from pathlib import Path

import pytest

from edgedeploy.errors import TargetError, UsageError
from edgedeploy.pipeline.project import PROJECT_KEYS, load_project
from edgedeploy.config.recipe import RECIPE_KEYS, Recipe, check_layers, load_recipe
from edgedeploy.config.keys import Key, validate
from edgedeploy.config.targets import TARGET_KEYS, builtin_targets_dir, load_target_file

REPO = Path(__file__).resolve().parents[3]
PROJECT = 'model = "m.h5"\ndata = "d.npz"\ntargets = ["ethos-u55-128"]\n'


@pytest.mark.parametrize("table", [RECIPE_KEYS, PROJECT_KEYS, TARGET_KEYS])
def test_every_key_is_described(table):
    paths = [k.path for k in table]
    assert len(paths) == len(set(paths))
    for key in table:
        assert isinstance(key, Key) and key.help and key.type in (bool, int, float, str, list, dict)
        if key.default is not None and key.type is not list:
            assert validate_one(key, key.default) == key.default, key.path
        if key.choices is not None and key.type is not list:
            assert all(isinstance(c, key.type) for c in key.choices)


def validate_one(key: Key, value):
    data: dict = {}
    node = data
    parts = key.path.replace("*", "x").split(".")
    for part in parts[:-1]:
        node = node.setdefault(part, {})
    node[parts[-1]] = value
    return next(iter(validate(data, [key], "f.toml").values()))


def test_recipe_defaults_are_the_table_defaults():
    recipe = Recipe()
    for key in RECIPE_KEYS:
        if key.default is not None and hasattr(recipe, key.name):
            value = getattr(recipe, key.name)
            assert (list(value) if isinstance(value, tuple) else value) == key.default, key.path


@pytest.mark.parametrize("text,fragment", [
    ('per_channel_clusters = "false"', "`per_channel_clusters` is 'false'; it must be true or false"),
    ("float_io = 0", "`float_io` is 0; it must be true or false"),
    ("epochs = 2.0", "`epochs` is 2.0; it must be an integer"),
    ("clusters = true", "`clusters` is True; it must be an integer"),
    ('[stages.prune]\nepochs = "4"', "`stages.prune.epochs` is '4'"),
    ('[stages.qat]\nlearning_rate = "fast"', "`stages.qat.learning_rate` is 'fast'"),
    ("[stages]\nprune = 3", "`stages.prune` is 3; it must be a table"),
    ("learning_rate = nan", "it must be a finite number"),
    ("seed = -1", "`seed` is -1"),
    ("sparsity = inf", "it must be a finite number"),
    ('skip_layers = ["a", 3]', "`skip_layers` is ['a', 3]; it must be a list of strings"),
    ("epochz = 3", "unknown key `epochz`. did you mean `epochs`?"),
    ("[training]\nlr_shedule = 'cosine'", "unknown key `training.lr_shedule`. did you mean `training.lr_schedule`?"),
    ("[layers.conv1]\nclusterz = 8", "unknown key `layers.conv1.clusterz`. did you mean `layers.conv1.clusters`?"),
    ("epochs = 99999999999999999999999", "`epochs` is 99999999999999999999999; it must be an integer >= 0 and <= 10000"),
    ("[stages.qat]\nepochs = 20000", "`stages.qat.epochs` is 20000"),
    ("batch_size = 9223372036854775808", "`batch_size` is 9223372036854775808"),
    ("calibration_samples = 99999999999999999999", "`calibration_samples` is 99999999999999999999"),
    ("thin_targets = []", "`thin_targets` is empty; allowed values: corstone-300-u55-128, "),
    ('thin_targets = ["ethos-u55-12"]', "`thin_targets` has 'ethos-u55-12'; allowed values: "),
    ('thin_targets = ["ethos-u55-12"]', "or the path of a target .toml file. did you mean ethos-u55-128?"),
    ('thin_targets = ["ethos-u55-128", ""]', "`thin_targets` has ''; allowed values: "),
    ('thin_targets = ["../ethos-u55-128"]', "`thin_targets` has '../ethos-u55-128'"),
])
def test_recipe_types_are_strict_and_typos_named(tmp_path, text, fragment):
    path = tmp_path / "r.toml"
    path.write_text(text + "\n")
    with pytest.raises(UsageError) as err:
        load_recipe(path)
    assert fragment in err.value.one_line() and str(path) in err.value.one_line()


def test_stage_settings_are_typed(tmp_path):
    path = tmp_path / "r.toml"
    path.write_text("[stages.prune]\nepochs = 3\nlearning_rate = 1\n")
    r = load_recipe(path)
    assert r.stage("prune").epochs == 3 and r.stage("prune").learning_rate == 1.0
    assert isinstance(r.stage_learning_rates["prune"], float)


def test_command_line_values_are_checked_too():
    with pytest.raises(UsageError, match="`sparsity` is 1.5"):
        load_recipe(overrides={"sparsity": 1.5})


@pytest.mark.parametrize("given,fragment", [
    ({"bogus_key": 1}, "recipe with the options given by name: unknown key `bogus_key`. give the recipe's keys "
                       "by their field names"),
    ({"lr_shedule": "constant"}, "unknown key `lr_shedule`. did you mean `lr_schedule`?"),
    ({"epochz": 2, "epochs": 1}, "unknown key `epochz`. did you mean `epochs`?"),
    ({"pruning.schedule": "constant"}, "unknown key `pruning.schedule`. did you mean `pruning_schedule`?"),
    ({"thin_targets": ()}, "recipe with the options given by name: `thin_targets` is empty"),
    ({"thin_targets": ("ethos-u85-257",)}, "`thin_targets` has 'ethos-u85-257'; allowed values: "),
])
def test_settings_given_by_name_are_checked_as_a_recipe_files_keys(tmp_path, given, fragment):
    """Keyword settings of the Python API (and command-line options) are recipe keys: an unknown name is named
    with the nearest, as in a file, and with a file the line names the file too."""
    with pytest.raises(UsageError) as err:
        load_recipe(overrides=given)
    assert fragment in err.value.one_line()
    path = tmp_path / "r.toml"
    path.write_text("epochs = 1\n")
    with pytest.raises(UsageError) as err:
        load_recipe(path, given)
    assert str(path) in err.value.one_line()


def test_thin_targets_take_built_in_names_and_target_files(tmp_path):
    target = tmp_path / "my-npu.toml"
    target.write_text((builtin_targets_dir() / "ethos-u55-64.toml").read_text().replace(
        'name = "ethos-u55-64"', 'name = "my-npu"'))
    assert load_recipe(overrides={"thin_targets": ("ethos-u85-256", str(target))}).thin_targets == (
        "ethos-u85-256", str(target))
    with pytest.raises(TargetError) as err:  # a file that is not there: the recipe's key and the file named
        load_recipe(overrides={"thin_targets": (str(tmp_path / "gone.toml"),)})
    assert "`thin_targets` has" in err.value.one_line() and "gone.toml" in err.value.one_line()


@pytest.mark.parametrize("text,fragment", [
    ('trust_lambda = "false"', "`trust_lambda` is 'false'; it must be true or false"),
    ('[compile]\nallow_cpu_ops = "no"', "`compile.allow_cpu_ops` is 'no'; it must be true or false"),
    ('[compile]\njobs = "2"', "`compile.jobs` is '2'; it must be an integer"),
    ('[compile]\njobs = 0', "`compile.jobs` is 0"),
    ('[compile]\noptimise = "Speed"', "`compile.optimise` is 'Speed'; allowed values: Performance, Size"),
    ('[recipe.stages.prune]\nepochs = "4"', "`recipe.stages.prune.epochs` is '4'"),
    ("trust_lamda = true", "unknown key `trust_lamda`. did you mean `trust_lambda`?"),
    ("[recipe]\nepochz = 1", "unknown key `recipe.epochz`. did you mean `recipe.epochs`?"),
    ("[requirements]\nmax_flsh = 1", "did you mean `requirements.max_flash`?"),
    ('targets = "ethos-u55-128"', "`targets` is 'ethos-u55-128'; it must be a list of strings"),
    ("recipe = 3", "`recipe` is 3; it must be a table"),
    ("[requirements]\nmax_npu_cycles = 99999999999999999999999", "it must be an integer of at most 9007199254740992"),
])
def test_project_types_are_strict_and_typos_named(tmp_path, text, fragment):
    path = tmp_path / "edgedeploy.toml"
    body = PROJECT.replace('targets = ["ethos-u55-128"]\n', "") if text.startswith("targets") else PROJECT
    path.write_text(body + text + "\n")
    with pytest.raises(UsageError) as err:
        load_project(path)
    assert fragment in err.value.one_line() and str(path) in err.value.one_line()


def test_project_missing_model_and_good_values(tmp_path):
    path = tmp_path / "edgedeploy.toml"
    path.write_text('data = "d.npz"\n')
    with pytest.raises(UsageError, match="`model` is missing"):
        load_project(path)
    path.write_text(PROJECT + "trust_lambda = false\n[compile]\njobs = 2\nallow_cpu_ops = true\n")
    p = load_project(path)
    assert p.trust_lambda is False and p.compile.jobs == 2 and p.compile.allow_cpu_ops is True


def test_layers_are_checked_against_the_model():
    recipe = load_recipe(table={"layers": {"conv2d_1": {"clusters": 8}}})
    check_layers(recipe, ["input_1", "conv2d", "conv2d_1"], "m.h5")
    with pytest.raises(UsageError) as err:
        check_layers(load_recipe(table={"layers": {"conv2d_7": {"clusters": 8}}}), ["conv2d", "conv2d_1"], "m.h5")
    assert "`layers.conv2d_7`: m.h5 has no layer 'conv2d_7'" in err.value.one_line()
    assert "nearest: conv2d_1" in err.value.one_line()
    with pytest.raises(UsageError, match="skip_layers"):
        check_layers(load_recipe(table={"skip_layers": ["dense9"]}), ["conv2d", "dense"], "m.h5")


GOOD_TARGET = (builtin_targets_dir() / "corstone-300-u55-128.toml").read_text()


@pytest.mark.parametrize("old,new,fragment", [
    ('name = "corstone-300-u55-128"', 'name = "../../victim"', "key `name` is '../../victim'"),
    ('name = "corstone-300-u55-128"', 'name = "a/b"', "key `name` is 'a/b'"),
    ('name = "corstone-300-u55-128"', 'name = ".."', "key `name` is '..'"),
    ('name = "corstone-300-u55-128"', 'name = "x*/ int injected = 42; /*"', "key `name`"),
    ('name = "corstone-300-u55-128"', 'name = "ok\\n"', "key `name` is 'ok\\n'"),
    ('model_section = "nn_model"', 'model_section = "nn\\")))int x;"', "key `memory.model_section`"),
    ("npu_hz = 500_000_000", "npu_hz = 5e8", "`clocks.npu_hz` is 500000000.0; it must be an integer"),
    ("npu_hz = 500_000_000", "npu_hz = true", "`clocks.npu_hz` is True"),
    ("npu_hz = 500_000_000", "npu_hz = 99999999999999999999", "`clocks.npu_hz` is 99999999999999999999"),
    ("[clocks]", "[clock]", "unknown key `clock`. did you mean `clocks`?"),
    ("sram_bytes = 2_097_152", "sram_byte = 2_097_152", "did you mean `memory.sram_bytes`?"),
    ("model_address = 0x9000_0000", "model_address = -1", "`fvp.model_address` is -1"),
    ('"mps3_board.uart0.out_file" = "-"', '"mps3_board.uart0.out_file" = true', "fvp.params.mps3_board.uart0.out_file"),
])
def test_target_files_are_strict(tmp_path, old, new, fragment):
    assert old in GOOD_TARGET
    path = tmp_path / "board.toml"
    path.write_text(GOOD_TARGET.replace(old, new, 1))
    with pytest.raises(TargetError) as err:
        load_target_file(path)
    line = err.value.one_line()
    assert fragment in line and str(path.resolve()) in line and "\n" not in line


@pytest.mark.parametrize("content", [b"\xff\xfe\x00bad", b"a = [" * 2000, b'name = "x"\x00'])
def test_unreadable_toml_is_one_error(tmp_path, content):
    path = tmp_path / "r.toml"
    path.write_bytes(content)
    with pytest.raises(UsageError):
        load_recipe(path)
    with pytest.raises(TargetError):
        load_target_file(path)
    with pytest.raises(UsageError):
        load_recipe(tmp_path)  # a folder


@pytest.mark.parametrize("ini", [b"root:x:0:0\n", b"\xd2\xff[x", b"[System_Config.X]\nfoo\n"])
def test_a_vela_ini_that_is_not_one_is_one_target_error(tmp_path, ini):
    (tmp_path / "my.ini").write_bytes(ini)
    path = tmp_path / "t.toml"
    path.write_text(GOOD_TARGET.replace('config = "Arm/vela.ini"', 'config = "my.ini"'))
    with pytest.raises(TargetError, match="is not a readable Vela configuration file"):
        load_target_file(path)


def test_nul_in_a_string_is_refused(tmp_path):
    path = tmp_path / "t.toml"
    path.write_text(GOOD_TARGET.replace('config = "Arm/vela.ini"', 'config = "a\\u0000b"'))
    with pytest.raises(TargetError, match="NUL"):
        load_target_file(path)
