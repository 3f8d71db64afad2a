"""Helpers the test modules share (importable as ``helpers``: pyproject's ``pythonpath`` puts tests/ on the path)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

EDGEDEPLOY = [sys.executable, "-m", "edgedeploy"]
# A run folder written by `edgedeploy compile` with Vela 5.2.0 (tests/data/report/run_u55_u85/SOURCE.md): the MLPerf
# DS-CNN and ResNet-8 int8 models on corstone-300-u55-128 and ethos-u85-256.
RECORDED_RUN = Path(__file__).resolve().parent / "data" / "report" / "run_u55_u85"
CLI_ENV = {"NO_COLOR": "1", "COLUMNS": "200"}  # what a command started by a test sees: no colour, 200 columns


# The leaves of the run's shared trained tree (the `trained_tree` fixture of tests/integration/conftest.py, which says
# which test reads each); here, where a test module can read it when its cases are made
TREE_LEAVES = ("ptq", "clustered", "pruned", "pruned_clustered", "pcqat")


# Whether this run draws each Hypothesis property's full count of examples (tests/unit/conftest.py sets it from -m)
FULL_PROPERTIES = True


def examples(n: int) -> int:
    """How many examples a property draws: its full count ``n`` in a run that includes the ``slow`` tests (a plain
    ``pytest``), half of it, and never fewer than 15, in a run that leaves them out (the README's ``-m "not slow"``)."""
    return n if FULL_PROPERTIES else max(15, n // 2)


def run_cli(*args, cwd: Path | str | None = None, env: dict[str, str] | None = None,
            timeout: float | None = 900) -> subprocess.CompletedProcess:
    """``edgedeploy ARGS`` in a new process, as a user runs it: no colour, 200 columns, text output captured.

    ``env`` adds to (or overrides) this process's environment."""
    return subprocess.run([*EDGEDEPLOY, *map(str, args)], capture_output=True, text=True, cwd=cwd, timeout=timeout,
                          env={**os.environ, **CLI_ENV, **(env or {})})


# `edgedeploy ARGS` as the console script runs it, then the watched modules it loaded, on a last line of their own
_LOADED = ("import sys\nfrom edgedeploy.cli import main\ncode = 0\n"
           "watch = sys.argv.pop(1).split(',')\nsys.argv[0] = 'edgedeploy'\n"
           "try:\n    main()\nexcept SystemExit as end:\n    code = end.code\n"
           "print('\\n' + ','.join(w for w in watch if any(m == w or m.startswith(w + '.') for m in sys.modules)))\n"
           "sys.exit(code)")


def run_cli_loading(*args, watch: tuple[str, ...]) -> tuple[subprocess.CompletedProcess, list[str]]:
    """``edgedeploy ARGS`` in a new process (:func:`run_cli`), and which of the modules or packages in ``watch``
    it had loaded when the command ended (a package counts when any of its modules was)."""
    proc = subprocess.run([sys.executable, "-c", _LOADED, ",".join(watch), *map(str, args)], capture_output=True,
                          text=True, timeout=900, env={**os.environ, **CLI_ENV})
    out, _, last = proc.stdout.rpartition("\n\n")
    proc.stdout = out + "\n" if out else ""
    return proc, [m for m in last.strip().split(",") if m]


def pytest_argv(*args: str) -> list[str]:
    """``pytest ARGS`` in a new process, as a user runs the HIL tests: with edgedeploy's plugin (named with ``-p``
    in a source checkout that was not installed), without the cache and without Hypothesis' plugin, which this
    environment has for its own tests and which would spend a second importing Hypothesis at the end."""
    from importlib.metadata import entry_points

    argv = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-p", "no:hypothesispytest", *args]
    if not any(ep.value == "edgedeploy.hil.testing" for ep in entry_points(group="pytest11")):
        argv[3:3] = ["-p", "edgedeploy.hil.testing"]  # a source checkout that was not installed
    return argv


def ran_in_a_fresh_interpreter(request, tmp_path: Path) -> bool:
    """Run the calling test again in a new interpreter when this one has loaded TensorFlow, and say whether it did.

    A test that forks (the warm Vela worker is forked as the command line starts, before anything loads
    TensorFlow) cannot run in a process whose TensorFlow threads a fork does not survive; another file run earlier
    in the same test worker leaves them behind. The test then runs as the command line would: in a fresh process.
    """
    if "tensorflow" not in sys.modules:
        return False
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:xdist",
                           request.node.nodeid, "--basetemp", str(tmp_path / "fresh")],
                          capture_output=True, text=True, timeout=300, cwd=request.config.rootpath)
    assert proc.returncode == 0 and "1 passed" in proc.stdout, proc.stdout[-3000:] + proc.stderr[-3000:]
    return True


