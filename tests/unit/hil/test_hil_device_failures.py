"""A device that misbehaves, on a real TCP socket: the HIL plugin ends each test in one line, without a traceback.

The device is a small server on 127.0.0.1 that speaks the runner's frame protocol (:mod:`edgedeploy.hil.frame`)
and misbehaves in one way per case: it hangs up, answers with the wrong length or PMU count, sends a frame longer
than the host reads, a corrupted frame, nothing at all, or an error frame whose text is 75 KB of terminal escapes
and newlines. The sample HIL tests (examples/hil) run against it through ``--edgedeploy-device
serial:socket://127.0.0.1:PORT`` in a pytest session of their own per device (exit code, output and JUnit XML
each its own), as a user runs them.
"""

from __future__ import annotations

import socket
import struct
import subprocess
import threading
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import pytest

from helpers import (HIL_IN_BYTES, HIL_OUT_BYTES, fake_model, pytest_argv, pytest_session_results,
                     start_pytest_sessions, tiny_hil_bundle)

from edgedeploy.hil import frame as fr

pytest.importorskip("serial")

EXAMPLES = Path(__file__).resolve().parents[3] / "examples" / "hil"
SHA = "cd" * 32
IN_BYTES, OUT_BYTES = HIL_IN_BYTES, HIL_OUT_BYTES
TESTS = ("test_output_matches_golden[case0]", "test_output_matches_golden[case1]", "test_output_matches_golden[case2]",
         "test_top1_matches_golden")  # fmt: skip
NOISE = b"\x1b[2J\x1b[31mFATAL\x1b[0m\n" + b"A" * 75_000 + b"\r\n\x00\x07\x1b]0;owned\x07end\n"  # 75 KB


def hello_payload(name: bytes = b"stub", sha: bytes = SHA.encode()) -> bytes:
    return struct.pack("<BBBxIII64s", fr.PROTOCOL_VERSION, fr.HAS_CYCLES, 0, IN_BYTES, OUT_BYTES, 64, sha) + name


def result_payload(data: bytes, n_pmu: int = 0) -> bytes:
    return struct.pack("<BBxxQIQ", fr.HAS_CYCLES, n_pmu, 1234, 0, 0) + fake_model(data)


def reply(frame: fr.Frame, payload: bytes) -> bytes:
    return fr.encode(frame.type | fr.REPLY, frame.seq, payload)


def error(frame: fr.Frame, text: bytes) -> bytes:
    return fr.encode(fr.ERROR, frame.seq, bytes([fr.ERR_INVOKE]) + text)


def corrupt(data: bytes) -> bytes:
    bad = bytearray(data)
    bad[10] ^= 0x20
    return bytes(bad)


def good(frame: fr.Frame) -> bytes:
    return reply(frame, hello_payload() if frame.type == fr.HELLO else result_payload(frame.payload))


Answer = Callable[[fr.Frame], "bytes | None"]  # the bytes to send; None hangs up; b"" sends nothing


def on_hello(answer: Answer) -> Answer:
    return lambda f: answer(f) if f.type == fr.HELLO else good(f)


def on_infer(answer: Answer) -> Answer:
    return lambda f: answer(f) if f.type == fr.INFER else good(f)


class StubDevice:
    """A TCP server on 127.0.0.1 answering each frame it reads with ``answer(frame)``, one client at a time."""

    def __init__(self, answer: Answer) -> None:
        self.answer = answer
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.listener.settimeout(0.1)  # so that stop() is seen
        self.stopped = threading.Event()
        self.port = self.listener.getsockname()[1]
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    @property
    def url(self) -> str:
        return f"socket://127.0.0.1:{self.port}"

    def _serve(self) -> None:
        while not self.stopped.is_set():
            try:
                conn, _ = self.listener.accept()
            except TimeoutError:
                continue
            conn.settimeout(None)
            with conn:
                self._talk(conn)

    def _talk(self, conn: socket.socket) -> None:
        decoder = fr.Decoder(1 << 16)
        while True:
            try:
                data = conn.recv(4096)
            except OSError:
                return
            if not data:
                return
            for ev in decoder.feed_all(data):
                if not isinstance(ev, fr.Frame):
                    continue
                out = self.answer(ev)
                if out is None:
                    conn.shutdown(socket.SHUT_RDWR)
                    return
                try:
                    conn.sendall(out)
                except OSError:
                    return

    def stop(self) -> None:
        self.stopped.set()
        self.thread.join(timeout=10)
        self.listener.close()


