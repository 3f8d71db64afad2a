"""LiteRT's interpreter against TensorFlow's ``tf.lite.Interpreter``: the same outputs, kernel set by kernel set.

Runs N real evaluation inputs through both interpreters with the reference kernels (BUILTIN_REF) and with the
default kernels (AUTO, XNNPACK where it applies), and prints one row per model and kernel set: the cases whose
outputs are byte-identical between the two interpreters, and, for scale, the cases where the reference and the
default kernels of the same interpreter differ. Models: the bundled int8 DS-CNN, the bundled float DS-CNN
converted here with int16 activations (the ``ptq_16x8`` leaf's converter, calibrated on the first 100 fine-tune
rows), and with ../shared/data the MLPerf ResNet-8.

Run: python bench/bench_interpreter.py [--count 200] [--data ../shared/data] [--markdown]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import warnings
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "src"))
KWS = REPO / "examples/kws_tree/speech_commands_subset.npz"


def kws_inputs(n: int, split: int) -> np.ndarray:
    with np.load(KWS) as npz:
        return npz["x"][np.flatnonzero(npz["split"] == split)[:n]].astype(np.float32)


def models(data: Path, tmp: Path, n: int) -> dict[str, tuple[Path, np.ndarray]]:
    from edgedeploy.keras.model import load_model
    from edgedeploy.tflite.convert16 import convert_16x8

    found = {"dscnn_mlperf_int8": (REPO / "examples/kws/dscnn_mlperf_int8.tflite", kws_inputs(n, 1))}
    path16 = tmp / "dscnn_mlperf_16x8.tflite"
    path16.write_bytes(convert_16x8(load_model(REPO / "examples/kws_tree/dscnn_mlperf_float.h5")[0], kws_inputs(100, 0)))
    found["dscnn_mlperf_16x8"] = (path16, kws_inputs(n, 1))
    resnet = data / "ic/resnet8_mlperf_int8.tflite"
    if resnet.is_file():
        with np.load(data / "ic/cifar10_jpeg_subset.npz") as npz:
            found["resnet8_mlperf_int8"] = (resnet, npz["x_test"][:n].astype(np.float32))
    return found


def outputs(interp, x: np.ndarray) -> np.ndarray:
    from edgedeploy.tflite.interpreter import allocate

    allocate(interp)
    i, o = interp.get_input_details()[0], interp.get_output_details()[0]
    out = []
    for c in range(len(x)):
        typed = x[c : c + 1] if i["dtype"] == np.float32 else quantize(x[c : c + 1], i)
        interp.set_tensor(i["index"], typed)
        interp.invoke()
        out.append(interp.get_tensor(o["index"]).copy())
    return np.concatenate(out)


def quantize(x: np.ndarray, detail) -> np.ndarray:
    scale, zero = detail["quantization"]
    info = np.iinfo(detail["dtype"])
    return np.clip(np.round(x / scale + zero), info.min, info.max).astype(detail["dtype"])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--count", type=int, default=200)
    ap.add_argument("--data", type=Path, default=REPO.parent / "shared" / "data")
    ap.add_argument("--markdown", action="store_true")
    args = ap.parse_args()

    from edgedeploy.keras import tfenv
    from edgedeploy.tflite.interpreter import make_interpreter, version

    tf = tfenv.load().tf
    kinds = {"reference (BUILTIN_REF)": True, "default (AUTO)": False}
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for name, (path, x) in models(args.data, Path(tmp), args.count).items():
            got = {}
            for kind, reference in kinds.items():
                resolver = tf.lite.experimental.OpResolverType.BUILTIN_REF if reference else tf.lite.experimental.OpResolverType.AUTO
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")  # tf.lite.Interpreter's deprecation notice: it is the baseline here
                    theirs = tf.lite.Interpreter(model_path=str(path), experimental_op_resolver_type=resolver)
                ours = make_interpreter(path, reference=reference, allocate_now=False)
                a, b = outputs(theirs, x), outputs(ours, x)
                got[kind] = b
                same = int(sum(a[c].tobytes() == b[c].tobytes() for c in range(len(x))))
                rows.append([name, str(b.dtype), kind, f"{same} / {len(x)} identical to tf.lite.Interpreter"])
            ref, default = got.values()
            differ = int(np.count_nonzero((ref != default).reshape(len(x), -1).any(axis=1)))
            rows.append([name, str(ref.dtype), "reference vs default, LiteRT alone", f"{differ} / {len(x)} differ"])
    head = ["model", "output", "kernels", "cases (bytes of the output)"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)] + ["| " + " | ".join(r) + " |" for r in rows]
    if args.markdown:
        print(f"Written by `python bench/bench_interpreter.py --count {args.count} --markdown` (ai-edge-litert "
              f"{version()}, TensorFlow {tf.__version__}).\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
