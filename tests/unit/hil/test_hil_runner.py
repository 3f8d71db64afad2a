"""The bundle's device runner (C) and the host side (edgedeploy.hil) against each other, on this machine.

The runner's sources are built with the host gcc together with tests/unit/c/runner_host.c: a codec
driver (CRC, encode, decode scripts) and the runner itself on a pty with a stand-in model
(out[j] = sum(input) + 7 j, mod 256). The Python codec must give the same bytes and events as the C
one; the host side must get answers, error frames and timeouts through pyserial as a board would.
"""

from __future__ import annotations

import os
import random
import shutil
import subprocess
import time
import zlib
from importlib import resources
from pathlib import Path

import pytest

from helpers import HIL_IN_BYTES, HIL_OUT_BYTES, fake_model, pytest_argv, tiny_hil_bundle

from edgedeploy.errors import InvalidInputError, ToolFailedError
from edgedeploy.export.device_runner import FILES, runner_files
from edgedeploy.hil import frame as fr
from edgedeploy.hil.serial_device import SerialDevice, parse_device
from edgedeploy.core.proc import run_command

HERE = Path(__file__).parents[1]
SHA = "ab" * 32
IN_BYTES, OUT_BYTES = HIL_IN_BYTES, HIL_OUT_BYTES
FLAGS = ["-std=c99", "-O1", "-Wall", "-Wextra", "-Werror", "-pedantic"]


@pytest.fixture(scope="module")
def runner_host(tmp_path_factory) -> Path:
    gcc = shutil.which("gcc") or shutil.which("cc")
    if gcc is None:
        pytest.skip("no host C compiler (apt-get install gcc)")
    src = tmp_path_factory.mktemp("runner-src")
    for name, data in runner_files().items():  # exactly the bytes a bundle ships
        (src / name).write_bytes(data)
    exe = src / "runner_host"
    res = run_command([gcc, *FLAGS, "-D_POSIX_C_SOURCE=200809L", f"-I{src}", HERE / "c" / "runner_host.c",
                       src / "edgedeploy_frame.c", src / "edgedeploy_runner.c", "-o", exe], timeout=120)  # fmt: skip
    assert res.ok, res.stderr
    return exe


def c_out(exe: Path, *args: str, stdin: str | None = None) -> str:
    res = run_command([exe, *args], timeout=60, input_text=stdin)
    assert res.ok, res.stderr
    return res.stdout


def test_shipped_files_are_the_templates():
    folder = resources.files("edgedeploy.export").joinpath("templates", "runner")
    assert sorted(runner_files()) == sorted(FILES)
    assert all(runner_files()[f] == folder.joinpath(f).read_bytes() for f in FILES)


def test_runner_compiles_for_cortex_m55_without_warnings(tmp_path):
    gcc = shutil.which("arm-none-eabi-gcc")
    if gcc is None:
        pytest.skip("arm-none-eabi-gcc not installed (apt-get install gcc-arm-none-eabi)")
    for name, data in runner_files().items():
        (tmp_path / name).write_bytes(data)
    for source in (f for f in FILES if f.endswith(".c")):
        res = run_command([gcc, "-mcpu=cortex-m55", "-mthumb", "-mfloat-abi=hard", "-O2", *FLAGS, "-c", tmp_path / source,
                           "-o", tmp_path / (source + ".o")], timeout=120)  # fmt: skip
        assert res.ok, res.stderr


def test_crc_is_zlib_crc32(runner_host):
    rng = random.Random(38)
    print("seed 38")
    payloads = [b"", b"123456789", bytes(range(256)), bytes(rng.getrandbits(8) for _ in range(1000))]
    for p in payloads:
        assert int(c_out(runner_host, "crc", p.hex()), 16) == zlib.crc32(p) == fr.crc32(p)
    assert fr.crc32(b"123456789") == 0xCBF43926  # the CRC-32 check value


def test_c_and_python_encode_the_same_frames(runner_host):
    rng = random.Random(7)
    print("seed 7")
    for ftype, seq, n in [(1, 0, 0), (2, 255, 1), (0x82, 17, 490), (0x7F, 3, 3072)]:
        payload = bytes(rng.getrandbits(8) for _ in range(n))
        frame = fr.encode(ftype, seq, payload)
        assert bytes.fromhex(c_out(runner_host, "encode", str(ftype), str(seq), payload.hex()).strip()) == frame
        assert frame[:2] == b"\xed\x5a" and frame[2] == ftype and frame[3] == seq
        assert int.from_bytes(frame[4:8], "little") == n and len(frame) == 12 + n


