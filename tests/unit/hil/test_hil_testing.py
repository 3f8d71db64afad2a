"""HIL helpers (edgedeploy.hil.testing) on a small hand-made bundle: loading, comparing, reports, transports."""

from __future__ import annotations

import json
import re
import sys

import numpy as np
import pytest

from edgedeploy.hil import testing as hil
from edgedeploy.errors import InvalidInputError
from edgedeploy.export import npz_bytes
from edgedeploy.core.files import sha256_bytes

SCALE, ZP = 0.00390625, -128


def make_bundle(path, outputs=None, labels=("no", "yes", "up")):
    """A bundle folder as `edgedeploy export` lays it out: 2 cases, one int8 input [1,4], one int8 output [1,3]."""
    path.mkdir(parents=True, exist_ok=True)
    inputs = np.array([[1, 2, 3, 4], [-5, 6, -7, 8]], np.int8)
    outputs = np.array([[-128, 100, -20], [127, -128, 0]], np.int8) if outputs is None else outputs
    npz = npz_bytes(
        {"input_0": inputs, "output_0": outputs, "argmax": outputs.argmax(1).astype(np.int32),
         "label": np.array([1, -1], np.int32), "row": np.array([10, 20], np.int64)}
    )  # fmt: skip
    (path / "golden.npz").write_bytes(npz)
    manifest = {
        "schema": "edgedeploy.firmware",
        "name": "tiny",
        "inputs": [{"name": "in", "shape": [1, 4], "dtype": "int8", "scale": [0.5], "zero_point": [0]}],
        "outputs": [{"name": "out", "shape": [1, 3], "dtype": "int8", "scale": [SCALE], "zero_point": [ZP]}],
        "labels": list(labels) if labels else None,
        "golden": {"count": 2, "npz": "golden.npz", "reference": {"description": "hand-made"}},
        "model": {"c_source": "tiny.c", "c_header": "tiny.h", "section": ".rodata.nn_model"},
        "files": {"golden.npz": {"sha256": sha256_bytes(npz), "bytes": len(npz)},
                  **{f: {"sha256": sha256_bytes(b""), "bytes": 0} for f in ("tiny.c", "tiny.h")}},
    }
    (path / "manifest.json").write_text(json.dumps(manifest))
    return path


@pytest.fixture
def bundle(tmp_path):
    return hil.load_bundle(make_bundle(tmp_path / "fw"))


def test_load_bundle_cases(bundle):
    assert len(bundle) == 2 and bundle.name == "tiny"
    c0, c1 = bundle
    assert c0.id == "case0-yes" and c1.id == "case1"  # label -1: unknown
    assert c0.label == 1 and c1.label is None and c0.row == 10
    assert c0.input_bytes() == bytes([1, 2, 3, 4])
    assert c1.input_bytes() == np.array([-5, 6, -7, 8], np.int8).tobytes()
    assert c0.argmax == 1 and bundle.output_bytes == 3


def test_exact_bytes_match(bundle):
    case = bundle[0]
    cmp = hil.assert_matches_golden(case.expected[0].tobytes(), bundle, case)
    assert cmp.ok and cmp.max_abs_diff == 0


def test_one_element_change_fails_with_a_per_element_report(bundle):
    case = bundle[0]
    got = case.expected[0].copy()
    got[2] += 1
    with pytest.raises(AssertionError) as info:
        hil.assert_matches_golden(got.tobytes(), bundle, case)
    text = str(info.value)
    assert "1 of 3 output elements differ by more than 0" in text
    assert re.search(r"\[2\]\s+-20\s+-19\s+1", text), text
    assert isinstance(info.value, hil.GoldenMismatch) and info.value.comparison.mismatches[0].index == (2,)
    # within a tolerance of one step it passes
    assert hil.assert_matches_golden(got.tobytes(), bundle, case, max_abs_diff=1).max_abs_diff == 1