def write_int8_tflite(model, path: Path, seed: int = 0, samples: int = 30) -> Path:
    """``model`` (tf_keras) converted to a full-int8 TFLite file at ``path`` (int8 input and output), calibrated on
    ``samples`` seeded normal samples of its input shape, as a user's post-training quantization writes it."""
    import numpy as np

    from edgedeploy.keras import tfenv
    from edgedeploy.tflite.convert import function_converter

    tf = tfenv.load().tf
    shape = tuple(int(d) for d in model.inputs[0].shape[1:])
    rng = np.random.default_rng(seed)
    conv = function_converter(model)
    conv.optimizations = [tf.lite.Optimize.DEFAULT]
    conv.representative_dataset = lambda: ([rng.normal(size=(1, *shape)).astype(np.float32)] for _ in range(samples))
    conv.target_spec.supported_ops = [tf.lite.OpsSet.TFLITE_BUILTINS_INT8]
    conv.inference_input_type = conv.inference_output_type = tf.int8
    path.write_bytes(conv.convert())
    return path


def balanced_part(src: Path, dest: Path, counts: dict[int, int], stratified) -> Path:
    """A seeded, class-balanced part of the data file ``src`` at ``dest``: ``counts[s]`` rows of split ``s``
    (chosen by ``stratified``, the fixture of that name), in file order, each per-sample key cut alike and the
    others (labels) kept whole."""
    import numpy as np

    with np.load(src) as d:
        arrays = {k: d[k] for k in d.files}
    split = arrays["split"]
    rows = np.sort(np.concatenate([stratified(np.flatnonzero(split == s), arrays["y"], n, seed=0)
                                   for s, n in counts.items()]))
    np.savez(dest, **{k: (a[rows] if len(a) == len(split) else a) for k, a in arrays.items()})
    return dest


def infer(model, x):
    """A Keras model's outputs for the batch ``x`` (an array, or a list of them for several outputs): what
    ``model.predict`` gives, computed eagerly in inference mode without tracing a function for the model."""
    import numpy as np

    out = model(x, training=False)
    return [np.asarray(o) for o in out] if isinstance(out, (list, tuple)) else np.asarray(out)


PAYLOAD32 = 0x4000  # a command-stream code with this bit takes a 32-bit payload in the next word


def set_registers(words, settings) -> list[int]:
    """An NPU command stream's ``words`` with the first setting of each register in ``settings`` (``(code, value)``:
    a 16-bit command's code, or PAYLOAD32 | a 32-bit command's code) given the value."""
    words = list(words)
    for code, value in settings:
        i = next(i for i, w in enumerate(words) if w & 0xFFFF == code)
        if code & PAYLOAD32:
            words[i + 1] = value
        else:
            words[i] = code | (value << 16)
    return words


def int8_kernels(model_path: Path) -> list:
    """An int8 ``.tflite``'s CONV_2D, DEPTHWISE_CONV_2D and FULLY_CONNECTED weights in operator order, as OHWI
    (depthwise: C, H, W, 1; fully connected: O, 1, 1, I), read with the flatbuffer classes Vela ships."""
    import numpy as np
    from ethosu.vela.tflite.Model import Model

    conv_2d, depthwise_conv_2d, fully_connected = 3, 4, 9  # TFLite's builtin operator codes
    model = Model.GetRootAsModel(Path(model_path).read_bytes(), 0)
    graph = model.Subgraphs(0)
    out = []
    for i in range(graph.OperatorsLength()):
        op = graph.Operators(i)
        code = model.OperatorCodes(op.OpcodeIndex())
        kind = max(code.BuiltinCode(), code.DeprecatedBuiltinCode())
        if kind in (conv_2d, depthwise_conv_2d, fully_connected):
            t = graph.Tensors(op.Inputs(1))
            w = np.frombuffer(model.Buffers(t.Buffer()).DataAsNumpy().tobytes(), np.int8).reshape(t.ShapeAsNumpy())
            if kind == depthwise_conv_2d:
                w = w.transpose(3, 1, 2, 0)
            out.append(w.reshape(w.shape[0], 1, 1, -1) if kind == fully_connected else w)
    return out


