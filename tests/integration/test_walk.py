"""`edgedeploy compile PROJECT --walk` on the bundled example (real DS-CNN, real Speech Commands clips, real
TFMOT and Vela): the walk stops at the first level that meets the requirements and trains nothing deeper;
when nothing meets them it says by how much and exits 8.

Training is cut to one epoch (min_steps = 0) to keep the test short: it checks the walk, not recovery.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from edgedeploy.core.manifest import Manifest

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "kws_tree"
FLASH_LIMIT = 32768  # between the pruned leaf (~27.7 kB) and ptq (~35.9 kB) compiled for ethos-u55-128


def project(tmp: Path, out: Path, requirements: str) -> Path:
    path = tmp / "edgedeploy.toml"
    path.write_text(
        f'model = "{EXAMPLE / "dscnn_mlperf_float.h5"}"\ndata = "{EXAMPLE / "speech_commands_subset.npz"}"\n'
        f'out = "{out}"\ntargets = ["ethos-u55-128"]\n'
        '[recipe]\nleaves = ["ptq", "pruned", "pqat"]\nepochs = 1\nbatch_size = 64\nlearning_rate = 1e-4\nseed = 0\n'
        'training.min_steps = 0\n'
        f"[requirements]\n{requirements}\n")
    return path


def run_cli(*args):
    return subprocess.run([sys.executable, "-m", "edgedeploy", *map(str, args)], capture_output=True, text=True,
                          env={**os.environ, "NO_COLOR": "1", "COLUMNS": "200"})


@pytest.fixture(scope="module")
def walked(tmp_path_factory):
    from edgedeploy.pipeline.walk import walk_project

    tmp = tmp_path_factory.mktemp("walk")
    out = tmp / "run"
    outcome = walk_project(project(tmp, out, f"max_flash = {FLASH_LIMIT}"))
    return outcome


def test_walk_stops_at_the_first_level_that_meets_and_trains_nothing_deeper(walked):
    rec = walked.record
    assert rec["stopped"] == "met" and rec["recommended"] == "pruned" and rec["recommended_level"] == 2
    assert [lv["level"] for lv in rec["levels"]] == [0, 2]
    assert rec["levels"][0]["nodes_trained"] == ["baseline"] and rec["levels"][1]["nodes_trained"] == ["pruned"]
    ptq = rec["levels"][0]["verdicts"]["ptq"]["ethos-u55-128"]
    assert ptq["meets"] is False and ptq["requirements"]["max_flash"]["met"] is False
    assert ptq["requirements"]["max_flash"]["excess"] == ptq["requirements"]["max_flash"]["value"] - FLASH_LIMIT
    assert rec["levels"][1]["verdicts"]["pruned"]["ethos-u55-128"]["meets"] is True
    assert rec["not_walked"] == ["pqat"]
    manifest = Manifest.load(walked.run_dir)
    assert manifest.info["walk"] == json.loads(json.dumps(rec))
    ids = {r.id for r in manifest.find()}
    assert "optimize/pruned" in ids and "compile/pruned/ethos-u55-128" in ids
    assert not any("pqat" in i for i in ids)  # the level below was not trained, converted or compiled


def test_report_shows_the_walk(walked):
    proc = run_cli("report", walked.run_dir)
    assert proc.returncode == 0, proc.stderr
    assert "Walk level 0: trained baseline; ptq (ethos-u55-128: misses max_flash)" in proc.stdout
    assert "Walk level 2: trained pruned; pruned (ethos-u55-128: meets)" in proc.stdout
    assert "recommend pruned; not trained: pqat" in proc.stdout


def test_walk_that_nothing_meets_exits_8_and_says_by_how_much(walked, tmp_path):
    out = tmp_path / "run"
    shutil.copytree(walked.run_dir, out)  # the levels walked before are reused, pqat is trained now
    proc = run_cli("compile", project(tmp_path, out, "max_flash = 1024"), "--walk")
    assert proc.returncode == 8, proc.stderr
    assert "Traceback" not in proc.stderr
    (line,) = [ln for ln in proc.stderr.splitlines() if ln.startswith("error:")]
    assert "max_flash 1,024 B: closest is" in line and "over by" in line
    rec = Manifest.load(out).info["walk"]
    assert rec["stopped"] == "exhausted" and rec["recommended"] is None
    assert [lv["level"] for lv in rec["levels"]] == [0, 2, 3]
    assert rec["levels"][0]["nodes_trained"] == [] and rec["levels"][0]["nodes_reused"] == ["baseline"]
    assert rec["levels"][2]["nodes_trained"] == ["pqat"]
    (unmet,) = rec["unmet"]
    assert unmet["requirement"] == "max_flash" and unmet["excess"] == unmet["value"] - 1024 > 0
