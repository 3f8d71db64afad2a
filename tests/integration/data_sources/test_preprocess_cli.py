"""The user's code through the real command line (a preprocessing function, a ``--metric``): whatever way it ends
(SystemExit, a KeyboardInterrupt of its own, at load time or on a sample) is one error line naming it with a
non-zero exit (and, for a preprocess, nothing written), and what it prints goes to stderr, so ``--json`` prints
only the JSON document on stdout."""

from __future__ import annotations

import json
import os
import sys

import numpy as np
import pytest

from helpers import one_error_line, run_cli, run_in_process

FRONT_END = '''import os
import sys

print("front end loading")


def exits0(x):
    raise SystemExit(0)


def interrupts(x):
    raise KeyboardInterrupt


def prints(x):
    print("features", x.shape)
    sys.stdout.flush()
    os.write(1, b"descriptor 1\\n")
    return x
'''


@pytest.fixture(scope="module")
def small_run(tmp_path_factory):
    """A small Dense model and its .npz, and the front end module beside them."""
    from edgedeploy.keras import tfenv

    keras = tfenv.load().keras
    root = tmp_path_factory.mktemp("preprocess_cli")
    rng = np.random.default_rng(0)
    y = np.arange(48) % 2
    x = (rng.normal(size=(48, 4)) + y[:, None]).astype(np.float32)
    np.savez(root / "d.npz", x=x, y=y, split=(np.arange(48) % 4 == 0).astype(int))
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.layers.Input((4,)), keras.layers.Dense(2, activation="softmax")])
    model.save(root / "m.h5")
    (root / "fe.py").write_text(FRONT_END)
    (root / "fe_exits.py").write_text("import sys\nprint('loading')\nsys.exit(0)\n\ndef f(x):\n    return x\n")
    return root


@pytest.mark.parametrize("ref,words", [
    ("fe.py:exits0", "preprocess 'fe.py:exits0' tried to end the command on "),
    ("fe.py:interrupts", "preprocess 'fe.py:interrupts' tried to end the command on "),
    ("fe_exits.py:f", "preprocess 'fe_exits.py:f' cannot be loaded (SystemExit: 0)"),
])
def test_preprocess_endings_through_the_command_line(small_run, tmp_path, ref, words):
    # a refusal, whose check is the exit code and the line: in this process, which has TensorFlow loaded already
    out = tmp_path / "run"
    proc = run_in_process("optimize", small_run / "m.h5", "--data", small_run / "d.npz", "-o", out, "--leaves", "ptq",
                          "--epochs", "0", "--min-steps", "0", "--preprocess", ref, "--json", cwd=small_run)
    assert proc.returncode == 2, proc.stderr
    assert words in one_error_line(proc) and proc.stdout == ""
    assert not (out / "inputs" / "data.npz").exists() and not list(out.glob("**/*.tflite"))


METRICS = '''import os
import sys

print("metrics loading")


def exits0(y, out):
    raise SystemExit(0)


def interrupts(y, out):
    raise KeyboardInterrupt


def prints(y, out):
    print("scoring", len(y))
    sys.stdout.flush()
    os.write(1, b"the metric's descriptor\\n")
    return float((out.argmax(axis=1) == y).mean())
'''


@pytest.mark.parametrize("ref,words", [
    ("cli_metrics:exits0", "metric 'cli_metrics:exits0' tried to end the command (SystemExit: 0)"),
    ("cli_metrics:interrupts", "metric 'cli_metrics:interrupts' tried to end the command (KeyboardInterrupt)"),
])
def test_metric_endings_through_the_command_line(small_run, tmp_path, monkeypatch, ref, words):
    # a refusal: in this process, with the module's folder on its path as PYTHONPATH puts it there
    (small_run / "cli_metrics.py").write_text(METRICS)
    out = tmp_path / "run"
    monkeypatch.syspath_prepend(str(small_run))
    monkeypatch.delitem(sys.modules, "cli_metrics", raising=False)
    try:
        proc = run_in_process("optimize", small_run / "m.h5", "--data", small_run / "d.npz", "-o", out, "--leaves",
                              "ptq", "--epochs", "0", "--min-steps", "0", "--metric", ref, "--json", cwd=small_run)
    finally:
        sys.modules.pop("cli_metrics", None)
    assert proc.returncode == 2, proc.stderr
    assert words in one_error_line(proc) and proc.stdout == ""
    assert not list(out.glob("**/*.tflite"))


def test_what_a_preprocess_and_a_metric_print_goes_to_stderr_through_the_console_script(small_run, tmp_path):
    """What reaches the process's stdout (descriptor 1 included) from both kinds of user code, in one run of the
    console script: ``--json`` still prints only the document."""
    (small_run / "cli_metrics.py").write_text(METRICS)
    proc = run_cli("optimize", small_run / "m.h5", "--data", small_run / "d.npz", "-o", tmp_path / "run", "--leaves",
                   "ptq", "--epochs", "0", "--min-steps", "0", "--preprocess", "fe.py:prints", "--metric",
                   "cli_metrics:prints", "--json", cwd=small_run,
                   env={"PYTHONPATH": os.pathsep.join([str(small_run), os.environ.get("PYTHONPATH", "")])})
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)  # only the document: what the functions printed went to stderr
    assert doc["schema"] == "edgedeploy.optimize" and [leaf["leaf"] for leaf in doc["leaves"]] == ["ptq"]
    assert proc.stderr.count("features (4,)") == 48 and proc.stderr.count("descriptor 1") == 48
    assert "front end loading" in proc.stderr
    assert "metrics loading" in proc.stderr and "scoring 12" in proc.stderr and "metric's descriptor" in proc.stderr