def one_error_line(proc: subprocess.CompletedProcess) -> str:
    """The single ``error:`` line of a failed command's stderr (fails when there is none, several, or a traceback)."""
    lines = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    return lines[0]


def invoke_cli(*args):
    """``edgedeploy ARGS`` in this process (typer's test runner): a ``click.testing.Result``, stdout and stderr apart."""
    from typer.testing import CliRunner

    from edgedeploy.cli.app import app

    return CliRunner().invoke(app, [str(a) for a in args])


def run_in_process(*args, cwd: Path | str | None = None, env: dict[str, str] | None = None
                   ) -> subprocess.CompletedProcess:
    """``edgedeploy ARGS`` in this process (:func:`invoke_cli`), answered as :func:`run_cli` answers: for a test
    whose check is the command's outcome (exit code, error line, JSON on stdout, files) and whose process would
    spend much of its time importing TensorFlow, which this process has loaded already. ``cwd`` and ``env`` hold
    while it runs. Then it does what the end of the command's process does: the run folders it locked are let go,
    and their scratch folders removed where they are empty."""
    from edgedeploy.core.files import release_run_dirs

    with pytest.MonkeyPatch.context() as mp:
        for key, value in (env or {}).items():
            mp.setenv(key, value)
        if cwd is not None:
            mp.chdir(cwd)
        try:
            result = invoke_cli(*args)
        finally:
            release_run_dirs()
    return subprocess.CompletedProcess(["edgedeploy", *map(str, args)], result.exit_code, result.stdout,
                                       result.stderr)


def report_row(doc: dict, leaf: str, target: str) -> dict:
    """The row of ``leaf`` on ``target`` in a report document."""
    return next(r for r in doc["rows"] if r["leaf"] == leaf and r["target"] == target)


