"""The driver payload and command stream of recorded Vela raw output, and what a damaged stream stops with."""

from __future__ import annotations

import struct
from pathlib import Path

import numpy as np
import pytest

from edgedeploy.errors import NpuModelError
from edgedeploy.npu.commands import counts, decode
from edgedeploy.npu.leaf_layout import parse_payload, read_leaf

DATA = Path(__file__).resolve().parents[2] / "data" / "npu"


def test_dscnn_leaf_is_read_as_the_driver_sees_it():
    leaf = read_leaf(DATA / "dscnn_u55_128_vela.npz")
    assert leaf.npu == "ethos-u55-128"
    assert len(leaf.weights) == 31104
    assert 4 * len(leaf.commands) + 32 == 3664  # the payload: COP1, config, id, NOP padding, stream header
    assert leaf.inputs[0].shape == (1, 49, 10, 1) and leaf.inputs[0].dtype == "int8"
    assert leaf.outputs[0].nbytes == 12
    assert leaf.shram_bytes == 24 * 1024


def test_dscnn_stream_has_the_operations_vela_reports():
    ops = decode(read_leaf(DATA / "dscnn_u55_128_vela.npz").commands)
    # Vela's --verbose-register-command-stream for this model lists these counts
    assert counts(ops) == {"DMA": 11, "CONV": 7, "DEPTHWISE": 4, "POOL": 3, "ELEMENTWISE": 26}
    conv = next(op for op in ops if op.kind == "CONV")
    assert conv.reg("KERNEL_HEIGHT_M1") == 9 and conv.reg("KERNEL_WIDTH_M1") == 3
    assert conv.signed("IFM_ZERO_POINT") == 83


def test_u65_leaf_is_read():
    leaf = read_leaf(DATA / "resnet8_u65_256_vela.npz")
    assert leaf.npu == "ethos-u65-256"
    kinds = counts(decode(leaf.commands))
    assert kinds["CONV"] == 11 and kinds["ELEMENTWISE"] > 3


def _payload(words: list[int]) -> bytes:
    header = [int.from_bytes(b"COP1", "little"), 0x1, (1 << 28) | (24 << 8) | 7, 0, 0x5, 0x5]
    header.append(0x2 | (len(words) << 16))
    return struct.pack(f"<{len(header) + len(words)}I", *header, *words)


def test_payload_config_word_gives_product_and_macs():
    product, macs, shram, words = parse_payload(_payload([0x0]), "test")
    assert (product, macs, shram, words) == (1, 128, 24 * 1024, (0,))


@pytest.mark.parametrize("payload, message", [
    (b"XXXX" + bytes(12), "no COP1 header"),
    (_payload([0x0])[:-8] + struct.pack("<3I", 0x2 | (5 << 16), 0, 0), "truncated"),
    (b"COP1" + struct.pack("<I", 0x77), "driver action 0x77"),
])
def test_damaged_payload_stops_with_one_line(payload, message):
    with pytest.raises(NpuModelError, match=message):
        parse_payload(payload, "model.tflite")


def test_unknown_command_is_named_with_its_word():
    words = list(read_leaf(DATA / "dscnn_u55_128_vela.npz").commands)
    assert words[0] & 0xC000 == 0  # a 16-bit command
    words[0] = (words[0] & ~0x3FF) | 0x3EE  # no such command
    with pytest.raises(NpuModelError, match="word 0 is an unknown command 0x3ee"):
        decode(words)


def test_raw_npz_without_stream_is_refused(tmp_path):
    path = tmp_path / "x_vela.npz"
    np.savez(path, weight_data=np.zeros(4, np.uint8))
    from edgedeploy.errors import InvalidInputError

    with pytest.raises(InvalidInputError, match="lacks cmd_data"):
        read_leaf(path)
