"""Bad data through the command line with a real model: refused before anything trains or is written."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from helpers import run_in_process

REPO = Path(__file__).resolve().parents[3]
MODEL = REPO / "examples" / "kws_tree" / "dscnn_mlperf_float.h5"  # input 49x10x1, 12 classes


def test_one_hot_targets_with_a_nan_row_end_in_one_line_and_exit_3(tmp_path):
    rng = np.random.default_rng(0)
    y = np.eye(12, dtype=np.float32)[rng.integers(0, 12, 24)]
    y[7] = np.nan
    np.savez(tmp_path / "d.npz", x_train=rng.normal(size=(24, 49, 10, 1)).astype(np.float32), y_train=y,
             x_test=rng.normal(size=(8, 49, 10, 1)).astype(np.float32), y_test=np.eye(12, dtype=np.float32)[:8])
    # the command in this process, which has TensorFlow loaded already: the check is its exit code and its line
    proc = run_in_process("optimize", MODEL, "--data", tmp_path / "d.npz", "--leaves", "ptq", "-o", tmp_path / "out")
    assert proc.returncode == 3, proc.stderr[-2000:]
    assert proc.stderr.startswith("error: ") and proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr
    assert "'y_train' holds nan at index [7, 0] (sample 7" in proc.stderr
    assert not (tmp_path / "out" / "manifest.json").exists()