def input_models():
    """``tests/data/models/make_models.py`` as a module: where the committed input models are (``HERE``) and the
    seeded builders of the data they were trained on."""
    import importlib.util

    path = Path(__file__).resolve().parent / "data" / "models" / "make_models.py"
    spec = importlib.util.spec_from_file_location("make_models", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# A stand-in device model for the HIL tests: IN_BYTES int8 in, OUT_BYTES int8 out.
HIL_IN_BYTES, HIL_OUT_BYTES = 6, 5


def fake_model(data: bytes) -> bytes:
    """The stand-in model's output bytes for the input bytes ``data``."""
    return bytes((sum(data) + 7 * j) & 0xFF for j in range(HIL_OUT_BYTES))


def tiny_hil_bundle(path: Path, sha: str, reference: str) -> Path:
    """A bundle of 3 golden cases whose outputs are the stand-in model's, recording the model hash ``sha`` (the
    one the device announces) and ``reference`` as what computed the golden outputs."""
    import json

    import numpy as np

    from edgedeploy.core.files import sha256_bytes
    from edgedeploy.export import npz_bytes

    path.mkdir(parents=True)
    inputs = np.random.default_rng(5).integers(-128, 128, size=(3, HIL_IN_BYTES), dtype=np.int8)
    outputs = np.stack([np.frombuffer(fake_model(x.tobytes()), np.int8) for x in inputs])
    npz = npz_bytes({"input_0": inputs, "output_0": outputs, "argmax": outputs.argmax(1).astype(np.int32),
                     "label": np.full(3, -1, np.int32), "row": np.arange(3, dtype=np.int64)})  # fmt: skip
    (path / "golden.npz").write_bytes(npz)
    files = {"golden.npz": {"sha256": sha256_bytes(npz), "bytes": len(npz)}}
    files.update({f"tiny.{e}": {"sha256": "0" * 64, "bytes": 0} for e in ("c", "h")})
    manifest = {
        "schema": "edgedeploy.firmware", "name": "tiny",
        "model": {"c_source": "tiny.c", "c_header": "tiny.h", "section": ".rodata.nn_model", "sha256": sha},
        "inputs": [{"name": "in", "shape": [1, HIL_IN_BYTES], "dtype": "int8", "scale": [0.5], "zero_point": [0]}],
        "outputs": [{"name": "out", "shape": [1, HIL_OUT_BYTES], "dtype": "int8", "scale": [0.25],
                     "zero_point": [0]}],
        "golden": {"count": 3, "npz": "golden.npz", "reference": {"description": reference}},
        "files": files,
    }  # fmt: skip
    (path / "manifest.json").write_text(json.dumps(manifest))
    return path


# One interpreter runs several sessions of the sample HIL tests, each a pytest session of its own with its own
# stdout, stderr, exit code (and JUnit XML where asked), as separate `pytest` commands would have: a new interpreter
# for each would spend most of its time starting Python and importing pytest and the plugin. The sample's own
# modules are imported afresh for every session. pyserial's socket:// port sleeps 0.3 s after closing, for a server
# that the same process reconnects to at once; each session closes its port at its end, and the stand-in devices
# take one client after another without it.
PYTEST_SESSIONS = r"""
import json, os, sys, time, types
import pytest
try:
    import serial.urlhandler.protocol_socket
except ImportError:
    pass
else:
    serial.urlhandler.protocol_socket.time = types.SimpleNamespace(sleep=lambda seconds: None)

runs, examples = json.loads(sys.argv[1]), sys.argv[2]
results = []
for run in runs:
    sys.stdout.flush()
    sys.stderr.flush()
    saved = os.dup(1), os.dup(2)
    with open(run["stdout"], "wb") as out, open(run["stderr"], "wb") as err:
        os.dup2(out.fileno(), 1)
        os.dup2(err.fileno(), 2)
        start = time.monotonic()
        try:
            code = int(pytest.main(run["args"]))
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os.dup2(saved[0], 1)
            os.dup2(saved[1], 2)
            os.close(saved[0])
            os.close(saved[1])
    results.append({"returncode": code, "seconds": time.monotonic() - start})
    for name, module in list(sys.modules.items()):
        if str(getattr(module, "__file__", None) or "").startswith(examples):
            del sys.modules[name]
print(json.dumps(results))
"""


def start_pytest_sessions(sessions: dict[str, list[str]], tests: Path, work: Path,
                          cwd: Path | None = None) -> tuple[subprocess.Popen, dict[str, Path]]:
    """Start ``sessions`` (name -> the arguments of ``pytest``) on the HIL tests in ``tests``, one after another in
    one new interpreter (:data:`PYTEST_SESSIONS`) started in ``cwd`` (else ``tests``); ``work`` is a folder for
    their output files (``NAME.out``, ``NAME.err``). :func:`pytest_session_results` waits for them."""
    import json

    runs = [{"args": pytest_argv(*args)[3:], "stdout": str(work / f"{name}.out"), "stderr": str(work / f"{name}.err")}
            for name, args in sessions.items()]  # fmt: skip
    proc = subprocess.Popen([sys.executable, "-c", PYTEST_SESSIONS, json.dumps(runs), str(tests)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=cwd or tests)
    return proc, {name: work / name for name in sessions}


def pytest_session_results(started: tuple[subprocess.Popen, dict[str, Path]]) -> dict[str, dict]:
    """What :func:`start_pytest_sessions` started gave, once it ends: per session name its ``returncode``,
    ``stdout``, ``stderr`` and ``seconds``."""
    import json

    proc, outputs = started
    stdout, stderr = proc.communicate(timeout=600)
    assert proc.returncode == 0, stdout[-3000:] + stderr[-3000:]
    results = json.loads(stdout.strip().splitlines()[-1])
    return {name: {**res, "stdout": Path(f"{base}.out").read_text(), "stderr": Path(f"{base}.err").read_text()}
            for (name, base), res in zip(outputs.items(), results, strict=True)}


def pytest_sessions(sessions: list[list[str]], tests: Path, work: Path) -> list[subprocess.CompletedProcess]:
    """Each of ``sessions`` (the arguments of ``pytest``) run on the HIL tests in ``tests``, one after another in one
    new interpreter (:func:`start_pytest_sessions`): each session's exit code, stdout and stderr."""
    results = pytest_session_results(start_pytest_sessions({f"session{i}": args for i, args in enumerate(sessions)},
                                                           tests, work))
    return [subprocess.CompletedProcess(args, res["returncode"], res["stdout"], res["stderr"])
            for args, res in zip(sessions, results.values(), strict=True)]
