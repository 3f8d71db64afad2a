"""edgedeploy.cli.app and .prestart: the command list, help examples, shell completion, Vela workers started early."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from helpers import ran_in_a_fresh_interpreter, run_cli

from edgedeploy.cli import prestart as prestart_module
from edgedeploy.cli.app import COMMANDS, app

EXAMPLE_MODEL = Path(__file__).resolve().parents[3] / "examples" / "kws" / "dscnn_mlperf_int8.tflite"
HELP_PAGES = [[name] for name in COMMANDS] + [["targets", "list"], ["targets", "show"], ["fvp", "run"]]


@pytest.mark.parametrize("words", HELP_PAGES, ids=" ".join)
def test_every_help_page_shows_an_example(words):
    result = CliRunner().invoke(app, [*words, "--help"], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    example = [line.strip() for line in result.output.splitlines() if "Example: edgedeploy " in line]
    assert example, result.output
    assert example[0].split("Example: ", 1)[1].startswith("edgedeploy " + words[0])


def test_the_command_list_is_the_registered_commands():
    result = CliRunner().invoke(app, ["--help"], env={"COLUMNS": "200"})
    for name in COMMANDS:
        assert f" {name} " in result.output


def test_shell_completion_of_commands_and_targets():
    env = {"_EDGEDEPLOY_COMPLETE": "complete_bash", "COMP_WORDS": "edgedeploy comp", "COMP_CWORD": "1"}
    result = CliRunner().invoke(app, [], prog_name="edgedeploy", env=env)
    assert result.output.split() == ["compile"]
    env.update(COMP_WORDS="edgedeploy compile m.tflite -t ethos-u85", COMP_CWORD="4")
    names = CliRunner().invoke(app, [], prog_name="edgedeploy", env=env).output.split()
    assert names and all(n.startswith("ethos-u85") for n in names) and "ethos-u85-256" in names
    # the shell named, not the one typer finds above this process (a test run started from `sh` finds sh, which it
    # has no script for)
    script = run_cli("--show-completion", "bash", env={"_TYPER_COMPLETE_TEST_DISABLE_SHELL_DETECTION": "1"})
    assert script.returncode == 0 and "COMP_WORDS" in script.stdout


def test_help_and_completion_import_neither_tensorflow_nor_vela():
    code = ("import sys; from typer.testing import CliRunner; from edgedeploy.cli.app import app; "
            "CliRunner().invoke(app, ['compile', '--help']); "
            "print([m for m in ('tensorflow', 'ethosu', 'numpy', 'pydantic') if m in sys.modules])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


@pytest.fixture
def recorded(monkeypatch):
    """Replace the compile command's prestart hook by one that records what it was given and starts one
    real Vela worker whose closing is recorded."""
    from edgedeploy.vela.pool import VelaPool

    calls: list[dict] = []
    closed: list[bool] = []

    class Recorded(VelaPool):
        def close(self, now: bool = False) -> None:
            closed.append(now)
            super().close(now)

    def hook(values, warm=None):
        calls.append(values)
        return Recorded(1).start()

    monkeypatch.setitem(prestart_module.PRESTART, "compile", hook)
    return calls, closed


def test_prestart_gets_the_values_click_split_and_its_result_is_closed(recorded, tmp_path):
    calls, closed = recorded
    missing = tmp_path / "missing.tflite"
    result = CliRunner().invoke(app, ["-q", "compile", str(missing), "b.tflite", "-t", "ethos-u55-128",
                                      "--target=ethos-u85-256", "-j", "3", "-o", str(tmp_path / "out")])
    assert result.exit_code == 3, result.output  # the missing model is still reported by the command itself
    [values] = calls
    assert tuple(values["models"]) == (str(missing), "b.tflite")
    assert list(values["target"]) == ["ethos-u55-128", "ethos-u85-256"]
    assert values["jobs"] == "3" and values["out"] == str(tmp_path / "out")
    assert values["executor"] == "local" and values["debug_db"] is False  # defaults of options not given
    assert closed and closed[-1] is True  # ended with the command, without waiting for the workers


@pytest.mark.parametrize("argv", [["compile", "--help"], ["--bogus", "compile", "m.tflite"], ["targets", "list"],
                                  ["compile", "m.tflite", "--no-such-option"]])
def test_prestart_starts_nothing_for_help_errors_and_other_commands(recorded, argv):
    calls, _ = recorded
    CliRunner().invoke(app, argv)
    assert calls == []


def test_compile_prestart_starts_workers_only_for_a_new_tflite_run(tmp_path):
    from edgedeploy.cli.compile import prestart

    base = {"models": (str(EXAMPLE_MODEL),), "target": ["ethos-u55-128", "ethos-u85-256"], "jobs": None,
            "out": tmp_path / "out", "executor": "local"}
    assert prestart({**base, "executor": "ray"}) is None
    assert prestart({**base, "target": []}) is None  # the command itself says a target is missing
    assert prestart({**base, "models": ("edgedeploy.toml",)}) is None
    (tmp_path / "rerun").mkdir()
    (tmp_path / "rerun" / "manifest.json").write_text("{}")
    assert prestart({**base, "out": str(tmp_path / "rerun")}) is None  # a re-run starts workers only if needed
    pool = prestart({**base, "jobs": "1"})
    try:
        assert pool.jobs == 1
    finally:
        pool.close(now=True)


def test_the_worker_started_with_the_process_is_adopted_by_a_compile_and_ended_by_other_commands(request, tmp_path):
    from edgedeploy.cli.compile import prestart
    from edgedeploy.vela.worker import WarmWorker

    if ran_in_a_fresh_interpreter(request, tmp_path):
        return

    warm = WarmWorker()
    base = {"models": (str(EXAMPLE_MODEL),), "target": ["ethos-u55-128", "ethos-u85-256"], "jobs": "2",
            "out": tmp_path / "out", "executor": "local"}
    pool = prestart(base, warm)
    try:
        assert pool.holds(warm) and pool.workers == 2  # the warm worker and one more for the second target
        assert [pool.call(int, "7").result() for _ in range(3)] == [7, 7, 7]
        assert warm.submit(os.getpid).result() == warm.pid  # it runs jobs in its own process
    finally:
        pool.close(now=True)
    assert pool.workers == 0 and warm.submit(int, "1").exception() is not None
    for argv in (["targets", "list"], ["compile", "--help"], ["compile", "edgedeploy.toml"]):
        other = WarmWorker()
        CliRunner().invoke(app, argv, obj=other)
        with pytest.raises(ChildProcessError):  # ended and reaped before the command ran
            os.waitpid(other.pid, os.WNOHANG)


def test_only_a_command_that_compiles_forks_the_warm_worker():
    from edgedeploy.cli import PRESTART_COMMANDS, may_compile
    from edgedeploy.cli.prestart import PRESTART

    assert set(PRESTART_COMMANDS) == set(PRESTART)  # the commands that can adopt it
    assert may_compile(["compile", "m.tflite", "-t", "ethos-u55-128"]) and may_compile(["-v", "compile", "p.toml"])
    for argv in (["report", "run"], ["targets", "list"], ["export", "run", "-o", "fw"], ["compile", "--help"],
                 ["--version"], [], ["-q"]):
        assert not may_compile(argv), argv


def test_no_warm_worker_is_forked_from_a_process_that_loaded_tensorflow():
    """The console script's function called from a program that imported TensorFlow: a fork would leave the child
    waiting on TensorFlow's threads, so the command runs without the warm worker."""
    import types

    from edgedeploy.vela.worker import fork_warm_worker

    with pytest.MonkeyPatch.context() as mp:  # (undone before the unit tests' TensorFlow check)
        mp.setattr(os, "sched_getaffinity", lambda pid: {0, 1}, raising=False)  # two cores: it would fork
        mp.setitem(sys.modules, "tensorflow", types.ModuleType("tensorflow"))
        assert fork_warm_worker() is None


def test_a_warm_worker_that_dies_fails_its_jobs_with_a_broken_pool(request, tmp_path):
    import signal
    from concurrent.futures.process import BrokenProcessPool

    from edgedeploy.vela.worker import WarmWorker

    if ran_in_a_fresh_interpreter(request, tmp_path):
        return
    warm = WarmWorker()
    try:
        assert warm.submit(divmod, 7, 2).result() == (3, 1)
        with pytest.raises(ZeroDivisionError):  # an error in the job is the job's
            warm.submit(divmod, 1, 0).result()
        with pytest.raises(BrokenProcessPool):
            warm.submit(signal.raise_signal, signal.SIGKILL).result()
        with pytest.raises(BrokenProcessPool):
            warm.submit(int, "1").result()
    finally:
        warm.close(now=True)
