"""HIL over a serial link for real: `edgedeploy emulate FW --serve tcp:PORT` and the pytest plugin's `serial:` device.

The firmware is the bundle's CPU path with the device runner on UART0 of QEMU's mps3-an547, served
on a local TCP port; the host side is pyserial's ``socket://`` URL. The TFLM library is built once
per test run into one cache (``EDGEDEPLOY_TEST_TFLM_CACHE`` names a persistent one).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from helpers import pytest_argv, pytest_sessions
from typer.testing import CliRunner

from edgedeploy.cli.app import app
from edgedeploy.pipeline.compile import compile_tflite

pytestmark = pytest.mark.requires_data

REPO = Path(__file__).resolve().parents[3]
HIL_TESTS = REPO / "examples" / "hil"
TREE = Path(os.environ.get("EDGEDEPLOY_TFLM_DIR") or REPO.parent / "shared" / "third_party" / "tflm-cortex-m55")
BOARD = "corstone-300-u55-128"
BUILD_TIMEOUT = 1500  # seconds: a cold TFLM library on two cores


def export(shared_data: Path, folder: Path, model: str, data: str, golden: int) -> Path:
    run = folder / "run"
    compile_tflite([shared_data / model], [BOARD], run)
    fw = folder / "fw"
    result = CliRunner().invoke(app, ["export", str(run), "--out", str(fw), "--data", str(shared_data / data), "--golden", str(golden)])
    assert result.exit_code == 0, result.output
    return fw


@pytest.fixture(scope="module")
def kws_bundle(shared_data, tmp_path_factory) -> Path:
    return export(shared_data, tmp_path_factory.mktemp("kws"), "kws/dscnn_mlperf_int8.tflite",
                  "kws/speech_commands_v2_test_mfcc_mlperf.npz", 4)  # fmt: skip


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """`edgedeploy emulate FW --serve tcp:PORT` in the background, until :meth:`stop`."""

    def __init__(self, bundle: Path, build_dir: Path, cache: Path) -> None:
        self.port, self.build_dir = free_port(), build_dir
        self.env = env = {**os.environ, "XDG_CACHE_HOME": str(cache), "EDGEDEPLOY_TFLM_DIR": str(TREE), "NO_COLOR": "1", "COLUMNS": "200"}
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "edgedeploy", "emulate", str(bundle), "--serve", f"tcp:{self.port}", "--build-dir", str(build_dir)],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
        )  # fmt: skip
        self.ready = threading.Event()
        self.out: list[str] = []
        threading.Thread(target=self._read, daemon=True).start()
        if not self.ready.wait(BUILD_TIMEOUT) or self.proc.poll() is not None:
            self.stop()
            pytest.fail(f"the server did not come up: {''.join(self.out)} {self.proc.stderr.read()}")

    def _read(self) -> None:
        for line in self.proc.stdout:
            self.out.append(line)
            if line.startswith("serving on "):
                self.ready.set()
        self.ready.set()

    @property
    def url(self) -> str:
        return f"socket://127.0.0.1:{self.port}"

    def stop(self) -> tuple[int, str]:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            rc = self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            rc = self.proc.wait()
        return rc, self.proc.stderr.read()


@pytest.fixture(scope="module")
def kws_server(tflm_cache, kws_bundle, tmp_path_factory):
    server = Server(kws_bundle, tmp_path_factory.mktemp("serve-kws"), tflm_cache)
    yield server
    rc, err = server.stop()
    assert rc == 0 and "stopped serving 'dscnn_mlperf' on tcp:127.0.0.1:" in err, err


def run_hil(bundle: Path, device: str, *extra: str) -> subprocess.CompletedProcess:
    args = pytest_argv("-q", str(REPO / "examples" / "hil"), "--edgedeploy-bundle", str(bundle),
                       "--edgedeploy-device", device, *extra)
    return subprocess.run(args, capture_output=True, text=True, cwd=REPO / "examples" / "hil", timeout=600)


def other_model(bundle: Path, dest: Path) -> Path:
    """A copy of the bundle whose manifest records another model (the host expects another model)."""
    shutil.copytree(bundle, dest)
    manifest = json.loads((dest / "manifest.json").read_text())
    manifest["model"]["sha256"] = manifest["cpu_model"]["sha256"] = "0" * 64
    (dest / "manifest.json").write_text(json.dumps(manifest))
    return dest


@pytest.fixture(scope="module")
def hil_runs(kws_server, kws_bundle, tmp_path_factory) -> dict[str, subprocess.CompletedProcess]:
    """The sample HIL tests over the emulated UART (twice: a second client after the first left) and with the bundle
    of another model: one pytest session each, one after another in one interpreter."""
    work = tmp_path_factory.mktemp("serial-sessions")
    sessions = {
        "sample": [kws_bundle],
        "second-client": [kws_bundle, "-k", "case3"],
        "other-model": [other_model(kws_bundle, work / "other")],
    }
    procs = pytest_sessions([["-q", str(HIL_TESTS), "--edgedeploy-bundle", str(fw), "--edgedeploy-device",
                              f"serial:{kws_server.url}", *more] for fw, *more in sessions.values()], HIL_TESTS, work)
    return dict(zip(sessions, procs, strict=True))


def test_the_hil_sample_passes_bit_exactly_over_the_emulated_uart(hil_runs):
    proc = hil_runs["sample"]
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "5 passed" in proc.stdout, proc.stdout  # 4 golden cases, bit-exact (tolerance 0), + the top-1 test
    times = proc.stdout.split("edgedeploy device inference times", 1)[1]
    for case in ("case0-down", "case3-no"):
        assert f"test_output_matches_golden[{case}]: " in times
    assert times.count("ms device clock") == 4 and "test_top1_matches_golden: 4 inferences" in times
    proc = hil_runs["second-client"]  # a second client, after the first left
    assert proc.returncode == 0 and "1 passed" in proc.stdout, proc.stdout


def answer(port) -> object:
    from edgedeploy.hil import frame as fr

    dec = fr.Decoder(1 << 16)
    while True:
        byte = port.read(1)
        assert byte, "no answer within the port's timeout"
        events = dec.feed_all(byte)
        if events:
            return events[0]


def test_a_corrupted_frame_gets_an_error_frame_and_the_firmware_stays_up(kws_server, kws_bundle):
    import numpy as np
    import serial

    from edgedeploy.hil import frame as fr

    with np.load(kws_bundle / "golden.npz") as g:
        case, expected = g["input_0"][1].tobytes(), g["output_0"][1].tobytes()
    port = serial.serial_for_url(kws_server.url, timeout=10)
    try:
        bad = bytearray(fr.encode(fr.INFER, 1, case))
        bad[100] ^= 0x04
        port.write(b"noise" + bytes(bad))
        err = answer(port)
        assert (err.type, err.seq, fr.parse_error(err.payload)) == (fr.ERROR, 1, (fr.ERR_CRC, "crc mismatch"))
        port.write(fr.encode(fr.INFER, 2, case)[:200])  # cut off part way: timed out by the runner
        err = answer(port)
        assert (err.type, fr.parse_error(err.payload)[0]) == (fr.ERROR, fr.ERR_TIMEOUT)
        port.write(fr.encode(fr.INFER, 3, case))
        ok = answer(port)
        assert ok.type == fr.INFER | fr.REPLY and ok.seq == 3
        assert fr.parse_result(ok.payload).output == expected  # the golden output, bit for bit
    finally:
        port.close()


def test_a_bundle_of_another_model_is_refused_by_the_handshake(hil_runs):
    proc = hil_runs["other-model"]
    assert proc.returncode == 1
    lines = {ln for ln in proc.stdout.splitlines() if ln.startswith("--edgedeploy-device serial:")}
    assert len(lines) == 1, proc.stdout
    assert "runs model 'dscnn_mlperf' sha256 " in lines.pop() and "5 errors" in proc.stdout


def test_a_device_that_never_answers_fails_within_its_timeout_in_one_line(kws_bundle):
    pytest.importorskip("serial")
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(4)  # accepts (the kernel does), never answers
        port = listener.getsockname()[1]
        start = time.monotonic()
        proc = run_hil(kws_bundle, f"serial:socket://127.0.0.1:{port}", "--edgedeploy-timeout", "0.2")
        took = time.monotonic() - start
    assert proc.returncode == 1
    lines = {ln for ln in proc.stdout.splitlines() if ln.startswith("--edgedeploy-device serial:")}
    assert lines == {f"--edgedeploy-device serial:socket://127.0.0.1:{port}: the device on socket://127.0.0.1:{port} did not "
                     "answer HELLO within 0.2 s (no bytes arrived). check that the firmware runs the edgedeploy runner on "
                     "this port at this baud rate"}, proc.stdout
    assert took < 60


def test_a_port_in_use_is_one_line_with_exit_6(kws_server, kws_bundle):
    proc = subprocess.run(  # the same build folder: nothing to rebuild
        [sys.executable, "-m", "edgedeploy", "emulate", str(kws_bundle), "--serve", f"tcp:{kws_server.port}",
         "--build-dir", str(kws_server.build_dir)], capture_output=True, text=True, env=kws_server.env, timeout=600,
    )  # fmt: skip
    assert proc.returncode == 6, proc.stderr
    err = proc.stderr.strip().splitlines()
    assert len(err) == 1 and f"QEMU stopped before the firmware served on 127.0.0.1:{kws_server.port}" in err[0]
    assert "Address already in use" in err[0]


def test_serve_refuses_a_bad_address_and_a_bundle_without_runner(kws_bundle, tmp_path):
    result = CliRunner().invoke(app, ["emulate", str(kws_bundle), "--serve", "udp:4000"])
    assert result.exit_code == 2 and "is not tcp:PORT or tcp:HOST:PORT" in result.stderr
    old = tmp_path / "old"
    shutil.copytree(kws_bundle, old)
    manifest = json.loads((old / "manifest.json").read_text())
    del manifest["runner"]  # as an earlier edgedeploy wrote it
    (old / "manifest.json").write_text(json.dumps(manifest))
    result = CliRunner().invoke(app, ["emulate", str(old), "--serve", "tcp:4000"])
    assert result.exit_code == 3 and "ships no device runner" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


@pytest.mark.slow
def test_resnet8_passes_over_the_emulated_uart_and_refuses_the_kws_bundle(tflm_cache, shared_data, kws_bundle, tmp_path_factory):
    fw = export(shared_data, tmp_path_factory.mktemp("ic"), "ic/resnet8_mlperf_int8.tflite", "ic/cifar10_jpeg_subset.npz", 4)
    server = Server(fw, tmp_path_factory.mktemp("serve-ic"), tflm_cache)
    try:
        proc = run_hil(fw, f"serial:{server.url}")
        assert proc.returncode == 0, proc.stdout + proc.stderr
        assert "5 passed" in proc.stdout and proc.stdout.count("ms device clock") == 4
        proc = run_hil(kws_bundle, f"serial:{server.url}")  # the DS-CNN bundle against the ResNet-8 firmware
        assert proc.returncode == 1 and "runs model 'resnet8_mlperf' sha256 " in proc.stdout
    finally:
        rc, err = server.stop()
    assert rc == 0, err
