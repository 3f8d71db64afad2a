"""edgedeploy.cli.report: exit codes, project file, the gate and --help, through the command line (the console
script, and the command in this process where the check is its outcome).

tests/data/report/run_u55_u85 is a run folder written by `edgedeploy compile` with Vela 5.2.0 (see its
SOURCE.md): the MLPerf DS-CNN and ResNet-8 int8 models on corstone-300-u55-128 and ethos-u85-256.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from helpers import run_cli, run_cli_loading, run_in_process


RUN = Path(__file__).resolve().parents[2] / "data" / "report" / "run_u55_u85"


def test_cli_exit_codes_and_project_file(tmp_path):
    proc = run_cli("report", RUN, "--json", "--max-flash", "20KiB")
    assert proc.returncode == 8
    assert json.loads(proc.stdout)["schema"] == "edgedeploy.report"  # stdout is only JSON
    assert "no leaf meets max_flash" in proc.stderr
    # the rest in this process (the console script above): the checks are exit codes and messages
    (tmp_path / "edgedeploy.toml").write_text('[requirements]\nmax_flash = "20KiB"\n')
    assert run_in_process("report", RUN, "--json", cwd=tmp_path).returncode == 8  # ./edgedeploy.toml applies
    assert run_in_process("report", RUN, "--json", "--max-flash", "1MiB", cwd=tmp_path).returncode == 0
    other = tmp_path / "other.toml"
    other.write_text("[requirements]\nmax_sram = 1\n")
    proc = run_in_process("report", RUN, "--json", "--project", other)
    assert proc.returncode == 8 and "max_sram" in proc.stderr
    for args, msg in ((["--format", "pdf"], "--format is 'pdf'"), (["--max-flash", "big"], "--max-flash is 'big'"),
                      (["--fail-on-regression"], "need a reference report")):
        proc = run_in_process("report", RUN, *args)
        assert proc.returncode == 2 and msg in proc.stderr
    proc = run_in_process("report", tmp_path)
    assert proc.returncode == 3 and "has no manifest.json" in proc.stderr


def test_help_imports_no_heavy_modules():
    code = ("import sys; from edgedeploy.cli.app import app; "
            "bad = [m for m in ('tensorflow', 'matplotlib', 'numpy', 'h5py') if m in sys.modules]; print(bad)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
    help_text = run_in_process("report", "--help").stdout  # the text: the same in this process
    assert "--fail-on-regression" in help_text and "[requirements]" in help_text


def test_a_json_report_loads_no_numpy():
    """Reading manifests and judging them needs no array library: `edgedeploy report --json` starts without numpy
    (about half the processor time it took with it)."""
    proc, loaded = run_cli_loading("report", RUN, "--json", watch=("numpy", "tensorflow", "ethosu.vela"))
    assert proc.returncode == 0 and loaded == [], proc.stdout + proc.stderr
    assert json.loads(proc.stdout)["rows"]


def test_cli_gate(tmp_path):
    ref = tmp_path / "old.json"
    assert run_in_process("report", RUN, "--format", "json", "--out", ref).returncode == 0
    ok = run_in_process("report", RUN, "--compare", ref, "--fail-on-regression", "--format", "markdown")
    assert ok.returncode == 0 and "no regression" in ok.stdout
    old = json.loads(ref.read_text())
    old["rows"][0]["values"]["total_cycles"]["value"] -= 10_000
    ref.write_text(json.dumps(old))
    bad = run_in_process("report", RUN, "--compare", ref, "--fail-on-regression", "--format", "csv")
    assert bad.returncode == 10
    assert "1 regression(s)" in bad.stderr and "total cycles" in bad.stderr


def test_a_walked_run_is_reported_against_the_walks_requirements(tmp_path):
    import shutil

    run = tmp_path / "run"
    shutil.copytree(RUN, run)
    data = json.loads((run / "manifest.json").read_text())
    data.setdefault("info", {})["walk"] = {"requirements": {"max_flash": 20480, "max_sram": None,
                                                            "sources": ["edgedeploy.toml [requirements]"]}}
    (run / "manifest.json").write_text(json.dumps(data))
    proc = run_in_process("report", run, "--json", cwd=tmp_path)  # no project file here: the walk's requirements apply
    assert proc.returncode == 8 and "no leaf meets max_flash" in proc.stderr, proc.stderr
    assert json.loads(proc.stdout)["requirements"]["max_flash"] == 20480
    given = run_in_process("report", run, "--json", "--max-flash", "1MiB", cwd=tmp_path)
    assert given.returncode == 0  # given ones win


def test_the_tolerance_option_states_the_gate_defaults():
    """The command line may import only the API, so its help states the default tolerances in text: the same as
    the gate's own (report.limits.DEFAULT_TOLERANCES)."""
    import inspect

    from edgedeploy.cli.report import report_cmd
    from edgedeploy.report.limits import DEFAULT_TOLERANCE_TEXT

    option = inspect.signature(report_cmd).parameters["tolerance"].default
    assert f"(default {DEFAULT_TOLERANCE_TEXT})" in option.help
