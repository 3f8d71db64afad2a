"""The node stage's model handed to its leaf stage in the same process: only for the very file it was saved to."""

from __future__ import annotations

import shutil

import pytest

from edgedeploy.optimize import handoff


@pytest.fixture(autouse=True)
def _empty():
    handoff.drop()
    yield
    handoff.drop()


def test_the_leaf_takes_the_model_saved_to_the_file_it_reads_once(tmp_path):
    saved = tmp_path / "staging" / "weights.h5"
    saved.parent.mkdir()
    saved.write_bytes(b"weights of qat")
    model = object()
    handoff.keep("qat", saved, model)
    promoted = tmp_path / "weights.h5"  # the stage's folder is renamed into place: same bytes, another path
    saved.rename(promoted)
    assert handoff.take("qat", promoted) is model
    assert handoff.take("qat", promoted) is None  # once: a second reader loads the file


def test_a_copy_of_the_file_is_loaded_not_handed_off(tmp_path):
    saved = tmp_path / "model.h5"
    saved.write_bytes(b"baseline")
    handoff.keep("baseline", saved, object())
    copy = tmp_path / "copy.h5"
    shutil.copy2(saved, copy)  # the same bytes and time, another file (a copied run folder)
    assert handoff.take("baseline", copy) is None


def test_another_node_a_changed_file_or_a_newer_save_load_the_file(tmp_path):
    path = tmp_path / "model.h5"
    path.write_bytes(b"pruned")
    handoff.keep("pruned", path, object())
    assert handoff.take("clustered", path) is None  # another node's leaf
    handoff.keep("pruned", path, object())
    path.write_bytes(b"pruned, changed since")
    assert handoff.take("pruned", path) is None
    first, second = tmp_path / "a.h5", tmp_path / "b.h5"
    first.write_bytes(b"a")
    second.write_bytes(b"b")
    handoff.keep("pruned", first, "model a")
    handoff.keep("clustered", second, "model b")  # only the last saved model is kept
    assert handoff.take("pruned", first) is None
    assert handoff.take("clustered", second) == "model b"


def test_drop_lets_go_of_the_model(tmp_path):
    path = tmp_path / "model.h5"
    path.write_bytes(b"baseline")
    handoff.keep("baseline", path, object())
    handoff.drop()
    assert handoff.take("baseline", path) is None
