"""Processor time of the bundled example's tree with the garbage collector as edgedeploy sets it for TensorFlow work
(``edgedeploy.keras.tfenv.GC_THRESHOLD``) and with Python's default thresholds.

Each run is `edgedeploy optimize` on examples/kws_tree with every default leaf and pcqat_palette, 2 epochs, seed 0
(the test suite's shared tree), one TensorFlow thread, into a fresh folder. The two settings of a pair run at the
same time, one per core (a shared machine's speed drifts by a fifth within minutes: runs in turn would measure
the drift). Prints each run's processor and wall seconds and peak memory, the ratio of each pair, and whether the
two settings wrote the same metrics and the same files (they must: the collector only decides when unreachable
objects are freed).

Run: python bench/bench_gc.py [--pairs 2]   (on at least 2 cores)
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
EXAMPLE = REPO / "examples" / "kws_tree"
ARGS = ["optimize", str(EXAMPLE / "dscnn_mlperf_float.h5"), "--data", str(EXAMPLE / "speech_commands_subset.npz"),
        "--leaves", "ptq,qat,pruned,pqat,clustered,cqat,pruned_clustered,pcqat,pcqat_palette", "--epochs", "2",
        "--min-steps", "0", "--seed", "0", "--sparsity", "0.5", "--clusters", "16", "--json"]
# the CLI, with the thresholds edgedeploy would set replaced by the ones given (Python's defaults: 700, 10, 10)
LAUNCH = ("import sys; import edgedeploy.keras.tfenv as t; t.GC_THRESHOLD = tuple(map(int, sys.argv.pop(1).split(',')));"
          " from edgedeploy.cli import run; sys.argv[0] = 'edgedeploy'; run()")


def start(threshold: tuple[int, int, int], out: Path) -> tuple[subprocess.Popen, float]:
    env = {**os.environ, "TF_NUM_INTRAOP_THREADS": "1", "TF_NUM_INTEROP_THREADS": "1", "OMP_NUM_THREADS": "1"}
    with open(out.with_suffix(".log"), "w") as sink:
        proc = subprocess.Popen([sys.executable, "-c", LAUNCH, ",".join(map(str, threshold)), *ARGS, "-o", str(out)],
                                env=env, stdout=subprocess.DEVNULL, stderr=sink)
    return proc, time.perf_counter()


def finish(proc: subprocess.Popen, t0: float, out: Path) -> dict:
    _, status, usage = os.wait4(proc.pid, 0)  # this run's own processor time and peak memory
    wall = time.perf_counter() - t0
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode:
        sys.exit(f"optimize failed: {out.with_suffix('.log').read_text()[-2000:]}")
    return {"cpu": usage.ru_utime + usage.ru_stime, "wall": wall, "peak_mib": usage.ru_maxrss / 1024,
            "facts": facts(out)}


def facts(run_dir: Path) -> dict:
    """Each stage's metrics (timings left out) and output files' hashes, from the run's manifest."""
    from edgedeploy.core.manifest import Manifest

    return {rid: ({k: m.value for k, m in rec.metrics.items() if not k.endswith("seconds")},
                  {a.role: a.sha256 for a in rec.outputs if a.role != "log"})
            for rid, rec in Manifest.load(run_dir).records.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pairs", type=int, default=2, help="pairs of runs, the two settings of a pair side by side")
    args = ap.parse_args()
    from edgedeploy.keras.tfenv import GC_THRESHOLD

    settings = {"edgedeploy": GC_THRESHOLD, "python default": (700, 10, 10)}
    print("| run | thresholds | processor s | wall s | peak MiB |\n|---|---|---|---|---|")
    ratios, same = [], True
    with tempfile.TemporaryDirectory(prefix="bench-gc-") as tmp:
        for i in range(args.pairs):
            outs = {name: Path(tmp) / f"{i}-{name.replace(' ', '-')}" for name in settings}
            started = {name: start(threshold, outs[name]) for name, threshold in settings.items()}
            runs = {name: finish(*started[name], outs[name]) for name in settings}
            for name, r in runs.items():
                print(f"| {i + 1} | {name} {settings[name]} | {r['cpu']:.1f} | {r['wall']:.1f} | {r['peak_mib']:.0f} |")
            ratios.append(runs["edgedeploy"]["cpu"] / runs["python default"]["cpu"])
            same = same and runs["edgedeploy"]["facts"] == runs["python default"]["facts"]
    print(f"\nprocessor time, edgedeploy's thresholds / Python's, pair by pair: {', '.join(f'{x:.3f}' for x in ratios)}")
    print("same metrics and files: " + ("yes" if same else "NO"))


if __name__ == "__main__":
    main()