def test_top1_change_is_named(bundle):
    case = bundle[0]
    got = case.expected[0].copy()
    got[0] = 127
    with pytest.raises(AssertionError, match=r"top-1 expected 1 \(yes\), got 0 \(no\)"):
        hil.assert_matches_golden(got, bundle, case)


def test_dequantized_floats_are_compared_in_quantized_steps(bundle):
    case = bundle[0]
    floats = (case.expected[0].astype(np.float32) - ZP) * SCALE
    assert hil.compare_to_golden(floats, bundle, case).ok
    floats[1] += 2 * SCALE
    cmp = hil.compare_to_golden(floats, bundle, case)
    assert not cmp.ok and cmp.max_abs_diff == 2


def test_wrong_output_size_is_an_assertion(bundle):
    with pytest.raises(AssertionError, match="answered 2 bytes"):
        hil.assert_matches_golden(b"\x00\x01", bundle, bundle[0])
    with pytest.raises(AssertionError, match="has 4 values"):
        hil.assert_matches_golden(np.zeros(4, np.int8), bundle, bundle[0])


def test_tampered_golden_file_is_refused(tmp_path):
    path = make_bundle(tmp_path / "fw")
    data = bytearray((path / "golden.npz").read_bytes())
    data[-40] ^= 1
    (path / "golden.npz").write_bytes(bytes(data))
    with pytest.raises(InvalidInputError) as err:
        hil.load_bundle(path)
    line = err.value.one_line()  # the shared check's one message shape
    assert line.startswith(f"golden file {path / 'golden.npz'} was changed after `edgedeploy export` wrote it"), line
    assert f"; {path / 'manifest.json'} records sha256 " in line and ". export the bundle again" in line, line


def test_not_a_bundle(tmp_path):
    with pytest.raises(InvalidInputError, match="no manifest.json"):
        hil.load_bundle(tmp_path)
    (tmp_path / "manifest.json").write_text(json.dumps({"schema": "edgedeploy.manifest"}))
    with pytest.raises(InvalidInputError, match="not an edgedeploy firmware bundle"):
        hil.load_bundle(tmp_path)


class FakePort:
    """A serial-port stand-in that answers in small chunks, as a UART does."""

    def __init__(self, answer: bytes, chunk: int = 1):
        self.answer, self.chunk, self.written = answer, chunk, b""

    def write(self, data):
        self.written += data

    def flush(self):
        pass

    def read(self, n):
        out, self.answer = self.answer[: min(n, self.chunk)], self.answer[min(n, self.chunk):]
        return out


def test_stream_transport_reads_the_whole_answer(bundle):
    case = bundle[0]
    port = FakePort(case.expected[0].tobytes())
    out = bundle.run(hil.stream_transport(port, bundle), case)
    assert port.written == case.input_bytes()
    assert hil.compare_to_golden(list(out), bundle, case).ok


def test_stream_transport_short_answer(bundle):
    port = FakePort(b"\x01")
    with pytest.raises(AssertionError, match="1 of 3 output bytes"):
        hil.stream_transport(port, bundle)(bundle[0].input_bytes())


def test_command_transport_through_files(bundle, tmp_path):
    # The "device" is a program that reads the input file and writes the expected answer.
    script = tmp_path / "dev.py"
    script.write_text(
        "import sys\n"
        "data = open(sys.argv[1], 'rb').read()\n"
        "open(sys.argv[2], 'wb').write(data[:3])\n"
    )
    transport = hil.command_transport(
        [sys.executable, str(script), "{input}", "{output}"], input_file=tmp_path / "in.bin", output_file=tmp_path / "out.bin"
    )
    assert transport(b"\x07\x08\x09\x0a") == b"\x07\x08\x09"


def test_check_device_reports_each_case(bundle):
    answers = {c.input_bytes(): c.expected[0].tobytes() for c in bundle}
    results = hil.check_device(lambda data: answers[data], bundle)
    assert [r.ok for r in results] == [True, True]
    results = hil.check_device(lambda data: bytes(3), bundle)
    assert [r.ok for r in results] == [False, False]