def python_events(script: list[tuple], capacity: int, timeout_ms: int) -> list[str]:
    dec, out = fr.Decoder(capacity, timeout_ms), []
    for step in script:
        evs = dec.feed_all(step[1], step[2]) if step[0] == "feed" else [dec.poll(step[1])]
        for ev in evs:
            if isinstance(ev, fr.Frame):
                out.append(f"frame {ev.type} {ev.seq} {ev.payload.hex()}".strip())
            elif isinstance(ev, fr.FrameError):
                out.append(f"error {ev.code} {ev.seq}")
    return out


def c_events(exe: Path, script: list[tuple], capacity: int, timeout_ms: int) -> list[str]:
    lines = [f"feed {s[1].hex() or '-'} {s[2]}" if s[0] == "feed" else f"poll {s[1]}" for s in script]
    text = c_out(exe, "decode", str(capacity), str(timeout_ms), stdin="\n".join(lines) + "\n")
    return [ln.strip() for ln in text.splitlines() if ln.strip()]


def test_c_and_python_decode_the_same_events(runner_host):
    good = fr.encode(2, 9, b"\x01\x02\x03")
    bad_crc = bytearray(fr.encode(2, 10, b"\x04\x05\x06"))
    bad_crc[9] ^= 0x40
    too_long = fr.encode(2, 11, bytes(40))
    script = [
        ("feed", b"noise\xed\x00\xed" + good, 0),  # noise and false sync bytes first
        ("feed", bytes(bad_crc), 5),
        ("feed", fr.encode(1, 12), 6),  # a HELLO straight after
        ("feed", too_long[:20], 10),  # longer than the capacity: refused at its header
        ("poll", 30), ("feed", too_long[20:], 40), ("poll", 100), ("poll", 141),  # the rest dropped until quiet
        ("feed", good[:10], 200), ("poll", 250), ("poll", 301),  # cut off: timed out after 100 ms
        ("feed", b"\xed", 400), ("poll", 600),  # a lone sync byte is noise, not an error
        ("feed", good, 700),
    ]
    expected = ["frame 2 9 010203", "error 1 10", "frame 1 12", "error 2 11", "error 3 9", "frame 2 9 010203"]
    assert python_events(script, 8, 100) == expected
    assert c_events(runner_host, script, 8, 100) == expected


def test_random_streams_decode_the_same_in_c_and_python(runner_host):
    seed = 3838
    print(f"seed {seed}")
    rng = random.Random(seed)
    script, now = [], 0
    for _ in range(60):
        payload = bytes(rng.getrandbits(8) for _ in range(rng.randrange(0, 24)))
        data = bytearray(fr.encode(rng.choice([1, 2, 5]), rng.randrange(256), payload))
        roll = rng.random()
        if roll < 0.2:
            data[rng.randrange(len(data))] ^= 1 << rng.randrange(8)  # a flipped bit anywhere
        elif roll < 0.3:
            data = data[: rng.randrange(1, len(data))]  # cut off
        elif roll < 0.4:
            data = bytes(rng.getrandbits(8) for _ in range(rng.randrange(1, 10))) + data  # noise first
        now += rng.randrange(0, 80)
        script.append(("feed", bytes(data), now))
        if rng.random() < 0.5:
            now += rng.randrange(0, 200)
            script.append(("poll", now))
    py = python_events(script, 16, 50)
    assert c_events(runner_host, script, 16, 50) == py
    assert any(e.startswith("frame") for e in py) and any(e.startswith("error") for e in py)


# --------------------------------------------------------------------------- the runner on a pty


class Pty:
    """The runner (or nothing) on a pty's master side; the host opens the slave through pyserial."""

    def __init__(self, argv: list[str] | None) -> None:
        self.master, self.slave = os.openpty()  # the slave stays open here too, as a board's line is always there
        self.path = os.ttyname(self.slave)
        self.proc = None
        if argv is not None:
            self.proc = subprocess.Popen(argv, stdin=self.master, stdout=self.master, stderr=subprocess.PIPE)

    def device(self, sha: str = SHA, timeout: float = 5.0) -> SerialDevice:
        return SerialDevice(self.path, model_sha256=[sha], input_bytes=IN_BYTES, output_bytes=OUT_BYTES, name="tiny",
                            timeout=timeout)  # fmt: skip

    def raw(self, timeout: float = 5.0):
        import serial

        return serial.serial_for_url(self.path, baudrate=115200, timeout=timeout)

    def close(self) -> None:
        if self.proc is not None:
            self.proc.terminate()
            self.proc.wait(timeout=10)
            self.proc.stderr.close()
        os.close(self.slave)
        os.close(self.master)


@pytest.fixture
def pty_runner(runner_host):
    pytest.importorskip("serial")
    made = []

    def make(*extra: str, sha: str = SHA) -> Pty:
        p = Pty([str(runner_host), "serve", sha, str(IN_BYTES), str(OUT_BYTES), *extra])
        made.append(p)
        assert p.proc.stderr.readline().strip() == b"runner_host ready"
        return p

    yield make
    for p in made:
        p.close()


