"""`compile` and `optimize` with `--executor ray` at an address where no Ray cluster answers: one line naming the
address, exit 6, within seconds (not Ray's minutes of retries), through the real CLI."""

from __future__ import annotations

import socket
import threading
import time
from pathlib import Path

import pytest

from helpers import one_error_line, run_cli

REPO = Path(__file__).resolve().parents[3]
MODEL = REPO / "examples" / "kws" / "dscnn_mlperf_int8.tflite"
FLOAT_MODEL, DATA = REPO / "examples" / "kws_tree" / "dscnn_mlperf_float.h5", REPO / "examples" / "kws_tree" / "speech_commands_subset.npz"
HINT = ("start the cluster there (`ray start --head --port=PORT`) or give the address of a running one "
        "(--ray-address or RAY_ADDRESS), or run with --executor local")  # fmt: skip


@pytest.fixture(autouse=True)
def _ray_installed():
    pytest.importorskip("ray", reason="Ray is not installed (pip install 'edgedeploy[ray]')")


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def silent_port():
    """A port that accepts connections (the kernel does) and never says a word."""
    with socket.create_server(("127.0.0.1", 0)) as listener:
        yield listener.getsockname()[1]


def compile_argv(out: Path) -> list:
    return ["compile", MODEL, "-t", "ethos-u55-128", "--executor", "ray", "-o", out]


@pytest.mark.parametrize("given", ["--ray-address", "RAY_ADDRESS"])
def test_compile_at_a_closed_port_stops_in_one_line_at_once(tmp_path, given):
    address = f"127.0.0.1:{closed_port()}"
    flag = ["--ray-address", address] if given == "--ray-address" else []
    env = {"RAY_ADDRESS": address} if given == "RAY_ADDRESS" else {}
    start = time.monotonic()
    proc = run_cli(*compile_argv(tmp_path / "run"), *flag, env=env, timeout=120)
    took = time.monotonic() - start
    assert proc.returncode == 6, proc.stderr
    assert one_error_line(proc) == f"error: nothing answers at Ray address {address} ({given}): connection refused. {HINT}"
    assert took < 20, took  # Ray alone retried such an address for minutes
    assert not (tmp_path / "run").exists()  # checked before anything is written


@pytest.mark.parametrize(("env", "code", "line"), [
    ({"EDGEDEPLOY_RAY_CONNECT_TIMEOUT": "0.5"}, 6,  # a short wait: the test waits it out
     "error: Ray address {address} (--ray-address) accepts a connection but gives no answer within 0.5 s "
     "(EDGEDEPLOY_RAY_CONNECT_TIMEOUT): it is not a Ray cluster. " + HINT),
    ({"EDGEDEPLOY_RAY_CONNECT_TIMEOUT": "soon"}, 2,
     "error: EDGEDEPLOY_RAY_CONNECT_TIMEOUT='soon' is not a number of seconds in (0, 600]. set it to e.g. 20, or unset it"),
])  # fmt: skip
def test_compile_at_a_port_that_says_nothing_waits_the_connect_timeout(tmp_path, silent_port, env, code, line):
    address = f"127.0.0.1:{silent_port}"
    start = time.monotonic()
    proc = run_cli(*compile_argv(tmp_path / "run"), "--ray-address", address, env=env, timeout=120)
    took = time.monotonic() - start
    assert proc.returncode == code, proc.stderr
    assert one_error_line(proc) == line.format(address=address)
    assert took < 20, took


def test_compile_with_an_address_that_is_not_host_port_is_a_usage_error(tmp_path):
    proc = run_cli(*compile_argv(tmp_path / "run"), "--ray-address", "head-node", timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert one_error_line(proc).startswith("error: Ray address 'head-node' is not HOST:PORT, ray://HOST:PORT or auto. ")


@pytest.mark.parametrize("given", ["--ray-address", "RAY_ADDRESS"])
def test_optimize_at_a_closed_port_stops_in_one_line(tmp_path, given):
    address = f"127.0.0.1:{closed_port()}"
    flag = ["--ray-address", address] if given == "--ray-address" else []
    env = {"RAY_ADDRESS": address} if given == "RAY_ADDRESS" else {}
    start = time.monotonic()
    proc = run_cli("optimize", FLOAT_MODEL, "--data", DATA, "-o", tmp_path / "run", "--leaves", "ptq",
                   "--executor", "ray", *flag, env=env, timeout=300)  # fmt: skip
    took = time.monotonic() - start
    assert proc.returncode == 6, proc.stderr
    assert one_error_line(proc) == f"error: nothing answers at Ray address {address} ({given}): connection refused. {HINT}"
    assert took < 60, took  # TensorFlow's import and the model's load included
    assert not (tmp_path / "run").exists()  # checked before the run folder is made
