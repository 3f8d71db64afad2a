"""Wall time of one `edgedeploy compile` of one model for one target against bare `vela`.

Whole-process runs, interleaved (edgedeploy, vela, edgedeploy, vela, ...) so that load from other
processes on the machine hits both alike; each run writes into a fresh folder. Prints the medians,
the ratio (goal <= 1.2), the start-up of `edgedeploy --help` (which must not import TensorFlow),
`edgedeploy report RUN --json` of the compiled run (its compression table reads the .tflite files) and
of the recorded run in tests/data/report (manifests only).

`--tensorflow` also times edgedeploy's import of TensorFlow, tf_keras and TFMOT (`tfenv.load()`) in
fresh processes, as edgedeploy does it and with TFMOT's probe for Keras 2.13 left to import Keras 3
(`tfenv.keras3_probe_fails_fast` switched off), interleaved: the processor time of the call and
whether Keras 3 ended up imported.

Both run with Python's bytecode cache on, as an installed package runs (a warm-up run of each writes
it; PYTHONDONTWRITEBYTECODE is removed from their environment). `--no-bytecode` keeps it off instead,
which makes every edgedeploy run compile its own modules from source (Vela's come precompiled).

Run: python bench/bench_startup.py [--repeat 7] [--model examples/kws/dscnn_mlperf_int8.tflite]
                                   [--target ethos-u55-128] [--no-bytecode] [--tensorflow] [--markdown]
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
RECORDED_RUN = REPO / "tests" / "data" / "report" / "run_u55_u85"  # a real run's manifests (its SOURCE.md)
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


# edgedeploy's TensorFlow import in a fresh process: the processor time of tfenv.load() and whether Keras 3 was
# imported; argv[1] "off" switches TFMOT's fast-failing Keras 3 probe off
TF_LOAD = ("import contextlib, sys, time\nimport edgedeploy.keras.tfenv as t\n"
           "if sys.argv[1] == 'off':\n    t.keras3_probe_fails_fast = contextlib.nullcontext\n"
           "c = time.process_time(); t.load(); print(time.process_time() - c, 'keras' in sys.modules)")


def tf_load(probe: bool, env: dict[str, str]) -> tuple[float, bool]:
    out = subprocess.run([sys.executable, "-c", TF_LOAD, "on" if probe else "off"], check=True, capture_output=True,
                         text=True, env=env).stdout.split()
    return float(out[0]), out[1] == "True"


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
    ap.add_argument("--tensorflow", action="store_true",
                    help="also time tfenv.load() with and without TFMOT's fast-failing Keras 3 probe")
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
        ours, bare, helps, reports, recorded, loads = [], [], [], [], [], {True: [], False: []}
        for i in range(args.repeat):
            ours.append(timed([*edgedeploy, "compile", str(args.model), "-t", args.target, "-o", str(work / f"o{i}")],
                              env))
            bare.append(timed(bare_vela(args.model, args.target, work / f"b{i}"), env))
            helps.append(timed([*edgedeploy, "--help"], env))
            reports.append(timed([*edgedeploy, "report", str(work / "warm-ours"), "--json"], env))
            recorded.append(timed([*edgedeploy, "report", str(RECORDED_RUN), "--json"], env))
            if args.tensorflow:
                for probe in (True, False):
                    loads[probe].append(tf_load(probe, env))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    cpu_o, cpu_b, cpu_h, cpu_r, cpu_m = (statistics.median(c for _, c in runs)
                                         for runs in (ours, bare, helps, reports, recorded))
    ours, bare, helps, reports, recorded = ([w for w, _ in runs] for runs in (ours, bare, helps, reports, recorded))
    o, b, h = statistics.median(ours), statistics.median(bare), statistics.median(helps)
    r, m = statistics.median(reports), statistics.median(recorded)
    tf_rows = [(probe, statistics.median(c for c, _ in loads[probe]), min(c for c, _ in loads[probe]),
                max(c for c, _ in loads[probe]), sorted({k for _, k in loads[probe]})) for probe in (True, False)
               if loads[probe]]
    model = args.model.resolve().relative_to(REPO) if args.model.resolve().is_relative_to(REPO) else args.model
    if not args.markdown:
        print(f"edgedeploy compile  median {o:.3f} s  (runs: {', '.join(f'{x:.3f}' for x in ours)})")
        print(f"bare vela           median {b:.3f} s  (runs: {', '.join(f'{x:.3f}' for x in bare)})")
        print(f"edgedeploy --help   median {h:.3f} s")
        print(f"edgedeploy report   median {r:.3f} s (compiled run), {m:.3f} s (recorded run)")
        print(f"CPU seconds (median): edgedeploy compile {cpu_o:.3f}, bare vela {cpu_b:.3f}, --help {cpu_h:.3f}, "
              f"report {cpu_r:.3f} (compiled run), {cpu_m:.3f} (recorded run)")
        for probe, med, lo, hi, keras3 in tf_rows:
            print(f"tfenv.load(), Keras 3 probe {'failing fast' if probe else 'left alone'}: CPU median {med:.2f} s "
                  f"(min {lo:.2f}, max {hi:.2f}); Keras 3 imported: {keras3}")
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
    print(f"| `edgedeploy report RUN --json`, the compiled run | {r:.3f} | {min(reports):.3f} | {max(reports):.3f} "
          f"| {cpu_r:.3f} |")
    print(f"| `edgedeploy report {RECORDED_RUN.relative_to(REPO)} --json` (manifests only) | {m:.3f} "
          f"| {min(recorded):.3f} | {max(recorded):.3f} | {cpu_m:.3f} |")
    print(f"\nedgedeploy / bare vela: **{o / b:.2f}** in wall time (goal ≤ {GOAL}), {cpu_o / cpu_b:.2f} in CPU time; "
          f"load average {os.getloadavg()[0]:.2f} at the end. CPU time is user + system of the command and the "
          "processes it waited for (edgedeploy's Vela workers included).")
    if tf_rows:
        print(f"\nImporting TensorFlow, tf_keras and TFMOT (`tfenv.load()`) in a fresh process, {args.repeat} runs of "
              "each, interleaved: processor time of the call.\n")
        print("| TFMOT's probe for Keras 2.13 | CPU median (s) | min (s) | max (s) | Keras 3 imported |\n"
              "|---|---|---|---|---|")
        for probe, med, lo, hi, keras3 in tf_rows:
            print(f"| {'fails at once (edgedeploy)' if probe else 'left alone (imports Keras 3)'} | {med:.2f} | "
                  f"{lo:.2f} | {hi:.2f} | {', '.join(map(str, keras3)).lower()} |")

if __name__ == "__main__":
    main()