def test_handshake_then_inferences(pty_runner):
    dev = pty_runner().device()
    try:
        assert dev.hello.model_sha256 == SHA and dev.hello.name == "host_runner"
        assert (dev.hello.input_bytes, dev.hello.output_bytes, dev.hello.version) == (IN_BYTES, OUT_BYTES, 1)
        for data in (bytes(IN_BYTES), bytes(range(1, 7)), b"\xff" * 6):
            assert dev(data) == fake_model(data)
            assert dev.last.cycles is not None and dev.last.device_ms is not None and dev.last.round_trip_s > 0
            assert dev.last.npu_cycles is None and dev.last.pmu == ()
    finally:
        dev.close()


def test_a_corrupted_frame_gets_an_error_frame_and_the_runner_stays_up(pty_runner):
    p = pty_runner()
    port = p.raw()
    try:
        bad = bytearray(fr.encode(fr.INFER, 1, bytes(range(IN_BYTES))))
        bad[10] ^= 0x10
        port.write(bytes(bad))
        dec = fr.Decoder(1 << 16)
        events = []
        while not events:
            chunk = port.read(1)
            assert chunk, "no answer to a corrupted frame"
            events = dec.feed_all(chunk)
        assert events[0].type == fr.ERROR and events[0].seq == 1
        assert fr.parse_error(events[0].payload) == (fr.ERR_CRC, "crc mismatch")
        port.write(fr.encode(fr.INFER, 2, bytes(range(IN_BYTES))))  # the next good frame is answered
        events = []
        while not events:
            chunk = port.read(1)
            assert chunk
            events = dec.feed_all(chunk)
        assert events[0].type == fr.INFER | fr.REPLY and events[0].seq == 2
        assert fr.parse_result(events[0].payload).output == fake_model(bytes(range(IN_BYTES)))
    finally:
        port.close()


def test_error_frames_from_the_device_are_one_line(pty_runner):
    dev = pty_runner().device()
    try:
        dev.stream.write(fr.encode(fr.INFER, 7, bytes(3))[:9])  # cut off: the runner times it out (200 ms)
        time.sleep(0.5)
        with pytest.raises(ToolFailedError) as err:
            dev.request(0x33, b"", "PING")  # an unknown type
        assert "refused PING: unknown frame type" in err.value.one_line() and "\n" not in err.value.one_line()
        with pytest.raises(ToolFailedError, match="refused INFER: wrong input size"):
            dev.request(fr.INFER, bytes(IN_BYTES - 1), "INFER")
        assert dev(bytes(IN_BYTES)) == fake_model(bytes(IN_BYTES))  # still up
    finally:
        dev.close()


def test_a_firmware_of_another_model_is_refused_by_the_handshake(pty_runner):
    p = pty_runner(sha="cd" * 32)
    with pytest.raises(InvalidInputError) as err:
        p.device(sha=SHA)
    line = err.value.one_line()
    assert "runs model 'host_runner' sha256 cdcdcdcdcdcdcdcd..., not bundle 'tiny'" in line and "\n" not in line


def test_a_crc_error_in_the_answer_is_one_line(pty_runner):
    p = pty_runner("corrupt")
    with pytest.raises(ToolFailedError) as err:
        p.device()
    assert "the answer from" in err.value.one_line() and "failed its check (CRC mismatch)" in err.value.one_line()


def test_a_device_that_never_answers_fails_within_its_timeout():
    pytest.importorskip("serial")
    p = Pty(None)  # nobody on the other end
    try:
        start = time.monotonic()
        with pytest.raises(ToolFailedError) as err:
            p.device(timeout=0.2)  # a short wait: the message and the time taken follow the timeout given
        took = time.monotonic() - start
    finally:
        p.close()
    assert 0.2 <= took < 3.0
    assert f"the device on {p.path} did not answer HELLO within 0.2 s (no bytes arrived)" in err.value.one_line()


def test_parse_device():
    assert parse_device("serial:/dev/ttyACM0") == ("/dev/ttyACM0", 115200)
    assert parse_device("serial:/dev/ttyUSB1@921600") == ("/dev/ttyUSB1", 921600)
    assert parse_device("serial:socket://127.0.0.1:4000") == ("socket://127.0.0.1:4000", 115200)
    for bad in ("serial:", "tty:/dev/x", "serial:/dev/x@0"):
        with pytest.raises(Exception, match="serial:PORT|baud"):
            parse_device(bad)


# --------------------------------------------------------------------------- the pytest plugin on the pty


def tiny_bundle(path: Path) -> Path:
    return tiny_hil_bundle(path, SHA, "the stand-in model")


