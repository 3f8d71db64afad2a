"""The default test run's wall time against the processor time of the example's tree alone, on this machine.

The gauge of `docs/development.md`: the README's test command is timed (wall, and its processor time) beside
the bundled example's deployment tree trained alone on one TensorFlow thread, whose processor time stands for
the machine's speed at that hour (a shared machine's speed moves, so read a run's length only beside it):

    edgedeploy optimize examples/kws_tree/dscnn_mlperf_float.h5 --data examples/kws_tree/speech_commands_subset.npz
        --leaves ptq,qat,pruned,pqat,clustered,cqat,pruned_clustered,pcqat,pcqat_palette --epochs 2 --min-steps 0
        --seed 0 --sparsity 0.5 --clusters 16

The tree runs in a fresh run folder with TF_NUM_INTRAOP_THREADS, TF_NUM_INTEROP_THREADS and OMP_NUM_THREADS set
to 1; its processor time is its process tree's user + system time (the children's resource usage). Then,
with `--tests`, the README's test command runs in the repository and the script prints both figures and the
ratio: the test run's wall seconds over the tree's processor seconds (the goal is at most 4).

Run: python bench/bench_test_run.py [--tests] [--repeat 3] [--markdown]
Without `--tests` only the tree is measured (a minute or three on one core). The gauge of docs/development.md takes
`--repeat 3`: a single run of the tree moves by a few percent from one run to the next, their median less.
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
GOAL = 4.0
TREE_ARGS = ["optimize", "examples/kws_tree/dscnn_mlperf_float.h5",
             "--data", "examples/kws_tree/speech_commands_subset.npz",
             "--leaves", "ptq,qat,pruned,pqat,clustered,cqat,pruned_clustered,pcqat,pcqat_palette",
             "--epochs", "2", "--min-steps", "0", "--seed", "0", "--sparsity", "0.5", "--clusters", "16"]
TEST_ARGS = ["-m", "pytest", "-m", "not slow", "-n", "2", "--dist", "loadfile"]  # the README's test command
ONE_THREAD = {"TF_NUM_INTRAOP_THREADS": "1", "TF_NUM_INTEROP_THREADS": "1", "OMP_NUM_THREADS": "1"}


def timed(cmd: list[str], env: dict[str, str]) -> tuple[float, float, int]:
    """Run ``cmd`` in the repository: (wall seconds, processor seconds of it and its children, exit code)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    proc = subprocess.run(cmd, cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    if proc.returncode != 0:
        sys.stderr.write(proc.stderr[-3000:])
    return wall, cpu, proc.returncode


def edgedeploy_bin() -> str:
    found = BIN / "edgedeploy"
    return str(found) if found.exists() else (shutil.which("edgedeploy") or "edgedeploy")


def tree(repeat: int) -> list[tuple[float, float]]:
    """The example's tree alone, ``repeat`` times, each in a fresh run folder: (wall, processor) seconds."""
    env = {**os.environ, **ONE_THREAD}
    runs = []
    for _ in range(repeat):
        with tempfile.TemporaryDirectory(prefix="bench-tree-") as tmp:
            wall, cpu, rc = timed([edgedeploy_bin(), *TREE_ARGS, "-o", str(Path(tmp) / "run")], env)
        if rc != 0:
            raise SystemExit(f"the example's tree failed (exit {rc})")
        runs.append((wall, cpu))
        print(f"tree: {wall:.1f} s wall, {cpu:.1f} s processor", file=sys.stderr)
    return runs


def tests() -> tuple[float, float, int]:
    """The README's test command once: (wall, processor seconds, exit code)."""
    env = dict(os.environ)
    wall, cpu, rc = timed([sys.executable, *TEST_ARGS], env)
    print(f"tests: {wall:.0f} s wall, {cpu:.0f} s processor, exit {rc}", file=sys.stderr)
    return wall, cpu, rc


def minutes(seconds: float) -> str:
    return f"{int(seconds // 60)}:{int(round(seconds % 60)):02d}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tests", action="store_true", help="also time the README's test command (long)")
    parser.add_argument("--repeat", type=int, default=1, help="runs of the tree (its median is the gauge)")
    parser.add_argument("--markdown", action="store_true", help="print a page head naming this command")
    args = parser.parse_args(argv)
    runs = tree(max(1, args.repeat))
    tree_cpu = sorted(cpu for _, cpu in runs)[len(runs) // 2]
    if args.markdown:
        sys.path.insert(0, str(Path(__file__).parent))
        from markdown_page import header

        print(header("Test run against the example's tree"))
    print("| measured | wall | processor time |")
    print("|---|---|---|")
    for wall, cpu in runs:
        print(f"| the example's tree alone, one TensorFlow thread | {wall:.1f} s | {cpu:.1f} s |")
    rc = 0
    if args.tests:
        wall, cpu, rc = tests()
        outcome = "passed" if rc == 0 else f"exit {rc}"
        print(f"| the README's test command ({outcome}) | {minutes(wall)} | {cpu:.0f} s |")
        ratio = wall / tree_cpu
        print(f"\nTest run wall time / tree processor time: {ratio:.2f} (goal at most {GOAL:g}).")
    return rc


if __name__ == "__main__":
    sys.exit(main())
