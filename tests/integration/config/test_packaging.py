"""The wheel ships the target files, and a non-editable install finds them."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

from edgedeploy.config.targets import builtin_target_names

REPO = Path(__file__).resolve().parents[3]


def test_wheel_contains_every_target_and_installed_copy_finds_them(tmp_path):
    # built with the build backend the test extra installs (pyproject.toml's [build-system] pin), not one pip
    # would fetch from the network into an isolated environment
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", str(tmp_path),
                    str(REPO)], check=True, capture_output=True)
    (wheel,) = tmp_path.glob("edgedeploy-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    shipped = sorted(Path(n).stem for n in names if n.startswith("edgedeploy/targets/") and n.endswith(".toml"))
    assert shipped == builtin_target_names() and len(shipped) == 15
    # the template files the export and the firmware build render are package data
    for template in ("export/templates/CMakeLists.txt.in", "export/templates/edgedeploy.cmake.in",
                     "hil/emulate/templates/main.cc.in", "hil/emulate/templates/tflm.cmake",
                     "hil/emulate/templates/firmware_CMakeLists.txt.in", "hil/emulate/templates/arm-none-eabi.cmake"):
        assert f"edgedeploy/{template}" in names, template
    # unpacked on its own (no source tree), the package finds its targets inside itself
    site = tmp_path / "site"
    zipfile.ZipFile(wheel).extractall(site)
    code = ("import sys; sys.path.insert(0, sys.argv[1]); from edgedeploy.config.targets import builtin_targets_dir, "
            "get_target; print(builtin_targets_dir()); print(get_target('corstone-320-u85-256').fvp.binary)")
    out = subprocess.run([sys.executable, "-c", code, str(site)], check=True, capture_output=True, text=True,
                         cwd=tmp_path).stdout.split()
    assert out == [str(site / "edgedeploy" / "targets"), "FVP_Corstone_SSE-320"]