def tiny_bundle(path: Path) -> Path:
    return tiny_hil_bundle(path, SHA, "the stub's model")


HELLO_EXPECT = f"(expected a HELLO answer of 80 to {80 + fr.NAME_MAX} bytes)"
INFER_LAYOUT = "expected 29 (24 + 4 x 0 PMU counters + 5 output bytes)"
LOST = "is not answering INFER: it closed the connection during an earlier INFER. restart the device and run again"
RUNNER = "check that the firmware runs the edgedeploy runner on this port at this baud rate"
REBUILD = "build the firmware from a bundle exported by this edgedeploy"
SANITIZED = "FATAL AAAA"  # the start of the error text once its escapes and newlines are gone

# A device that sends nothing (or not the awaited frame) is waited out, once per sample test: these cases get a short
# timeout (long enough for the wrong frame, sent at once by a thread of this process, to arrive first where the line
# names it).
TIMEOUT = {"hello-answered-as-infer": "0.25", "infer-silent": "0.1", "infer-wrong-sequence": "0.25"}


def within(case: str) -> str:
    return f"within {TIMEOUT.get(case, '1')} s"


# name, the device's answer, what fails (setup: the handshake, every test; call: each test's INFER), the line(s)
CASES = [
    ("hello-hangs-up", on_hello(lambda f: None), "setup",
     [f"closed the connection before answering HELLO {HELLO_EXPECT}. {RUNNER}"]),
    ("hello-36-bytes", on_hello(lambda f: reply(f, hello_payload()[:36])), "setup",
     [f"answered HELLO with 36 payload bytes; expected 80 (the runner's header) and a model name of up to "
      f"{fr.NAME_MAX} characters. {REBUILD}"]),
    ("hello-5000-byte-name", on_hello(lambda f: reply(f, hello_payload(b"n" * 5000))), "setup",
     [f"answered HELLO with 5,080 payload bytes; at most {80 + fr.NAME_MAX} expected. {REBUILD}"]),
    ("hello-2-GiB-frame", on_hello(lambda f: fr.SYNC + struct.pack("<BBI", 0x81, f.seq, 0x7FFFFFFF) + bytes(64)), "setup",
     ["sent a frame of 2,147,483,647 payload bytes for HELLO; the host reads at most 1,048,576. " + RUNNER]),
    ("hello-corrupted", on_hello(lambda f: corrupt(good(f))), "setup",
     ["failed its check (CRC mismatch). check the baud rate and the wiring; the link corrupts bytes"]),
    ("hello-75KB-error-text", on_hello(lambda f: error(f, NOISE)), "setup",
     [f"refused HELLO: the model failed to run ({SANITIZED}"]),
    ("hello-name-and-hash-with-escapes", on_hello(lambda f: reply(f, hello_payload(b"\x1b[31mevil\n\rname", b"\x1b[2J\n" * 10))),
     "setup", ["runs model 'evil name' sha256 ..., not bundle 'tiny'"]),
    ("hello-of-another-protocol", on_hello(lambda f: reply(f, bytes([fr.PROTOCOL_VERSION + 1]) + hello_payload()[1:])),
     "setup", [f"speaks runner protocol {fr.PROTOCOL_VERSION + 1}, not {fr.PROTOCOL_VERSION}. {REBUILD}"]),
    ("hello-answered-as-infer", on_hello(lambda f: fr.encode(fr.INFER | fr.REPLY, f.seq, hello_payload())), "setup",
     [f"did not answer HELLO {within('hello-answered-as-infer')} (a frame of type 0x82 seq 1, not the answer to HELLO seq 1). {RUNNER}"]),
    ("infer-error-of-an-unknown-code-and-no-text", on_infer(lambda f: fr.encode(fr.ERROR, f.seq, bytes([250]))), "call",
     [f"refused INFER: error 250, not a code the runner sends (no text). {REBUILD}"]),
    ("infer-255-pmu-counters-in-full", on_infer(lambda f: reply(f, result_payload(f.payload, 255)[:24] + bytes(4 * 255)
                                                                 + fake_model(f.payload))), "call",
     ["answered INFER with 1,049 payload bytes declaring 255 PMU counters; its HELLO announced 0"]),
    ("infer-hangs-up", on_infer(lambda f: None), "call",
     [f"closed the connection before answering INFER (expected an INFER answer of 29 bytes). {RUNNER}", LOST, LOST, LOST]),
    ("infer-255-pmu-counters-in-36-bytes", on_infer(lambda f: reply(f, result_payload(f.payload, 255) + bytes(7))), "call",
     [f"answered INFER with 36 payload bytes declaring 255 PMU counters; its HELLO announced 0, so 29 bytes "
      f"(24 + 4 x 0 PMU counters + 5 output bytes) were expected. {REBUILD}"]),
    ("infer-output-short", on_infer(lambda f: reply(f, result_payload(f.payload)[:-1])), "call",
     [f"answered INFER with 28 payload bytes; {INFER_LAYOUT}. {REBUILD}"]),
    ("infer-output-long", on_infer(lambda f: reply(f, result_payload(f.payload) + b"x")), "call",
     [f"answered INFER with 30 payload bytes; {INFER_LAYOUT}. {REBUILD}"]),
    ("infer-75KB-error-text", on_infer(lambda f: error(f, NOISE)), "call",
     [f"refused INFER: the model failed to run ({SANITIZED}"]),
    ("infer-silent", on_infer(lambda f: b""), "call",
     [f"did not answer INFER {within('infer-silent')} (no bytes arrived). {RUNNER}"]),
    ("infer-wrong-sequence", on_infer(lambda f: good(fr.Frame(f.type, (f.seq + 1) & 0xFF, f.payload))), "call",
     [f"did not answer INFER {within('infer-wrong-sequence')} (a frame of type 0x82 seq "]),
]


