"""Wall time of `edgedeploy compile` against bare `vela` on real models.

Prints three figures:
  1. one model on one target: edgedeploy / bare vela (median of N runs each)
  2. 3 models x 4 targets with --jobs 2: edgedeploy / sum of 12 sequential bare vela runs
  3. an unchanged re-run of (2): seconds

Run: python bench/bench_compile.py [--repeat N] [--data ../shared/data] [--markdown]
With --markdown it prints the results page docs/results/compile.md (a table, and the command that made it).
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
MODELS = ["kws/dscnn_mlperf_int8.tflite", "ic/resnet8_mlperf_int8.tflite", "kws/ds_cnn_s_arm_int8.tflite"]
TARGETS = ["ethos-u55-128", "ethos-u55-64", "ethos-u65-256", "ethos-u85-256"]
BIN = Path(sys.executable).parent


# Both commands run with Python's bytecode cache on, as installed packages run (Vela's is precompiled; without
# it every edgedeploy run would compile its own modules from source).
ENV = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}


def timed(cmd: list[str]) -> float:
    t0 = time.perf_counter()
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=ENV)
    return time.perf_counter() - t0


def bare_vela(model: Path, target: str, out: Path) -> list[str]:
    sys.path.insert(0, str(REPO / "src"))
    from edgedeploy.config.targets import get_target

    t = get_target(target)
    return [str(BIN / "vela"), str(model), "--accelerator-config", t.accelerator_config, "--config",
            str(t.vela_ini_path()), "--system-config", t.vela.system_config, "--memory-mode", t.vela.memory_mode,
            "--output-dir", str(out), "--verbose-performance", "--show-cpu-operations"]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--data", type=Path, default=REPO.parent / "shared" / "data")
    ap.add_argument("--markdown", action="store_true", help="print a Markdown results page (docs/results/)")
    args = ap.parse_args()
    if args.markdown:
        from markdown_page import header

        print(header("Results: compile speed"))
    edgedeploy = str(BIN / "edgedeploy")
    work = Path(tempfile.mkdtemp(prefix="edgedeploy-bench-"))
    models = [args.data / m for m in MODELS]
    try:
        # warm the file cache (and edgedeploy's bytecode cache) once
        timed(bare_vela(models[0], TARGETS[0], work / "warm"))
        timed([edgedeploy, "compile", str(models[0]), "-t", TARGETS[0], "-o", str(work / "warm-ours")])
        ours, bare = [], []
        for i in range(args.repeat):
            ours.append(timed([edgedeploy, "compile", str(models[0]), "-t", TARGETS[0], "-o", str(work / f"one{i}"), "--json"]))
            bare.append(timed(bare_vela(models[0], TARGETS[0], work / f"bare{i}")))
        o, b = statistics.median(ours), statistics.median(bare)
        if not args.markdown:
            print(f"1 model x 1 target   edgedeploy {o:.3f} s  bare vela {b:.3f} s  ratio {o / b:.2f}  (goal <= 1.05)")

        seq = sum(timed(bare_vela(m, t, work / f"seq-{m.stem}-{t}")) for m in models for t in TARGETS)
        cmd = [edgedeploy, "compile", *map(str, models), "--jobs", "2", "--allow-cpu-ops", "-o", str(work / "sweep"), "--json"]
        for t in TARGETS:
            cmd += ["-t", t]
        sweep = timed(cmd)
        rerun = statistics.median(timed(cmd) for _ in range(args.repeat))
        if args.markdown:
            print(f"Whole-process wall times: `edgedeploy compile` against bare `vela` with the same target settings, "
                  f"median of {args.repeat} runs each (one run for the sweep and its bare sum), Python's bytecode "
                  "cache on. One compile's start-up in detail: [start-up](startup.md).\n")
            print("| case | edgedeploy (s) | bare `vela` (s) | ratio |\n|---|---|---|---|")
            print(f"| {Path(MODELS[0]).stem} on `{TARGETS[0]}` | {o:.3f} | {b:.3f} | {o / b:.2f} |")
            print(f"| {len(models)} models × {len(TARGETS)} targets, `--jobs 2` | {sweep:.3f} | {seq:.3f} "
                  f"(sum of {len(models) * len(TARGETS)} runs) | {sweep / seq:.2f} |")
            print(f"| the same, unchanged re-run | {rerun:.3f} | | |")
            print(f"\nModels: {', '.join(f'`{m}`' for m in MODELS)} from `{os.path.relpath(args.data, REPO)}`; "
                  f"targets: {', '.join(f'`{t}`' for t in TARGETS)}.")
        else:
            print(f"3 models x 4 targets edgedeploy --jobs 2 {sweep:.3f} s  sum of 12 bare vela runs {seq:.3f} s  "
                  f"ratio {sweep / seq:.2f}  (goal <= 0.30)")
            print(f"unchanged re-run     {rerun:.3f} s  (goal < 1 s)")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