def run_hil(bundle: Path, device: str, *extra: str) -> subprocess.CompletedProcess:
    argv = pytest_argv(str(HERE.parents[1] / "examples" / "hil"), "-q", "--edgedeploy-bundle", str(bundle),
                       "--edgedeploy-device", device, *extra)  # fmt: skip
    return subprocess.run(argv, capture_output=True, text=True, timeout=300, cwd=bundle.parent)


def test_the_hil_sample_passes_over_serial_with_times_in_the_report(pty_runner, tmp_path):
    p = pty_runner()
    proc = run_hil(tiny_bundle(tmp_path / "fw"), f"serial:{p.path}@115200")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "4 passed" in proc.stdout
    assert "edgedeploy device inference times" in proc.stdout
    for i in range(3):
        assert f"test_output_matches_golden[case{i}]: " in proc.stdout and "ms round trip" in proc.stdout
    assert "test_top1_matches_golden: 3 inferences, mean round trip" in proc.stdout


def test_the_hil_sample_fails_in_one_line_on_a_silent_device(tmp_path):
    pytest.importorskip("serial")
    p = Pty(None)
    try:
        start = time.monotonic()
        proc = run_hil(tiny_bundle(tmp_path / "fw"), f"serial:{p.path}", "--edgedeploy-timeout", "0.2")
        took = time.monotonic() - start
    finally:
        p.close()
    assert proc.returncode == 1, proc.stdout
    lines = {ln for ln in proc.stdout.splitlines() if ln.startswith(f"--edgedeploy-device serial:{p.path}: ")}
    assert lines == {f"--edgedeploy-device serial:{p.path}: the device on {p.path} did not answer HELLO within 0.2 s "
                     "(no bytes arrived). check that the firmware runs the edgedeploy runner on this port at this baud rate"}
    assert "4 errors" in proc.stdout and took < 60  # opened once per run: one timeout, not one per test


# --------------------------------------------------------------------------- emulate --serve, without QEMU


def test_serve_address_and_qemu_command_line():
    from edgedeploy.hil.emulate.serve import parse_address, qemu_serve_argv
    from edgedeploy.errors import UsageError

    assert parse_address("tcp:4000") == ("127.0.0.1", 4000)  # this machine only, unless a host is named
    assert parse_address("tcp:0.0.0.0:5555") == ("0.0.0.0", 5555)
    for bad in ("4000", "tcp:", "tcp:0", "tcp:70000", "udp:4000", "tcp:a b:1", "tcp:h:1;rm"):
        with pytest.raises(UsageError, match="is not tcp:PORT or tcp:HOST:PORT"):
            parse_address(bad)
    argv = qemu_serve_argv("qemu-system-arm", Path("/b/firmware.elf"), "127.0.0.1", 4000)
    assert argv[argv.index("-serial") + 1] == "tcp:127.0.0.1:4000,server=on,wait=off"
    assert argv[argv.index("-M") + 1] == "mps3-an547" and argv[-2:] == ["-kernel", "/b/firmware.elf"]


def test_run_until_stopped_stops_the_program_on_an_interrupt(tmp_path):
    from edgedeploy.core.proc import run_until_stopped

    seen = []

    def on_line(line: str) -> None:
        seen.append(line)
        if line == "ready":
            raise KeyboardInterrupt  # what Ctrl-C or the CLI's SIGTERM handler raises

    start = time.monotonic()
    res, stopped = run_until_stopped(["sh", "-c", "echo ready; sleep 30; echo never"], on_line=on_line,
                                     log_file=tmp_path / "log")  # fmt: skip
    assert stopped and seen == ["ready"] and time.monotonic() - start < 10
    assert res.returncode != 0 and "(stopped)" in (tmp_path / "log").read_text()
    res, stopped = run_until_stopped(["sh", "-c", "echo a; echo b >&2; exit 3"])
    assert not stopped and res.returncode == 3 and res.stdout.split() == ["a", "b"]


def test_a_bundle_name_cannot_overwrite_a_runner_file():
    from edgedeploy.errors import UsageError
    from edgedeploy.export.device_runner import check_bundle_name, runner_manifest

    for name in ("edgedeploy_frame", "edgedeploy_runner", "edgedeploy_runner_an547", "edgedeploy_runner_x"):
        with pytest.raises(UsageError, match="a file of the device runner"):
            check_bundle_name(name)
    check_bundle_name("kws")
    m = runner_manifest()
    assert m["protocol_version"] == fr.PROTOCOL_VERSION and sorted(m["sources"] + m["headers"]) == sorted(FILES)


def test_a_bad_device_option_is_a_usage_error(tmp_path):
    proc = subprocess.run(pytest_argv(str(HERE.parents[1] / "examples" / "hil"), "--edgedeploy-device", "tty0"),
                          capture_output=True, text=True, timeout=300, cwd=tmp_path)  # fmt: skip
    assert proc.returncode == 4 and "invalid choice: 'tty0' (choose from host, qemu, npu, serial:PORT[@BAUD])" in proc.stderr
