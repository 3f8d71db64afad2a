"""The driver (edgedeploy.pipeline.driver): what the sources are, mixed sources refused, and a project file read
once however the command goes on. No TensorFlow, no Vela: every case here stops before a model is loaded."""

from __future__ import annotations

from pathlib import Path

import pytest

import edgedeploy.core.files as files
from edgedeploy import api
from edgedeploy.errors import InvalidInputError, UsageError
from edgedeploy.pipeline.driver import source_kind

PROJECT = ('model = "gone.h5"\ndata = "d.npz"\nout = "out"\ntargets = ["ethos-u55-128"]\n'
           '[recipe]\nleaves = ["ptq", "qat"]\n[requirements]\nmax_flash = "32KiB"\n')
SWEEP = ('data = "d.npz"\nout = "out"\ntargets = ["ethos-u55-128"]\n[recipe]\nleaves = ["ptq"]\n'
         '[requirements]\nmax_flash = 1000\n[[models]]\nname = "a"\nmodel = "gone.h5"\n')


def test_sources_are_told_apart(tmp_path):
    (tmp_path / "run").mkdir()
    assert source_kind([tmp_path / "a.tflite", tmp_path / "b.tflite"]) == "tflite"
    assert source_kind([tmp_path / "run"]) == "run"
    assert source_kind([tmp_path / "p.toml"], walk=True) == "project"


@pytest.mark.parametrize("sources,walk,fragment", [
    (["a.tflite"], True, "--walk walks the deployment tree of a project file"),
    (["p.toml", "q.toml"], True, "--walk walks the deployment tree of a project file"),
    (["a.tflite", "p.toml"], False, "is a project file"),
    (["a.tflite", "run"], False, "is a folder"),
])
def test_mixed_sources_are_one_usage_error(tmp_path, sources, walk, fragment):
    (tmp_path / "run").mkdir()
    with pytest.raises(UsageError, match=fragment):
        source_kind([tmp_path / s for s in sources], walk=walk)


def test_a_run_folder_is_compiled_into_itself(tmp_path):
    (tmp_path / "run").mkdir()
    with pytest.raises(UsageError, match="a run folder is compiled into itself"):
        api.compile([tmp_path / "run"], ["ethos-u55-128"], tmp_path / "elsewhere")


@pytest.fixture
def reads(monkeypatch):
    """Every checked read of a file through edgedeploy.core.files.read_input_bytes, by resolved path."""
    seen: dict[Path, int] = {}
    real = files.read_input_bytes

    def counted(path, *args, **kwargs):
        seen[Path(path).resolve()] = seen.get(Path(path).resolve(), 0) + 1
        return real(path, *args, **kwargs)

    monkeypatch.setattr(files, "read_input_bytes", counted)
    return seen


@pytest.mark.parametrize("text,walk,error", [
    (PROJECT, True, InvalidInputError),   # one model, walked: stops at the missing model
    (PROJECT, False, InvalidInputError),
    (SWEEP, True, InvalidInputError),     # a sweep: stops at the missing model file, before anything is written
    (SWEEP, False, InvalidInputError),
])
def test_the_project_file_is_read_once(tmp_path, reads, text, walk, error):
    (tmp_path / "d.npz").write_bytes(b"")
    path = tmp_path / "edgedeploy.toml"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(error, match="gone.h5"):
        api.compile([path], walk=walk)
    assert reads[path.resolve()] == 1
    assert not (tmp_path / "out" / "manifest.json").exists()
