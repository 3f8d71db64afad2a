"""What a killed command left is removed by the next command; nothing is removed because of its name's shape."""

from __future__ import annotations

import os
import string

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from helpers import examples

from edgedeploy.errors import UsageError
from edgedeploy.core.files import (
    LOCK_NAME,
    SCRATCH,
    SCRATCH_MARK,
    STAGE_MARK,
    atomic_write_text,
    discard_scratch,
    lock_run_dir,
    new_staging_dir,
    promote,
    release_run_dirs,
)

# user files whose names look like what a killed command leaves (the shapes the clean-up once matched)
LOOKALIKES = [".profile.old1", "docs/.notes.txt.old2", "docs/drafts/.thesis.tex.abcdefgh.part", ".ssh.old3/key",
              "import/dscnn/model_int8.tflite", ".manifest.json.zz9_aa12.part", "compile/v/.t.old77/x"]


def _plant(root, names):
    for name in names:
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(name)


def _tree(root):
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


@pytest.fixture(autouse=True)
def _release():
    yield
    release_run_dirs()


def test_a_killed_commands_staging_is_removed_by_the_next_one(tmp_path):
    run = tmp_path / "run"
    lock_run_dir(run)
    staged = new_staging_dir(run / "import" / "dscnn")
    (staged / "model_int8.tflite").write_bytes(b"half")
    atomic_tmp = run / SCRATCH / ".manifest.json.ab12cd34.part"  # what an interrupted atomic write leaves
    atomic_tmp.write_text("{")
    release_run_dirs()  # the command is killed: its scratch folder is not empty, so it stays
    assert staged.is_dir()
    lock_run_dir(run)
    assert _tree(run / SCRATCH) == [SCRATCH_MARK]
    release_run_dirs()
    assert _tree(run) == [LOCK_NAME]  # an empty scratch folder goes when the command ends


@pytest.mark.parametrize("where", ["", "sub"])
def test_user_files_shaped_like_leftovers_are_never_removed(tmp_path, where):
    run = tmp_path / "home"
    _plant(run / where, LOOKALIKES)
    (run / LOCK_NAME).write_text("")  # as if edgedeploy had written here before
    before = _tree(run)
    for _ in range(2):
        lock_run_dir(run)
        staged = new_staging_dir(run / "compile" / "x")
        promote(staged, run / "compile" / "x")
        release_run_dirs()
    assert set(before) <= set(_tree(run))
    for name in LOOKALIKES:
        assert (run / where / name).read_text() == name


def test_a_scratch_folder_edgedeploy_did_not_make_is_refused_and_kept(tmp_path):
    run = tmp_path / "run"
    _plant(run, [f"{SCRATCH}/notes.txt"])
    lock_run_dir(run)
    with pytest.raises(UsageError, match="edgedeploy did not make it"):
        new_staging_dir(run / "import" / "v")
    release_run_dirs()
    assert (run / SCRATCH / "notes.txt").read_text() == f"{SCRATCH}/notes.txt"


def test_a_stage_folder_is_replaced_only_when_edgedeploy_made_it(tmp_path):
    run = tmp_path / "run"
    _plant(run, ["import/dscnn/thesis.tex"])  # a user's folder where a stage would go
    lock_run_dir(run)
    with pytest.raises(UsageError, match="edgedeploy did not write it"):
        promote(new_staging_dir(run / "import" / "dscnn"), run / "import" / "dscnn")
    assert (run / "import" / "dscnn" / "thesis.tex").is_file()
    staged = new_staging_dir(run / "import" / "mine")
    (staged / "a").write_text("1")
    promote(staged, run / "import" / "mine")
    again = new_staging_dir(run / "import" / "mine")
    (again / "b").write_text("2")
    promote(again, run / "import" / "mine")  # ours: replaced
    assert _tree(run / "import" / "mine") == [STAGE_MARK, "b"]


def test_an_interrupted_command_leaves_no_staging_behind(tmp_path):
    run = tmp_path / "run"
    lock_run_dir(run)
    staged = new_staging_dir(run / "compile" / "v" / "t")
    (staged / "half").write_text("x")
    discard_scratch()  # what the CLI does on Ctrl-C or SIGTERM
    assert not staged.exists()
    release_run_dirs()
    assert _tree(run) == [LOCK_NAME]


def test_writing_through_a_link_keeps_the_link(tmp_path):
    real = tmp_path / "real.json"
    real.write_text("old")
    link = tmp_path / "link.json"
    link.symlink_to(real)
    atomic_write_text(link, "new")
    assert link.is_symlink() and real.read_text() == "new"


def test_writing_to_a_stream_writes_through_it(tmp_path):
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    reader = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)
    try:
        atomic_write_text(fifo, "through")
        assert os.read(reader, 100) == b"through"
    finally:
        os.close(reader)
    assert fifo.is_fifo()


NAME = st.text(alphabet=string.ascii_letters + string.digits + "._-", min_size=1, max_size=24).filter(
    lambda s: s not in (".", "..", LOCK_NAME, SCRATCH))


@settings(max_examples=examples(40), deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(names=st.lists(st.lists(NAME, min_size=1, max_size=3).map("/".join), min_size=1, max_size=6, unique=True))
def test_property_no_user_file_is_ever_removed(tmp_path_factory, names):
    run = tmp_path_factory.mktemp("prop")
    planted = []
    for name in names:
        path = run / name
        if any(p.is_file() for p in [*path.parents, path] if p != run and p.exists()) or path.exists():
            continue
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(name)
        planted.append(name)
    (run / LOCK_NAME).write_text("")
    for _ in range(2):
        lock_run_dir(run)
        staged = new_staging_dir(run / "stagex" / "v")
        try:
            promote(staged, run / "stagex" / "v")
        except UsageError:
            pass
        release_run_dirs()
    for name in planted:
        assert (run / name).read_text() == name