@dataclass
class HilRun:
    url: str
    returncode: int
    stdout: str
    stderr: str
    xml: str
    seconds: float


@pytest.fixture(scope="module")
def hil_runs(tmp_path_factory) -> dict[str, HilRun]:
    """Each case's device, the sample HIL tests run against it through ``--edgedeploy-device serial:URL``."""
    work = tmp_path_factory.mktemp("devices")
    bundle = tiny_bundle(work / "fw")
    devices = {case[0]: StubDevice(case[1]) for case in CASES}
    sessions = {name: [str(EXAMPLES), "-q", "--edgedeploy-bundle", str(bundle), "--edgedeploy-device",
                       f"serial:{device.url}", "--edgedeploy-timeout", TIMEOUT.get(name, "1"),
                       f"--junitxml={work / name}.xml"] for name, device in devices.items()}  # fmt: skip
    # the devices that are waited out in an interpreter of their own, beside the others: waiting takes no processor
    groups = [{name: args for name, args in sessions.items() if (name in TIMEOUT) == waits} for waits in (False, True)]
    try:
        started = [start_pytest_sessions(group, EXAMPLES, work, cwd=work) for group in groups]
        results = {name: res for one in started for name, res in pytest_session_results(one).items()}
    finally:
        for device in devices.values():
            device.stop()
    return {name: HilRun(device.url, results[name]["returncode"], results[name]["stdout"], results[name]["stderr"],
                         (work / f"{name}.xml").read_text(), results[name]["seconds"])
            for name, device in devices.items()}  # fmt: skip


