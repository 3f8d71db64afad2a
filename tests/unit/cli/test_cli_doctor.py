"""edgedeploy.cli.doctor: `edgedeploy doctor`, with the machine's FVPs and runners hidden."""

from __future__ import annotations

import json
import subprocess
import sys
from importlib.metadata import version

from typer.testing import CliRunner

from edgedeploy.pipeline import environment as doctor
from edgedeploy.cli.app import app
from edgedeploy.fvp import discovery


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
