"""Helpers the test modules share (importable as ``helpers``: pyproject's ``pythonpath`` puts tests/ on the path)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

EDGEDEPLOY = [sys.executable, "-m", "edgedeploy"]
# A run folder written by `edgedeploy compile` with Vela 5.2.0 (tests/data/report/run_u55_u85/SOURCE.md): the MLPerf
# DS-CNN and ResNet-8 int8 models on corstone-300-u55-128 and ethos-u85-256.
RECORDED_RUN = Path(__file__).resolve().parent / "data" / "report" / "run_u55_u85"
CLI_ENV = {"NO_COLOR": "1", "COLUMNS": "200"}  # what a command started by a test sees: no colour, 200 columns


def run_cli(*args, cwd: Path | str | None = None, env: dict[str, str] | None = None,
            timeout: float | None = 900) -> subprocess.CompletedProcess:
    """``edgedeploy ARGS`` in a new process, as a user runs it: no colour, 200 columns, text output captured.

    ``env`` adds to (or overrides) this process's environment."""
    return subprocess.run([*EDGEDEPLOY, *map(str, args)], capture_output=True, text=True, cwd=cwd, timeout=timeout,
                          env={**os.environ, **CLI_ENV, **(env or {})})


# `edgedeploy ARGS` as the console script runs it, then the watched modules it loaded, on a last line of their own
_LOADED = ("import sys\nfrom edgedeploy.cli import main\ncode = 0\n"
           "watch = sys.argv.pop(1).split(',')\nsys.argv[0] = 'edgedeploy'\n"
           "try:\n    main()\nexcept SystemExit as end:\n    code = end.code\n"
           "print('\\n' + ','.join(w for w in watch if any(m == w or m.startswith(w + '.') for m in sys.modules)))\n"
           "sys.exit(code)")


def run_cli_loading(*args, watch: tuple[str, ...]) -> tuple[subprocess.CompletedProcess, list[str]]:
    """``edgedeploy ARGS`` in a new process (:func:`run_cli`), and which of the modules or packages in ``watch``
    it had loaded when the command ended (a package counts when any of its modules was)."""
    proc = subprocess.run([sys.executable, "-c", _LOADED, ",".join(watch), *map(str, args)], capture_output=True,
                          text=True, timeout=900, env={**os.environ, **CLI_ENV})
    out, _, last = proc.stdout.rpartition("\n\n")
    proc.stdout = out + "\n" if out else ""
    return proc, [m for m in last.strip().split(",") if m]


def pytest_argv(*args: str) -> list[str]:
    """``pytest ARGS`` in a new process, as a user runs the HIL tests: with edgedeploy's plugin (named with ``-p``
    in a source checkout that was not installed), without the cache and without Hypothesis' plugin, which this
    environment has for its own tests and which would spend a second importing Hypothesis at the end."""
    from importlib.metadata import entry_points

    argv = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-p", "no:hypothesispytest", *args]
    if not any(ep.value == "edgedeploy.hil.testing" for ep in entry_points(group="pytest11")):
        argv[3:3] = ["-p", "edgedeploy.hil.testing"]  # a source checkout that was not installed
    return argv


def one_error_line(proc: subprocess.CompletedProcess) -> str:
    """The single ``error:`` line of a failed command's stderr (fails when there is none, several, or a traceback)."""
    lines = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    return lines[0]


def invoke_cli(*args):
    """``edgedeploy ARGS`` in this process (typer's test runner): a ``click.testing.Result``, stdout and stderr apart."""
    from typer.testing import CliRunner

    from edgedeploy.cli.app import app

    return CliRunner().invoke(app, [str(a) for a in args])


def run_in_process(*args, cwd: Path | str | None = None, env: dict[str, str] | None = None
                   ) -> subprocess.CompletedProcess:
    """``edgedeploy ARGS`` in this process (:func:`invoke_cli`), answered as :func:`run_cli` answers: for a test
    whose check is the command's outcome (exit code, error line, JSON on stdout, files) and whose process would
    spend much of its time importing TensorFlow, which this process has loaded already. ``cwd`` and ``env`` hold
    while it runs."""
    with pytest.MonkeyPatch.context() as mp:
        for key, value in (env or {}).items():
            mp.setenv(key, value)
        if cwd is not None:
            mp.chdir(cwd)
        result = invoke_cli(*args)
    return subprocess.CompletedProcess(["edgedeploy", *map(str, args)], result.exit_code, result.stdout,
                                       result.stderr)


def report_row(doc: dict, leaf: str, target: str) -> dict:
    """The row of ``leaf`` on ``target`` in a report document."""
    return next(r for r in doc["rows"] if r["leaf"] == leaf and r["target"] == target)


def input_models():
    """``tests/data/models/make_models.py`` as a module: where the committed input models are (``HERE``) and the
    seeded builders of the data they were trained on."""
    import importlib.util

    path = Path(__file__).resolve().parent / "data" / "models" / "make_models.py"
    spec = importlib.util.spec_from_file_location("make_models", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
