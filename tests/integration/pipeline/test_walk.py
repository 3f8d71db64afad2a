"""`edgedeploy compile PROJECT --walk` on the bundled example (real DS-CNN, real Speech Commands clips, real
TFMOT and Vela): the walk stops at the first level that meets the requirements and trains nothing deeper;
when nothing meets them it says by how much and exits 8.

Training is cut to one epoch (min_steps = 0) on a seeded third of the clips to keep the test short: it checks the
walk (which levels are trained, compiled sizes against a flash limit), not recovery or accuracy. The third level is
pruned_clustered (level 3, like pqat, whose quantization-aware model takes longer to build).
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest

from helpers import run_in_process

from edgedeploy.core.manifest import Manifest

EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "kws_tree"
FLASH_LIMIT = 32768  # between the pruned leaf (~27.7 kB) and ptq (~35.9 kB) compiled for ethos-u55-128


def clips(tmp: Path, fit: int = 300, evaluation: int = 130) -> Path:
    """A seeded choice of ``fit`` fine-tune and ``evaluation`` evaluation clips of the example's data, every key
    kept (x, y, split, labels, files)."""
    import numpy as np

    rng = np.random.default_rng(0)
    with np.load(EXAMPLE / "speech_commands_subset.npz") as d:
        arrays = {k: d[k] for k in d.files}
    rows = np.sort(np.concatenate([rng.choice(np.flatnonzero(arrays["split"] == s), n, replace=False)
                                   for s, n in ((0, fit), (1, evaluation))]))
    path = tmp / "clips.npz"
    np.savez(path, **{k: v if k == "labels" else v[rows] for k, v in arrays.items()})
    return path


def project(tmp: Path, out: Path, requirements: str, data: Path,
            leaves: tuple[str, ...] = ("ptq", "pruned", "pruned_clustered")) -> Path:
    path = tmp / "edgedeploy.toml"
    path.write_text(
        f'model = "{EXAMPLE / "dscnn_mlperf_float.h5"}"\ndata = "{data}"\n'
        f'out = "{out}"\ntargets = ["ethos-u55-128"]\n'
        f'[recipe]\nleaves = {json.dumps(list(leaves))}\n'
        'epochs = 1\nbatch_size = 64\nlearning_rate = 1e-4\nseed = 0\n'
        'training.min_steps = 0\n'
        f"[requirements]\n{requirements}\n")
    return path


class Reads:
    """Every checked read of an input file by edgedeploy (:func:`edgedeploy.core.files.check_input_file`, whichever
    module calls it) and every call of the driver's loaders, counted while a command runs."""

    def __init__(self, mp: pytest.MonkeyPatch) -> None:
        import edgedeploy.core.files as files
        from edgedeploy.pipeline import run_plan

        self.files: dict[Path, int] = {}
        self.calls: dict[str, int] = {}
        real_check = files.check_input_file

        def check(path, *args, **kwargs):
            key = Path(path).resolve()
            self.files[key] = self.files.get(key, 0) + 1
            return real_check(path, *args, **kwargs)

        for name, module in list(sys.modules.items()):  # the modules that imported it by name, and files itself
            if name.startswith("edgedeploy") and getattr(module, "check_input_file", None) is real_check:
                mp.setattr(module, "check_input_file", check)
        for loader in ("load_model", "read_data_file", "load_dataset", "teacher_targets", "decide"):
            mp.setattr(run_plan, loader, self._counted(loader, getattr(run_plan, loader)))

    def _counted(self, name, fn):
        def counted(*args, **kwargs):
            self.calls[name] = self.calls.get(name, 0) + 1
            return fn(*args, **kwargs)
        return counted


@pytest.fixture(scope="module")
def walked(tmp_path_factory):
    from edgedeploy import api
    import edgedeploy.keras.model  # noqa: F401  (loaded before the count starts, as the command loads it)
    import edgedeploy.pipeline.driver  # noqa: F401

    tmp = tmp_path_factory.mktemp("walk")
    out = tmp / "run"
    data = clips(tmp)
    path = project(tmp, out, f"max_flash = {FLASH_LIMIT}", data)
    with pytest.MonkeyPatch.context() as mp:
        reads = Reads(mp)
        outcome = api.compile([path], walk=True)
    outcome.reads, outcome.project, outcome.data = reads, path, data
    return outcome