@pytest.mark.parametrize(("case", "stage", "expected"), [(c[0], *c[2:]) for c in CASES], ids=[c[0] for c in CASES])
def test_a_misbehaving_device_fails_each_test_in_one_line(hil_runs, case, stage, expected):
    run = hil_runs[case]
    out = run.stdout + run.stderr
    prefix = f"--edgedeploy-device serial:{run.url}: the device on {run.url} "
    if "runs model" in expected[0] or "speaks runner protocol" in expected[0]:
        prefix = f"--edgedeploy-device serial:{run.url}: the firmware on {run.url} "
    lines = [ln for ln in run.stdout.splitlines() if ln.startswith("--edgedeploy-device ")]
    assert run.returncode == 1, out
    assert len(lines) == len(TESTS), out  # one failure per test, nothing more
    wanted = expected if len(expected) == len(TESTS) else expected * len(TESTS)
    for line, want in zip(lines, wanted):
        assert line.startswith(prefix + want) if not want.startswith("failed") else want in line, line
        assert len(line) <= 1000 and line.isprintable(), line
    assert f"{len(TESTS)} {'errors' if stage == 'setup' else 'failed'}" in run.stdout, out
    for sign in ("Traceback", "serialutil", "SerialException", "ValueError", "\x1b", "AAAA\n"):
        assert sign not in out, out
    assert not [ln for ln in run.stdout.splitlines() if ln.startswith(("E   ", ">   "))], out  # no traceback lines
    report = ET.fromstring(run.xml)
    failures = [el for el in report.iter() if el.tag in ("failure", "error")]
    assert len(failures) == len(TESTS)
    for el in failures:
        text = el.get("message", "") + (el.text or "")
        assert "\x1b" not in text and "AAAA\n" not in text and len(el.get("message", "")) <= 1100, text[:300]
    assert run.seconds < 60


def test_device_text_is_cut_and_stripped_of_control_characters():
    assert fr.printable(NOISE).startswith("FATAL AAAA") and fr.printable(NOISE).endswith("AAAA end")
    assert len(fr.printable(NOISE)) == fr.TEXT_LIMIT and "..." in fr.printable(NOISE)
    assert fr.printable(b"a\tb\r\nc\x00d \xe2\x80\xaee\x1b[1;31mf\x1bcg") == "a b c d efg"
    assert fr.printable("short") == "short"


def test_a_qemu_firmware_failure_is_one_clean_line():
    """What QEMU's transport raises for firmware that faults, with the firmware's own output in it."""
    from edgedeploy.errors import ToolFailedError
    from edgedeploy.hil.npu_device import failing_in_one_line

    def faulting(data: bytes) -> bytes:
        raise ToolFailedError(f"the firmware faulted on the emulated Cortex-M55 (HardFault); last output: {NOISE.decode()}",
                              "raise --stack-size")  # fmt: skip

    with pytest.raises(pytest.fail.Exception) as err:
        failing_in_one_line(faulting, "qemu")(b"")
    line = str(err.value)
    assert err.value.pytrace is False and line.isprintable() and len(line) <= fr.LINE_LIMIT
    assert line.startswith("--edgedeploy-device qemu: the firmware faulted on the emulated Cortex-M55 (HardFault); "
                           "last output: FATAL AAAA") and line.endswith("AAAA end. raise --stack-size")


@pytest.mark.parametrize("value", ["0", "-1", "nan", "inf", "3601", "soon"])
def test_a_timeout_that_is_not_a_number_of_seconds_is_a_usage_error(value):
    import argparse

    from edgedeploy.hil.testing import _timeout_option

    with pytest.raises(argparse.ArgumentTypeError, match=r"is not a number of seconds in \(0, 3600\]"):
        _timeout_option(value)
    assert _timeout_option("0.5") == 0.5 and _timeout_option("3600") == 3600


def test_a_bad_timeout_stops_pytest_before_any_test(tmp_path):
    argv = pytest_argv(str(EXAMPLES), "-q", "--edgedeploy-bundle", str(tiny_bundle(tmp_path / "fw")),
                       "--edgedeploy-device", "serial:socket://127.0.0.1:9", "--edgedeploy-timeout", "nan")  # fmt: skip
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert proc.returncode == 4, proc.stdout + proc.stderr  # pytest's usage error
    assert "--edgedeploy-timeout: 'nan' is not a number of seconds in (0, 3600]" in proc.stderr
