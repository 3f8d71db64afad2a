"""`compile`, `export --force` and `optimize` on a real full disk (a small tmpfs, filled to leave a chosen number of bytes).

Each ends with exit 13 and one line that says there is no space and names the path being written (never a Vela
failure blaming the model); no staging folder or temporary file is left, and the earlier good output (a compile
folder, a firmware bundle) is byte for byte as it was.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from fulldisk import leftovers, small_disk, tree_digest  # noqa: F401 - small_disk is a fixture
from helpers import one_error_line, run_cli, run_in_process

PAGE = 4096
LEAF, GOOD_TARGET = "dscnn_mlperf", "ethos-u55-128"


@pytest.fixture(scope="module")
def good_run(dscnn_int8, tmp_path_factory):
    """A run folder with one good compile (the bundled DS-CNN on ethos-u55-128), and a firmware bundle of it."""
    root = tmp_path_factory.mktemp("good")
    done = run_cli("compile", dscnn_int8, "-t", GOOD_TARGET, "-o", root / "run")
    assert done.returncode == 0, done.stderr
    done = run_cli("export", root / "run", "--leaf", LEAF, "-t", GOOD_TARGET, "-o", root / "fw")
    assert done.returncode == 0, done.stderr
    return root


def _ok_targets(run) -> set[str]:
    records = json.loads((run / "manifest.json").read_text())["stages"]
    return {r["target"] for r in records if r["stage"] == "compile" and r["status"] == "ok"}


# (the compile's arguments, bytes left free, whether Vela is the writer that meets the full disk)
COMPILES = [
    pytest.param(["-t", "ethos-u55-256"], 0, False, id="another target, disk full: the scratch folder"),
    pytest.param(["-t", "ethos-u55-256"], PAGE, False, id="another target, one page free: the stage folder"),
    pytest.param(["-t", "ethos-u55-256"], 3 * PAGE, True, id="another target, 12 KiB free: Vela's log"),
    pytest.param(["-t", "ethos-u55-256"], 10 * PAGE, True, id="another target, 40 KiB free: Vela's model"),
    pytest.param(["-t", GOOD_TARGET, "--optimise", "Size"], 10 * PAGE, True,
                 id="re-compile of the good target, 40 KiB free: Vela's model"),
]


@pytest.mark.parametrize("args,leave,vela", COMPILES)
def test_compile_on_a_full_disk(good_run, dscnn_int8, small_disk, args, leave, vela):
    run = small_disk.path / "run"
    shutil.copytree(good_run / "run", run)
    good = run / "compile" / LEAF / GOOD_TARGET
    before = tree_digest(good)
    assert small_disk.fill(leave) == leave
    # one case through the console script (its Vela worker forked as the command starts), the others in this process
    run_command = run_cli if leave == 3 * PAGE else run_in_process
    done = run_command("compile", dscnn_int8, *args, "-o", run)
    line = one_error_line(done)
    assert done.returncode == 13, done.stderr
    assert f"no space left on the device writing {run}" in line and "free space" in line, line
    assert ("Vela's output" in line and "the model is not at fault" in line) if vela else "Vela" not in line, line
    assert "Vela failed" not in line and "full-int8" not in line, line
    assert leftovers(run) == []
    assert tree_digest(good) == before
    small_disk.empty()
    assert GOOD_TARGET in _ok_targets(run)  # the manifest still records the good compile


def test_compile_into_a_new_folder_names_the_copy_it_writes_not_the_model_it_reads(dscnn_int8, small_disk):
    out = small_disk.path / "new"
    small_disk.fill(2 * PAGE)  # room for the folder and its manifest, not for the copy of the model
    done = run_cli("compile", dscnn_int8, "-t", GOOD_TARGET, "-o", out)
    line = one_error_line(done)
    assert done.returncode == 13, done.stderr
    assert f"no space left on the device writing {out}" in line and str(dscnn_int8) not in line, line
    assert leftovers(small_disk.path) == []


# bytes left free for the second bundle; the first bundle takes about 330 KB, its C source 230 KB of that
EXPORTS = [
    pytest.param(0, id="disk full: the scratch folder"),
    pytest.param(2 * PAGE, id="8 KiB free: the header"),
    pytest.param(16 * PAGE, id="64 KiB free: the C source"),
    pytest.param(70 * PAGE, id="280 KiB free: the files after the C source"),
]


@pytest.mark.parametrize("leave", EXPORTS)
def test_export_force_on_a_full_disk(good_run, small_disk, leave):
    out = small_disk.path / "fw"
    shutil.copytree(good_run / "fw", out)
    before = tree_digest(out)
    assert small_disk.fill(leave) == leave
    done = run_in_process("export", good_run / "run", "--leaf", LEAF, "-t", GOOD_TARGET, "-o", out, "--force", "--name",
                    "other")
    line = one_error_line(done)
    assert done.returncode == 13, done.stderr
    assert f"no space left on the device writing {out}" in line and "free space" in line, line
    assert ".part" not in line and ".edgedeploy-tmp" not in line, line
    assert leftovers(out) == []
    assert tree_digest(out) == before  # the earlier bundle, every file as it was


@pytest.mark.parametrize("leave", [
    pytest.param(0, id="disk full: the scratch folder"),
    pytest.param(10 * PAGE, id="40 KiB free: the baseline's model.h5"),
])
def test_optimize_on_a_full_disk(small_disk, leave):
    """HDF5 can end the process with a segmentation fault on a full disk: the room for a model is checked before
    it is saved, and the line names the file as it would lie in the run folder."""
    example = Path(__file__).resolve().parents[3] / "examples" / "kws_tree"
    run = small_disk.path / "run"
    assert small_disk.fill(leave) == leave
    done = run_in_process("optimize", example / "dscnn_mlperf_float.h5", "--data", example / "speech_commands_subset.npz",
                    "--leaves", "ptq", "-o", run)
    line = one_error_line(done)
    assert done.returncode == 13, done.stderr
    assert f"no space left on the device writing {run}" in line and "free space" in line, line
    assert ".part" not in line and ".edgedeploy-tmp" not in line, line
    assert leftovers(small_disk.path) == []
