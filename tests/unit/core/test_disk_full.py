"""A full disk, met by the file helpers or by a program edgedeploy starts, is one DiskFullError (exit 13) naming the
path being written and saying there is no space; nothing half-written and no staging folder is left behind, and an
earlier file stays as it was. The disk is real: a small tmpfs filled to a chosen number of free bytes."""

from __future__ import annotations

import errno
import shutil
import sys
from pathlib import Path

import pytest

from edgedeploy.core.files import (
    LOCK_NAME,
    SCRATCH,
    atomic_write_bytes,
    atomic_write_text,
    lock_run_dir,
    new_staging_dir,
    release_run_dirs,
)
from edgedeploy.core.nospace import is_no_space, said_no_space
from edgedeploy.core.proc import check, run_command
from edgedeploy.errors import DiskFullError
from fulldisk import leftovers, small_disk, tree_digest  # noqa: F401 - small_disk is a fixture

PAGE = 4096
BIG = b"x" * (64 * 1024)


@pytest.fixture(autouse=True)
def _release():
    yield
    release_run_dirs()


def _earlier(folder: Path) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "report.json").write_text('{"earlier": true}\n')


def _write_over_earlier(disk: Path) -> None:
    atomic_write_bytes(disk / "out" / "report.json", BIG)


def _write_in_held_run(disk: Path) -> None:
    lock_run_dir(disk / "run")  # the temporary file then lies in the run's scratch folder
    atomic_write_text(disk / "run" / "report.json", BIG.decode())


def _stage_in_held_run(disk: Path) -> None:
    lock_run_dir(disk / "run")
    new_staging_dir(disk / "run" / "compile" / "leaf" / "t")


def _stage_in_folder(disk: Path) -> None:
    new_staging_dir(disk / "fw" / "bundle", root=disk / "fw")


# (what writes into which folder, how many bytes the disk has free): the id says which write fails first
CASES = [
    pytest.param(_write_over_earlier, "out", 0, id="atomic write, disk full: the temporary file"),
    pytest.param(_write_over_earlier, "out", 8 * PAGE, id="atomic write, 32 KiB free: the data"),
    pytest.param(_write_in_held_run, "run", 0, id="atomic write in a run folder, disk full: the scratch mark"),
    pytest.param(_write_in_held_run, "run", PAGE, id="atomic write in a run folder, one page free: the data"),
    pytest.param(_stage_in_held_run, "run", 0, id="stage folder, disk full: the scratch mark"),
    pytest.param(_stage_in_held_run, "run", PAGE, id="stage folder, one page free: the stage mark"),
    pytest.param(_stage_in_folder, "fw", PAGE, id="bundle staging folder, one page free: the stage mark"),
]


@pytest.mark.parametrize("write,folder,leave", CASES)
def test_a_full_disk_names_the_path_and_leaves_nothing(small_disk, write, folder, leave):
    from edgedeploy.core import files

    _earlier(small_disk.path / folder)
    before = tree_digest(small_disk.path)
    assert small_disk.fill(leave) == leave
    with pytest.raises(DiskFullError) as err:
        write(small_disk.path)
    release_run_dirs()  # the command ends: an empty scratch folder goes
    line = err.value.one_line()
    assert err.value.exit_code == 13
    assert "no space left" in line and "free space" in line, line
    assert str(small_disk.path / folder) in line, line
    assert ".part" not in line and SCRATCH not in line, line  # the path the user knows, not a temporary name
    assert leftovers(small_disk.path) == []
    after = {k: v for k, v in tree_digest(small_disk.path).items() if not k.endswith(LOCK_NAME)}
    assert after == before  # the earlier file as it was
    assert files._held == {}


def test_a_write_to_dev_full_names_it():
    with pytest.raises(DiskFullError) as err:
        atomic_write_text(Path("/dev/full"), "report\n")
    assert "no space left on the device writing /dev/full" in err.value.one_line()


# Lines of real tools on a full disk (CMake 3.25, GCC 12, Ninja, Vela's worker) and lines that only look alike.
@pytest.mark.parametrize("text,found", [
    ("CMake Error at CMakeDetermineSystem.cmake:192 (configure_file):\n  No space left on device\n",
     "No space left on device"),
    ("CMake Error at CMakeDetermineCompilerId.cmake:312 (file):\n  file write failed (No space left on device):\n\n"
     "    /b/CMakeFiles/3.25.1/CompilerIdC/CMakeCCompilerId.c\nCall Stack (most recent call first):\n",
     "file write failed (No space left on device): /b/CMakeFiles/3.25.1/CompilerIdC/CMakeCCompilerId.c"),
    ("/tmp/a.c:1:1: fatal error: closing dependency file CMakeFiles/x.dir/a.c.o.d: No space left on device\n"
     "compilation terminated.\nninja: build stopped: subcommand failed.",
     "/tmp/a.c:1:1: fatal error: closing dependency file CMakeFiles/x.dir/a.c.o.d: No space left on device"),
    ("edgedeploy: Vela raised OSError: [Errno 122] Disk quota exceeded", "edgedeploy: Vela raised OSError: "
     "[Errno 122] Disk quota exceeded"),
    ("error: region `SRAM' overflowed by 1024 bytes\ncollect2: error: ld returned 1 exit status", None),
    ("Warning: there is space left on the device for 3 more tensors", None),
])
def test_tool_output_that_says_the_disk_is_full(text, found):
    assert said_no_space(text) == found


