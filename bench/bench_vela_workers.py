"""Wall time of compiles in turn in one process that has TensorFlow loaded (a compile after `optimize`, the Python
API in a notebook), where Vela's workers cannot be forked from the process itself.

Each compile goes into a fresh run folder, for another target each time, with a compile cache made for this run
(nothing is reused); the first starts Vela's worker processes from nothing, the later ones show what starting them
costs once a process has compiled. Prints each compile's wall seconds (`/usr/bin/time` around it gives the processor time of
the whole, its worker processes included once they have ended with it).

Run: python bench/bench_vela_workers.py [--model examples/kws/dscnn_mlperf_int8.tflite]
                                         [--targets ethos-u55-128,ethos-u55-256,ethos-u65-256,ethos-u85-256]
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", type=Path, default=REPO / "examples" / "kws" / "dscnn_mlperf_int8.tflite")
    ap.add_argument("--targets", default="ethos-u55-128,ethos-u55-256,ethos-u65-256,ethos-u85-256")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-vela-workers-") as tmp:
        os.environ["XDG_CACHE_HOME"] = str(Path(tmp) / "cache")
        from edgedeploy.keras import tfenv
        from edgedeploy.pipeline.compile import CompileOptions, compile_tflite

        tfenv.load()
        for i, target in enumerate(args.targets.split(",")):
            t0 = time.perf_counter()
            compile_tflite([args.model], [target], Path(tmp) / f"run{i}", CompileOptions(jobs=1))
            print(f"compile {i + 1} ({target}): {time.perf_counter() - t0:.2f} s wall")


if __name__ == "__main__":
    main()