def test_a_walk_reads_the_project_once_and_loads_the_model_and_data_once(walked):
    """Two levels walked (ptq, then pruned): the project file is read once, the model, the data and the teacher's
    outputs loaded once for the whole walk. The baseline stage reads the model file once more, as its recorded
    input (the stage's work may run in another process); no level reloads anything."""
    reads = walked.reads
    assert [lv["level"] for lv in walked.walk["levels"]] == [0, 2]
    assert reads.files[walked.project.resolve()] == 1
    assert reads.calls == {"load_model": 1, "read_data_file": 1, "decide": 1, "load_dataset": 1,
                           "teacher_targets": 1}
    model = (EXAMPLE / "dscnn_mlperf_float.h5").resolve()
    data = walked.data.resolve()
    assert reads.files[model] == 2  # the driver's load, and the baseline stage's
    assert reads.files[data] == 1


def test_walk_stops_at_the_first_level_that_meets_and_trains_nothing_deeper(walked):
    rec = walked.walk
    assert rec["stopped"] == "met" and rec["recommended"] == "pruned" and rec["recommended_level"] == 2
    assert [lv["level"] for lv in rec["levels"]] == [0, 2]
    assert rec["levels"][0]["nodes_trained"] == ["baseline"] and rec["levels"][1]["nodes_trained"] == ["pruned"]
    ptq = rec["levels"][0]["verdicts"]["ptq"]["ethos-u55-128"]
    assert ptq["meets"] is False and ptq["requirements"]["max_flash"]["met"] is False
    assert ptq["requirements"]["max_flash"]["excess"] == ptq["requirements"]["max_flash"]["value"] - FLASH_LIMIT
    assert rec["levels"][1]["verdicts"]["pruned"]["ethos-u55-128"]["meets"] is True
    assert rec["not_walked"] == ["pruned_clustered"]
    manifest = Manifest.load(walked.run_dir)
    assert manifest.info["walk"] == json.loads(json.dumps(rec))
    ids = {r.id for r in manifest.find()}
    assert "optimize/pruned" in ids and "compile/pruned/ethos-u55-128" in ids
    assert not any("pruned_clustered" in i for i in ids)  # the level below was not trained, converted or compiled


def test_report_shows_the_walk(walked):
    proc = run_in_process("report", walked.run_dir)
    assert proc.returncode == 0, proc.stderr
    assert "Walk level 0: trained baseline; ptq (ethos-u55-128: misses max_flash)" in proc.stdout
    assert "Walk level 2: trained pruned; pruned (ethos-u55-128: meets)" in proc.stdout
    assert "recommend pruned; not trained: pruned_clustered" in proc.stdout


@pytest.mark.parametrize("leaves", [
    # the levels walked before, every one reused: the walk ends exhausted without training anything
    pytest.param(("ptq", "pruned"), id="reused"),
    # and a level below them, trained now
    pytest.param(("ptq", "pruned", "pruned_clustered"), id="deeper", marks=pytest.mark.slow),
])
def test_walk_that_nothing_meets_exits_8_and_says_by_how_much(walked, tmp_path, leaves):
    out = tmp_path / "run"
    shutil.copytree(walked.run_dir, out)  # the levels walked before are reused
    proc = run_in_process("compile", project(tmp_path, out, "max_flash = 1024", walked.data, leaves), "--walk")
    assert proc.returncode == 8, proc.stderr
    assert "Traceback" not in proc.stderr
    (line,) = [ln for ln in proc.stderr.splitlines() if ln.startswith("error:")]
    assert "max_flash 1,024 B: closest is" in line and "over by" in line
    rec = Manifest.load(out).info["walk"]
    assert rec["stopped"] == "exhausted" and rec["recommended"] is None
    assert [lv["level"] for lv in rec["levels"]] == [0, 2, 3][:len(leaves)]
    assert rec["levels"][0]["nodes_trained"] == [] and rec["levels"][0]["nodes_reused"] == ["baseline"]
    assert rec["levels"][1]["nodes_trained"] == [] and rec["levels"][1]["nodes_reused"] == ["pruned"]
    if "pruned_clustered" in leaves:
        assert rec["levels"][2]["nodes_trained"] == ["pruned_clustered"]
    (unmet,) = rec["unmet"]
    assert unmet["requirement"] == "max_flash" and unmet["excess"] == unmet["value"] - 1024 > 0
