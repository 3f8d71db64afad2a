"""The functional NPU model against TFLite's reference kernels: models x targets x --optimise, N evaluation inputs.

Compiles each model for each target with `edgedeploy compile`, then times `edgedeploy verify --count N --data D
--json` per leaf and target, and prints one row per (model, target, optimise): status, bit-exact cases, cases
within the documented FULLY_CONNECTED rounding difference, the largest output difference, operations, seconds.

Run: python bench/bench_npu_verify.py [--count 100] [--data ../shared/data] [--markdown] [--write-docs PAGE.md]
         [--model NAME=MODEL.tflite,DATA.npz ...] [--only-given] [--no-16x8 | --only-16x8] [--targets ethos-u55-128,ethos-u85-256]
         [--optimise Performance]
--model adds a model of your own (int8 .tflite, evaluation data as `verify --data` reads it); --only-given leaves
out the models of ../shared/data. bench/toycar_windows.py makes such data for MLPerf Tiny's anomaly-detection model.
With ../shared/data the 16x8 models are included too (--no-16x8 leaves them out): the MLPerf DS-CNN and Arm's
DS-CNN-S, float, converted here with int16 activations (the `ptq_16x8` leaf's converter, calibrated on the first
100 fine-tune rows of their data); --only-16x8 runs only those.

After the rows it prints the slowest `verify` of one leaf (the 60 s bound of docs/reference/npu-coverage.md) and the
coverage table, TFLite operator x target, from the same runs (`bench/npu_coverage.py`); --write-docs PAGE.md
writes that table into the page between its markers.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from npu_coverage import Coverage, write_section  # bench/, beside this script

REPO = Path(__file__).resolve().parents[1]
BOUND_S = 60
BIN = Path(sys.executable).parent
MODELS = {
    "dscnn_mlperf": ("kws/dscnn_mlperf_int8.tflite", "kws/speech_commands_v2_test_mfcc_mlperf.npz"),
    "resnet8_mlperf": ("ic/resnet8_mlperf_int8.tflite", "ic/cifar10_jpeg_subset.npz"),
}
TARGETS = ["ethos-u55-32", "ethos-u55-64", "ethos-u55-128", "ethos-u55-256", "ethos-u65-256", "ethos-u65-512",
           "ethos-u85-128", "ethos-u85-256", "ethos-u85-512"]
OPTIMISE = ["Performance", "Size"]
MODELS_16X8 = {
    "dscnn_mlperf_16x8": ("kws/dscnn_mlperf_float.h5", "kws/speech_commands_v2_test_mfcc_mlperf.npz"),
    "ds_cnn_s_arm_16x8": ("kws/ds_cnn_s_arm_float.h5", "kws/speech_commands_v2_test_mfcc_arm.npz"),
}
CALIBRATION = 100


def convert_16x8(h5: Path, data: Path, out: Path) -> Path:
    """``h5`` as a 16x8 TFLite, calibrated on the first fine-tune rows of ``data``."""
    import numpy as np

    from edgedeploy.keras.model import load_model
    from edgedeploy.tflite.convert16 import convert_16x8 as convert

    with np.load(data) as npz:
        rows = npz["x"][np.flatnonzero(npz["split"] == 0)[:CALIBRATION]].astype(np.float32)
    model, _ = load_model(h5)
    out.write_bytes(convert(model, rows.reshape((rows.shape[0],) + tuple(model.input_shape[1:]))))
    return out


def edgedeploy(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(BIN / "edgedeploy"), *args], capture_output=True, text=True, check=False)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--count", type=int, default=100)
    ap.add_argument("--data", type=Path, default=REPO.parent / "shared" / "data")
    ap.add_argument("--markdown", action="store_true")
    ap.add_argument("--model", action="append", default=[], metavar="NAME=MODEL.tflite,DATA.npz",
                    help="a model of your own and its evaluation data (repeatable)")
    ap.add_argument("--only-given", action="store_true", help="only the --model models")
    ap.add_argument("--no-16x8", action="store_true", help="leave out the 16x8 models")
    ap.add_argument("--only-16x8", action="store_true", help="only the 16x8 models")
    ap.add_argument("--targets", default=",".join(TARGETS))
    ap.add_argument("--optimise", default=",".join(OPTIMISE), help="Vela's --optimise settings, comma-separated")
    ap.add_argument("--write-docs", type=Path, metavar="PAGE.md",
                    help="write the coverage table into PAGE.md between its markers")
    args = ap.parse_args()
    models = {} if args.only_given or args.only_16x8 else {k: (args.data / m, args.data / d) for k, (m, d) in MODELS.items()}
    for spec in args.model:
        name, _, paths = spec.partition("=")
        model, _, data = paths.partition(",")
        if not (name and model and data):
            sys.exit(f"--model {spec}: give NAME=MODEL.tflite,DATA.npz")
        models[name] = (Path(model), Path(data))
    targets = args.targets.split(",")
    rows = []
    cover = Coverage()
    with tempfile.TemporaryDirectory() as tmp:
        if args.only_16x8 or not (args.only_given or args.no_16x8):
            for name, (h5, data) in MODELS_16X8.items():
                models[name] = (convert_16x8(args.data / h5, args.data / data, Path(tmp) / f"{name}.tflite"),
                                args.data / data)
        for optimise in args.optimise.split(","):
            run = Path(tmp) / optimise
            compile_args = [str(m) for m, _ in models.values()]
            for t in targets:
                compile_args += ["-t", t]
            done = edgedeploy("-q", "compile", *compile_args, "-o", str(run), "--optimise", optimise)
            if done.returncode:
                sys.exit(f"compile failed: {done.stderr}")
            imported = json.loads((run / "manifest.json").read_text())["stages"]
            leaves = {Path(r["inputs"][0]["path"]).resolve(): r["id"].split("/", 1)[1]
                      for r in imported if r["id"].startswith("import/")}
            for model, data in models.values():
                leaf = leaves[model.resolve()]  # the variant `compile` named the model
                for t in targets:
                    t0 = time.perf_counter()
                    res = edgedeploy("verify", str(run), "--leaf", leaf, "-t", t, "--data", str(data),
                                     "--count", str(args.count), "--json")
                    seconds = time.perf_counter() - t0
                    if res.returncode not in (0, 11, 12):
                        sys.exit(f"verify failed ({res.returncode}): {res.stderr}")
                    doc = json.loads(res.stdout) if res.returncode == 0 else \
                        {"status": "not-modelled" if res.returncode == 11 else "mismatch"}
                    rows.append((leaf, t, optimise, doc, seconds, res.stderr.strip()))
                    if optimise == args.optimise.split(",")[0]:
                        cover.add(leaf, t, model, run, doc)
    if args.markdown:
        print("| model | target | --optimise | status | bit-exact | documented difference | largest output "
              "difference | NPU operations | seconds |")
        print("|---|---|---|---|---:|---:|---:|---|---:|")
    for leaf, t, optimise, doc, seconds, err in rows:
        ops = ", ".join(f"{v} {k}" for k, v in sorted(doc.get("operations", {}).items()))
        cells = [leaf, t, optimise, doc["status"], str(doc.get("exact_cases", "-")),
                 str(doc.get("documented_cases", "-")), str(doc.get("max_abs_diff", "-")), ops, f"{seconds:.1f}"]
        print("| " + " | ".join(cells) + " |" if args.markdown else "  ".join(cells) + (f"  {err}" if err else ""))
    if rows:
        leaf, t, optimise, _, seconds, _ = max(rows, key=lambda r: r[4])
        print(f"\nslowest `edgedeploy verify` of one leaf on {args.count} inputs: {seconds:.1f} s ({leaf} on {t}, "
              f"--optimise {optimise}), {'under' if seconds < BOUND_S else 'OVER'} the {BOUND_S} s bound on this "
              f"{os.cpu_count()}-core machine")
    table = cover.markdown(targets)
    print("\n" + table)
    if args.write_docs:
        write_section(args.write_docs, table)


if __name__ == "__main__":
    main()
