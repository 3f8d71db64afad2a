"""Names that become paths or C text: one strict full-match pattern each; C text escaped (no TensorFlow)."""

from __future__ import annotations

import pytest

from edgedeploy.errors import UsageError
from edgedeploy.export.c_literals import c_string
from edgedeploy.core.names import c_comment, check_name, is_valid


@pytest.mark.parametrize("kind,good", [
    ("target", "ethos-u55-128"), ("target", "corstone-300-u55-128"), ("target", "my.board_2"),
    ("leaf", "pcqat"), ("leaf", "pruned_clustered_palette"), ("model", "dscnn_sparse"), ("model", "DS-CNN-S2"),
    ("c_identifier", "kws"), ("c_identifier", "_model2"), ("section", "nn_model"), ("section", ".bss.nn_model"),
])
def test_good_names(kind, good):
    assert check_name(kind, good, "x") == good


@pytest.mark.parametrize("kind,bad", [
    ("target", "../../victim"), ("target", ".."), ("target", "a/b"), ("target", "a\\b"), ("target", ""),
    ("target", ".hidden"), ("target", "ok\n"), ("target", "a..b"), ("target", "x" * 65), ("target", "a b"),
    ("leaf", "PCQAT"), ("leaf", "../x"), ("leaf", "a-b"), ("leaf", "x\n"),
    ("model", "sweep.json"), ("model", ".."), ("model", "-x"), ("model", "a/b"), ("model", "x" * 65), ("model", ""),
    ("c_identifier", "kws\n"), ("c_identifier", "int"), ("c_identifier", "2kws"), ("c_identifier", "a-b"),
    ("c_identifier", "while"), ("c_identifier", "x*/"), ("section", 'a")))'), ("section", "a..b"),
    ("section", "nn model"), ("target", None), ("leaf", 3),
])
def test_bad_names_are_one_line_naming_where_and_form(kind, bad):
    assert not is_valid(kind, bad)
    with pytest.raises(UsageError) as err:
        check_name(kind, bad, "t.toml: key `name`")
    line = err.value.one_line()
    assert line.startswith("t.toml: key `name` is ") and "it must be" in line and "\n" not in line


def test_c_text_is_escaped():
    assert c_string('a"b\\c\n?') == '"a\\"b\\\\c\\012\\077"'
    assert c_string("é") == '"\\303\\251"' and c_string("\udcff") == '"\\077"'
    hostile = "x*/ int injected = 42; /*"
    assert "*/" not in c_comment(hostile) and "/*" not in c_comment(hostile)
    assert "\n" not in c_comment("a\nb") and not c_comment("a\\").endswith("\\")
    assert "*/" not in c_comment("**//**/")


def test_stage_folders_stay_inside_the_run(tmp_path):
    from edgedeploy.core.stage import RunContext

    ctx = RunContext.open(tmp_path / "run")
    assert ctx.stage_dir("compile/pcqat/ethos-u55-128") == tmp_path / "run" / "compile" / "pcqat" / "ethos-u55-128"
    for bad in ("compile/pcqat/../../victim", "compile/../x", "compile//x", "compile/pcqat/a\nb"):
        with pytest.raises(UsageError):
            ctx.stage_dir(bad)


def test_a_link_inside_the_run_folder_is_refused(tmp_path):
    from edgedeploy.errors import InvalidInputError
    from edgedeploy.core.files import release_run_dirs
    from edgedeploy.core.stage import RunContext

    victim = tmp_path / "victim"
    victim.mkdir()
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "compile").symlink_to(victim)
    ctx = RunContext.open(tmp_path / "run")
    try:
        with pytest.raises(InvalidInputError, match="is a link"):
            ctx.stage_dir("compile/pcqat/ethos-u55-128")
    finally:
        release_run_dirs()
    assert list(victim.iterdir()) == []


def test_promote_never_leaves_its_folder(tmp_path):
    from edgedeploy.errors import UsageError
    from edgedeploy.core.files import new_staging_dir, promote

    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "f").write_text("keep")
    run = tmp_path / "run" / "compile"
    staged = new_staging_dir(run / "x")
    with pytest.raises(ValueError):
        promote(staged, tmp_path / "victim")
    assert (victim / "f").read_text() == "keep"
    link = run / "x"
    link.symlink_to(victim, target_is_directory=True)
    with pytest.raises(UsageError, match="edgedeploy did not write it"):
        promote(staged, link)  # a link edgedeploy did not make is left as it is, and what it names too
    assert (victim / "f").read_text() == "keep" and link.is_symlink()


def test_variant_names_from_hostile_file_names(tmp_path):
    from pathlib import Path

    from edgedeploy.pipeline.variants import variant_names
    from edgedeploy.core.names import is_valid

    names = variant_names([Path("a/...tflite"), Path("b/x y;rm.tflite"), Path("c/.._int8.tflite"), Path("d/ok_int8.tflite")])
    assert all(is_valid("target", n) for n in names) and names[-1] == "ok" and len(set(names)) == 4