@pytest.mark.parametrize("exc,full", [
    (OSError(errno.ENOSPC, "No space left on device"), True),
    (OSError(errno.EDQUOT, "Disk quota exceeded", "/q/f"), True),
    (OSError(errno.EACCES, "Permission denied", "/x"), False),
    (OSError("Unable to create file (errno = 28, error message = 'No space left on device')"), True),  # h5py's
    (RuntimeError("out of memory"), False),
])
def test_errors_that_say_the_disk_is_full(exc, full):
    assert is_no_space(exc) is full


@pytest.fixture
def project(tmp_path) -> Path:
    src = tmp_path / "project"
    src.mkdir()
    (src / "CMakeLists.txt").write_text("cmake_minimum_required(VERSION 3.16)\nproject(x C)\nadd_library(x STATIC a.c)\n")
    (src / "a.c").write_text("int f(void) { return 1; }\n")
    return src


@pytest.mark.skipif(shutil.which("cmake") is None, reason="cmake is not installed")
def test_a_build_on_a_full_disk_says_so_not_what_cmake_said_last(small_disk, project):
    """CMake configuring into a full folder ends with 'not able to compile a simple test program': the error says the
    disk is full, names the folder and quotes CMake's own line about it."""
    build = small_disk.path / "build"
    small_disk.fill(2 * PAGE)
    res = run_command(["cmake", "-S", project, "-B", build], timeout=120)
    assert not res.ok and "No space left on device" in res.stdout + res.stderr
    with pytest.raises(DiskFullError) as err:
        check(res, "configuring the build", "see the log", writes=build)
    line = err.value.one_line()
    assert line.startswith(f"no space left on the device writing {build} (configuring the build): ")
    assert "No space left on device" in line and "simple test program" not in line, line


def test_a_tflm_build_on_a_full_cache_names_the_cache(small_disk, project, monkeypatch, tmp_path):
    """The TFLM library's cache on a full disk: one line naming the cache folder and how to move it."""
    if shutil.which("cmake") is None:
        pytest.skip("cmake is not installed")
    from edgedeploy.hil.emulate import tflm
    from edgedeploy.hil.emulate.toolchain import Toolchain

    tree = tmp_path / "tflm"
    (tree / "tensorflow").mkdir(parents=True)
    (tree / "third_party").mkdir()
    monkeypatch.setenv("XDG_CACHE_HOME", str(small_disk.path / "cache"))
    host = Toolchain(gcc=shutil.which("gcc") or "gcc", gxx=shutil.which("g++") or "g++", cmake=shutil.which("cmake"),
                     gcc_version="host")
    for leave in (0, 8 * PAGE):  # edgedeploy's own files first; then CMake and the compiler
        small_disk.fill(leave)
        with pytest.raises(DiskFullError) as err:
            tflm.build_library(tree, [], host, timeout=120)
        line = err.value.one_line()
        assert f"no space left on the device writing {small_disk.path / 'cache' / 'edgedeploy' / 'tflm'}" in line, line
        assert "XDG_CACHE_HOME" in line, line
    assert "configuring the TensorFlow Lite Micro build" in line and "No space left on device" in line, line


def test_room_is_checked_before_a_writer_that_cannot_survive_a_full_disk(small_disk):
    from edgedeploy.core.nospace import ensure_room

    small_disk.fill(2 * PAGE)
    target = small_disk.path / "run" / "optimize" / "baseline" / "model.h5"
    ensure_room(target, 2 * PAGE)  # room enough: nothing happens, nothing is made
    with pytest.raises(DiskFullError) as err:
        ensure_room(target, 2 * PAGE + 1)
    assert err.value.one_line().startswith(f"no space left on the device writing {target}: 8,192 bytes free, at "
                                           "least 8,193 needed. free space")
    assert not (small_disk.path / "run").exists()


if sys.platform != "linux":  # /dev/full and tmpfs are Linux's
    pytestmark = pytest.mark.skip(reason="a real full disk is made with Linux's tmpfs and /dev/full")
