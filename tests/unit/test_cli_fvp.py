"""`edgedeploy fvp run` without an FVP, and `edgedeploy doctor`."""

from __future__ import annotations

import json
import subprocess
import sys
from importlib.metadata import version
from pathlib import Path

import pytest
from typer.testing import CliRunner

from edgedeploy import doctor
from edgedeploy.cli.app import app
from edgedeploy.errors import ToolMissingError
from edgedeploy.fvp import discovery
from edgedeploy.manifest import Artifact, Manifest, StageRecord

REPO = Path(__file__).resolve().parents[2]
EDGEDEPLOY = REPO / ".venv" / "bin" / "edgedeploy"


@pytest.fixture
def no_fvps(monkeypatch, tmp_path):
    """Hide any FVP or runner the machine has."""
    empty = tmp_path / "empty-path"
    empty.mkdir()
    monkeypatch.setenv("PATH", f"{empty}")
    monkeypatch.setattr(discovery, "usual_install_dirs", lambda: [])
    monkeypatch.delenv(discovery.ENV_RUNNER, raising=False)
    monkeypatch.delenv("XDG_DATA_HOME", raising=False)


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


# --------------------------------------------------------------------------- doctor


def test_doctor_json_lists_everything(no_fvps):
    result = CliRunner().invoke(app, ["doctor", "--json"])
    assert result.exit_code == 0, result.stderr
    data = json.loads(result.stdout)
    assert data["schema"] == "edgedeploy.doctor" and data["schema_version"] == 1
    checks = {c["name"]: c for c in data["checks"]}
    for name in ("python", "tensorflow", "tf-keras", "tensorflow-model-optimization", "ethos-u-vela"):
        assert checks[name]["required"] and checks[name]["found"]
        if name != "python":
            assert checks[name]["version"] == version(name)
    for binary in discovery.FVP_PACKAGES:
        c = checks[f"FVP {binary}"]
        assert not c["required"] and not c["found"] and discovery.FVP_DOWNLOAD_PAGE in c["hint"]
    for board in ("corstone-300-u55-128", "corstone-300-u65-256", "corstone-310-u55-256", "corstone-320-u85-256"):
        c = checks[f"runner {board}"]
        assert not c["found"] and "DYNAMIC_MEM_LOAD_ENABLED" in c["hint"]
    for name in ("arm-none-eabi-gcc", "cmake", "tflite-micro"):
        assert name in checks and not checks[name]["required"]
        assert checks[name]["found"] or checks[name]["hint"]
    assert data["ok"] is True and data["missing_required"] == []
    assert "FVP FVP_Corstone_SSE-320" in data["missing_optional"]


def test_doctor_table(no_fvps):
    result = CliRunner().invoke(app, ["doctor"])
    assert result.exit_code == 0
    for word in ("tensorflow", "ethos-u-vela", "FVP_Corstone_SSE-300_Ethos-U55", "runner corstone-320-u85-256",
                 "arm-none-eabi-gcc", "tflite-micro", "optional"):
        assert word in result.stdout
    assert "optional parts missing: FVP FVP_Corstone_SSE-300_Ethos-U55" in result.stderr


def test_doctor_fails_without_vela(no_fvps, monkeypatch):
    real = doctor._dist_version
    monkeypatch.setattr(doctor, "_dist_version", lambda name: None if name == "ethos-u-vela" else real(name))
    result = CliRunner().invoke(app, ["doctor", "--json"])
    assert result.exit_code == 5
    data = json.loads(result.stdout)
    assert data["ok"] is False and data["missing_required"] == ["ethos-u-vela"]
    assert "required parts missing: ethos-u-vela" in result.stderr
    assert f"pip install ethos-u-vela=={version('ethos-u-vela')}" in result.stderr


def test_doctor_does_not_import_tensorflow():
    code = (
        "import sys\n"
        "from typer.testing import CliRunner\n"
        "from edgedeploy.cli.app import app\n"
        "r = CliRunner().invoke(app, ['doctor', '--json'])\n"
        "assert r.exit_code in (0, 5), r.stderr\n"
        "bad = [m for m in ('tensorflow', 'tf_keras', 'ethosu.vela') if m in sys.modules]\n"
        "print(','.join(bad))\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == ""
