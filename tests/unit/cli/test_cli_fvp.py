"""edgedeploy.cli.fvp: `edgedeploy fvp run` without an FVP."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from typer.testing import CliRunner

from edgedeploy.cli.app import app
from edgedeploy.errors import ToolMissingError
from edgedeploy.fvp import discovery
from edgedeploy.core.manifest import Artifact, Manifest, StageRecord

REPO = Path(__file__).resolve().parents[3]
EDGEDEPLOY = REPO / ".venv" / "bin" / "edgedeploy"


def compiled_run(tmp_path: Path) -> Path:
    """A run folder whose manifest records one compile (the file is not read before the FVP is found)."""
    run = tmp_path / "run"
    out = run / "compile" / "kws" / "corstone-300-u55-128"
    out.mkdir(parents=True)
    (out / "model_int8_vela.tflite").write_bytes(b"placeholder")
    manifest = Manifest(run)
    manifest.records["compile/kws/corstone-300-u55-128"] = StageRecord(
        id="compile/kws/corstone-300-u55-128", stage="compile", status="ok", variant="kws",
        target="corstone-300-u55-128",
        outputs=[Artifact.of("vela_model", out / "model_int8_vela.tflite", run)],
    )
    manifest.save()
    return run


def test_fvp_run_without_an_fvp(no_fvps, tmp_path):
    run = compiled_run(tmp_path)
    before = (run / "manifest.json").read_bytes()
    result = CliRunner().invoke(app, ["fvp", "run", str(run), "--leaf", "kws", "--target", "corstone-300-u55-128"])
    assert result.exit_code == ToolMissingError.exit_code == 5
    assert result.stdout == ""
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1
    assert lines[0].startswith(
        "error: the Arm FVP FVP_Corstone_SSE-300_Ethos-U55 needed for target corstone-300-u55-128"
    )
    assert discovery.FVP_DOWNLOAD_PAGE in lines[0] and "EDGEDEPLOY_FVP_DIR" in lines[0]
    assert (run / "manifest.json").read_bytes() == before


def test_fvp_run_without_a_runner(no_fvps, tmp_path, monkeypatch):
    run = compiled_run(tmp_path)
    placeholder = tmp_path / "fvps" / "FVP_Corstone_SSE-300_Ethos-U55"  # found, never run
    placeholder.parent.mkdir()
    placeholder.write_text("#!/bin/sh\nexit 127\n")
    placeholder.chmod(0o755)
    monkeypatch.setenv("EDGEDEPLOY_FVP_DIR", str(placeholder.parent))
    result = CliRunner().invoke(
        app, ["fvp", "run", str(run), "-l", "kws", "-t", "corstone-300-u55-128", "--json"]
    )
    assert result.exit_code == 5
    assert result.stdout == ""  # --json prints nothing when there is no result
    line = result.stderr.strip()
    assert "\n" not in line
    assert "no inference runner application for target corstone-300-u55-128" in line
    assert "-Dinference_runner_DYNAMIC_MEM_LOAD_ENABLED=ON" in line


def test_fvp_run_usage_errors(no_fvps, tmp_path):
    run = compiled_run(tmp_path)
    npu_only = CliRunner().invoke(app, ["fvp", "run", str(run), "-l", "kws", "-t", "ethos-u55-128"])
    assert npu_only.exit_code == 2 and "not a board" in npu_only.stderr
    unknown = CliRunner().invoke(app, ["fvp", "run", str(run), "-l", "kws", "-t", "corstone-301"])
    assert unknown.exit_code == 4 and "unknown target" in unknown.stderr
    no_leaf = CliRunner().invoke(app, ["fvp", "run", str(run), "-t", "corstone-300-u55-128"])
    assert no_leaf.exit_code != 0


def test_fvp_help_lists_run():
    result = CliRunner().invoke(app, ["fvp", "--help"])
    assert result.exit_code == 0 and "run" in result.stdout


def test_fvp_run_subprocess_prints_one_line(tmp_path):
    """The installed console script, in a clean environment with no FVP on PATH."""
    if not EDGEDEPLOY.exists():
        pytest.skip(f"{EDGEDEPLOY} is not installed")
    run = compiled_run(tmp_path)
    env = {"PATH": str(tmp_path), "HOME": str(tmp_path), "NO_COLOR": "1", "COLUMNS": "200"}
    proc = subprocess.run(
        [str(EDGEDEPLOY), "fvp", "run", str(run), "--leaf", "kws", "--target", "corstone-320-u85-256"],
        capture_output=True, text=True, env=env, timeout=120,
    )
    # corstone-320 is not compiled in this run, but the missing FVP is reported first
    assert proc.returncode == 5, proc.stderr
    assert proc.stdout == ""
    assert len(proc.stderr.strip().splitlines()) == 1
    assert "FVP_Corstone_SSE-320" in proc.stderr
