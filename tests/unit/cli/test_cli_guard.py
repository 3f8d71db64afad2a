"""The command layer turns every failure into one line on stderr and an exit code, never a traceback."""

from __future__ import annotations

import os
import subprocess

import pytest
import typer

from edgedeploy.cli.common import guard
from edgedeploy.errors import TargetError
from helpers import CLI_ENV, EDGEDEPLOY


@pytest.mark.parametrize("exc,code,text", [
    (TargetError("t.toml: key `name` is 'a\nb'", "rename it"), 4, "t.toml: key `name` is 'a b'"),
    (PermissionError(13, "Permission denied", "/x/report.html"), 3, "/x/report.html: Permission denied"),
    (TypeError("unexpected"), 1, "internal error (TypeError: unexpected)"),
])
def test_failures_are_one_line_and_an_exit_code(capsys, exc, code, text):
    with pytest.raises(typer.Exit) as out:
        with guard():
            raise exc
    assert out.value.exit_code == code
    err = capsys.readouterr().err
    assert text in err and len(err.strip().splitlines()) == 1 and "Traceback" not in err


def test_the_command_lines_own_exits_pass_through():
    with pytest.raises(typer.Exit) as out:
        with guard():
            raise typer.Exit(0)
    assert out.value.exit_code == 0


@pytest.mark.parametrize("argv,fragment", [
    (["compile", "--bogus"], "No such option: --bogus"),
    (["export", "run", "-o", "fw", "--golden", "abc"], "Invalid value for '--golden'"),
    (["report"], "Missing argument 'run_dir'"),
    (["nosuchcmd"], "No such command 'nosuchcmd'"),
    (["targets"], "needs a command"),
])
def test_usage_errors_are_one_line_and_exit_2(monkeypatch, capsys, argv, fragment):
    from edgedeploy.cli import main

    monkeypatch.setattr("sys.argv", ["edgedeploy", *argv])
    with pytest.raises(SystemExit) as done:
        main()
    err = capsys.readouterr().err
    assert done.value.code == 2
    assert err.count("\n") == 1 and err.startswith("error: ") and fragment in err and "Traceback" not in err


def test_help_and_version_still_exit_0(monkeypatch, capsys):
    from edgedeploy.cli import main

    for argv in (["--help"], ["--version"], ["compile", "-h"]):
        monkeypatch.setattr("sys.argv", ["edgedeploy", *argv])
        with pytest.raises(SystemExit) as done:
            main()
        assert done.value.code == 0 and capsys.readouterr().err == ""


def test_an_output_path_too_long_is_one_line(monkeypatch, capsys, tmp_path):
    from edgedeploy.cli import main

    model = tmp_path / "m.tflite"
    model.write_bytes(b"")
    monkeypatch.setattr("sys.argv", ["edgedeploy", "compile", str(model), "-t", "ethos-u55-128",
                                     "-o", str(tmp_path / ("d" * 300))])
    with pytest.raises(SystemExit) as done:
        main()
    err = capsys.readouterr().err
    assert done.value.code == 3 and err.count("\n") == 1 and "File name too long" in err


@pytest.mark.parametrize("exc,text", [
    (OSError(28, "No space left on device", "/x/run/manifest.json"),
     "no space left on the device writing /x/run/manifest.json"),
    (OSError(122, "Disk quota exceeded", "/home/u/fw/m.c"), "no space left in the disk quota writing /home/u/fw/m.c"),
    (RuntimeError("Unable to synchronously create file (file write failed: errno = 28, error message = 'No space "
                  "left on device')"), "no space left on the device writing an output of this command"),  # h5py's text
])
def test_a_full_disk_is_one_line_and_exit_13(capsys, exc, text):
    """A full disk the library did not name itself still ends as one line that says so, with its own exit code."""
    with pytest.raises(typer.Exit) as out:
        with guard():
            raise exc
    err = capsys.readouterr().err
    assert out.value.exit_code == 13
    assert text in err and "free space" in err and len(err.strip().splitlines()) == 1, err


def test_standard_output_on_a_full_device_is_named(tmp_path):
    """``edgedeploy report RUN --format json > /dev/full``: the line names standard output."""
    from helpers import RECORDED_RUN, one_error_line

    with open("/dev/full", "w") as full:
        proc = subprocess.run([*EDGEDEPLOY, "report", RECORDED_RUN, "--format", "json"], stdout=full,
                              stderr=subprocess.PIPE, text=True, env={**os.environ, **CLI_ENV}, timeout=300)
    assert proc.returncode == 13
    assert "no space left on the device writing standard output" in one_error_line(proc)
