"""Wall time of one `edgedeploy compile` of one model for one target against bare `vela`.

Whole-process runs, interleaved (edgedeploy, vela, edgedeploy, vela, ...) so that load from other
processes on the machine hits both alike; each run writes into a fresh folder. Prints the medians,
the ratio (goal <= 1.2) and the start-up of `edgedeploy --help` (which must not import TensorFlow).

Both run with Python's bytecode cache on, as an installed package runs (a warm-up run of each writes
it; PYTHONDONTWRITEBYTECODE is removed from their environment). `--no-bytecode` keeps it off instead,
which makes every edgedeploy run compile its own modules from source (Vela's come precompiled).

Run: python bench/bench_startup.py [--repeat 7] [--model examples/kws/dscnn_mlperf_int8.tflite]
                                   [--target ethos-u55-128] [--no-bytecode] [--markdown]
With --markdown it prints the results page docs/results/startup.md.
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
GOAL = 1.2


def timed(cmd: list[str], env: dict[str, str]) -> tuple[float, float]:
    """Wall seconds, and CPU seconds (user + system) of the command and every process it waited for."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def bare_vela(model: Path, target: str, out: Path) -> list[str]:
    """The Vela command edgedeploy runs for this target, as a user would type it."""
    from edgedeploy.config.targets import get_target

    t = get_target(target)
    return [str(BIN / "vela"), str(model), "--accelerator-config", t.accelerator_config, "--config",
            str(t.vela_ini_path()), "--system-config", t.vela.system_config, "--memory-mode", t.vela.memory_mode,
            "--output-dir", str(out), "--verbose-performance", "--show-cpu-operations"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=7, help="runs of each command (default 7)")
    ap.add_argument("--model", type=Path, default=REPO / "examples" / "kws" / "dscnn_mlperf_int8.tflite")
    ap.add_argument("--target", default="ethos-u55-128")
    ap.add_argument("--markdown", action="store_true", help="print a Markdown table")
    ap.add_argument("--no-bytecode", action="store_true", help="run with PYTHONDONTWRITEBYTECODE=1")
    args = ap.parse_args()
    sys.path.insert(0, str(REPO / "src"))
    if args.markdown:
        from markdown_page import header

        print(header("Results: start-up of one compile"))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO / "src"), os.environ.get("PYTHONPATH", "")])}
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    if args.no_bytecode:
        env["PYTHONDONTWRITEBYTECODE"] = "1"
    edgedeploy = [str(BIN / "edgedeploy")] if (BIN / "edgedeploy").exists() else [sys.executable, "-m", "edgedeploy"]
    work = Path(tempfile.mkdtemp(prefix="edgedeploy-startup-"))
    try:
        timed(bare_vela(args.model, args.target, work / "warm"), env)  # warm the file cache once
        timed([*edgedeploy, "compile", str(args.model), "-t", args.target, "-o", str(work / "warm-ours")], env)
        ours, bare, helps = [], [], []
        for i in range(args.repeat):
            ours.append(timed([*edgedeploy, "compile", str(args.model), "-t", args.target, "-o", str(work / f"o{i}")],
                              env))
            bare.append(timed(bare_vela(args.model, args.target, work / f"b{i}"), env))
            helps.append(timed([*edgedeploy, "--help"], env))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    cpu_o, cpu_b, cpu_h = (statistics.median(c for _, c in runs) for runs in (ours, bare, helps))
    ours, bare, helps = ([w for w, _ in runs] for runs in (ours, bare, helps))
    o, b, h = statistics.median(ours), statistics.median(bare), statistics.median(helps)
    model = args.model.resolve().relative_to(REPO) if args.model.resolve().is_relative_to(REPO) else args.model
    if not args.markdown:
        print(f"edgedeploy compile  median {o:.3f} s  (runs: {', '.join(f'{x:.3f}' for x in ours)})")
        print(f"bare vela           median {b:.3f} s  (runs: {', '.join(f'{x:.3f}' for x in bare)})")
        print(f"edgedeploy --help   median {h:.3f} s")
        print(f"CPU seconds (median): edgedeploy compile {cpu_o:.3f}, bare vela {cpu_b:.3f}, --help {cpu_h:.3f}")
        print(f"ratio {o / b:.2f}  (goal <= {GOAL}); load average {os.getloadavg()[0]:.1f} at the end")
        return
    print(f"Whole-process wall times, median of {args.repeat} interleaved runs of each command, each compile "
          f"into a fresh folder; Python's bytecode cache {'off' if args.no_bytecode else 'on'}.\n")
    print("| command | median (s) | min (s) | max (s) | CPU, median (s) |\n|---|---|---|---|---|")
    print(f"| `edgedeploy compile {model} -t {args.target}` | {o:.3f} | {min(ours):.3f} | {max(ours):.3f} "
          f"| {cpu_o:.3f} |")
    print(f"| bare `vela`, same model and target settings | {b:.3f} | {min(bare):.3f} | {max(bare):.3f} "
          f"| {cpu_b:.3f} |")
    print(f"| `edgedeploy --help` | {h:.3f} | {min(helps):.3f} | {max(helps):.3f} | {cpu_h:.3f} |")
    print(f"\nedgedeploy / bare vela: **{o / b:.2f}** in wall time (goal ≤ {GOAL}), {cpu_o / cpu_b:.2f} in CPU time; "
          f"load average {os.getloadavg()[0]:.2f} at the end. CPU time is user + system of the command and the "
          "processes it waited for (edgedeploy's Vela workers included).")

if __name__ == "__main__":
    main()
