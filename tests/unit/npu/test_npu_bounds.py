"""Declared sizes of a compiled leaf bounded before the NPU model allocates or computes anything: recorded Vela
output with one size rewritten, refused in one line naming the file, the operation and the registers."""

from __future__ import annotations

import re
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from edgedeploy.errors import InvalidInputError, NpuModelError, UsageError
from edgedeploy.npu.bounds import KERNEL_POSITIONS, leaf_cost
from edgedeploy.npu.commands import OPERATIONS_LIMIT, decode
from edgedeploy.npu.leaf_layout import Tensor, read_leaf
from edgedeploy.npu.machine import run
from helpers import PAYLOAD32, set_registers

DATA = Path(__file__).resolve().parents[2] / "data" / "npu"


@pytest.fixture(scope="module")
def dscnn():
    return read_leaf(DATA / "dscnn_u55_128_vela.npz")


def _set(leaf, *settings: tuple[int, int]):
    """``leaf`` with the first setting of each register (a cmd0 code, or PAYLOAD32 | a cmd1 code) given a value."""
    return replace(leaf, commands=tuple(set_registers(leaf.commands, settings)))


def _io(leaf, **changes):
    return replace(leaf, inputs=(replace(leaf.inputs[0], **changes),))


HOSTILE = {
    "a 65,536-deep OFM": (lambda l: _set(l, (0x113, 0xFFFF)),
                          r"operation 1 \(CONV, word 82\): OFM is 25x5x65536 8-bit elements \(8,192,000 bytes; "
                          r"OFM_HEIGHT_M1, OFM_WIDTH_M1, OFM_DEPTH_M1\), more than region 1 holds"),
    "a 65,536-deep IFM": (lambda l: _set(l, (0x104, 0xFFFF)),
                          r"operation 1 \(CONV, word 82\): IFM is 49x10x65536 8-bit elements .*KERNEL_STRIDE"),
    "zero strides, 1024x1024 output": (
        lambda l: _set(l, (PAYLOAD32 | 0x04, 0), (PAYLOAD32 | 0x05, 0), (PAYLOAD32 | 0x14, 0),
                       (PAYLOAD32 | 0x15, 0), (0x112, 1023), (0x111, 1023)),
        r"operation 1 \(CONV, word 82\): OFM is 1024x1024x16 8-bit elements"),
    "a 1024x1024 kernel": (lambda l: _set(l, (0x121, 1023), (0x120, 1023)),
                           r"a 1024x1024 kernel \(KERNEL_HEIGHT_M1, KERNEL_WIDTH_M1\) has 1,048,576 positions"),
    "padding of 65,535": (lambda l: _set(l, (0x100, 0xFFFF), (0x103, 0xFFFF)),
                          r"operation 1 \(CONV, word 82\): the padding \(IFM_PAD_\*\) leaves no input"),
    "a 2**31-byte scratch": (lambda l: replace(l, scratch_size=2**31),
                             r"the scratch tensor declares 2,147,483,648 bytes \(.*\), over the NPU model's "
                             r"memory limit"),
    "a 2**40-byte fast scratch": (lambda l: replace(l, scratch_fast_size=2**40), r"the fast scratch tensor declares"),
    "a negative scratch": (lambda l: replace(l, scratch_size=-16), r"the scratch tensor declares -16 bytes$"),
    "an input at offset 2**31": (lambda l: _io(l, address=2**31),
                                 r"input 'input0' at arena offset 2,147,483,648 ends at 2,147,484,138, over"),
    "an input at a negative offset": (lambda l: _io(l, address=-4), r"input 'input0' at arena offset -4"),
    "an input of negative shape": (lambda l: _io(l, shape=(1, -49, 10, 1)),
                                   r"input 'input0' declares shape \[1, -49, 10, 1\]"),
}


@pytest.mark.parametrize("case", list(HOSTILE))
def test_declared_sizes_are_refused_before_use(dscnn, case):
    change, message = HOSTILE[case]
    leaf = change(dscnn)
    t0 = time.perf_counter()
    with pytest.raises(NpuModelError, match=message) as caught:
        leaf_cost(leaf, decode(leaf.commands))
    assert str(caught.value).startswith(str(DATA / "dscnn_u55_128_vela.npz"))
    assert "\n" not in caught.value.one_line()
    with pytest.raises(NpuModelError, match=message):  # the model itself checks before it allocates a region
        run(leaf, [np.zeros((8, 1, 49, 10, 1), np.int8)])
    assert time.perf_counter() - t0 < 2


def test_the_largest_kernel_vela_admits_is_not_refused_for_its_size(dscnn):
    # a 256x256 average pool (Vela's limit) passes the kernel check; its input then exceeds the arena
    leaf = _set(dscnn, (0x121, 255), (0x120, 255))
    assert KERNEL_POSITIONS == 256 * 256
    with pytest.raises(NpuModelError, match="IFM is"):
        leaf_cost(leaf, decode(leaf.commands))


@pytest.mark.parametrize("name", ["dscnn_u55_128", "resnet8_u65_256"])
def test_recorded_leaves_fit_with_room(name):
    leaf = read_leaf(DATA / f"{name}_vela.npz")
    cost = leaf_cost(leaf, decode(leaf.commands))
    assert cost.over(100, keep_outputs=True) is None
    assert cost.max_cases(True) >= 1000  # two to four thousand at the default limits


def test_a_batch_over_the_memory_limit_is_refused_before_allocation(dscnn, monkeypatch):
    monkeypatch.setenv("EDGEDEPLOY_NPU_MEMORY_MIB", "16")
    x = np.zeros((100, 1, 49, 10, 1), np.int8)
    with pytest.raises(InvalidInputError) as caught:
        run(dscnn, [x])
    assert re.search(r"the NPU model needs about \d+ MiB for 100 cases, over the memory limit of 16 MiB. run at most "
                     r"\d+ inputs at a time", caught.value.one_line())
    monkeypatch.setenv("EDGEDEPLOY_NPU_WORK_G", "nine")
    with pytest.raises(UsageError, match="EDGEDEPLOY_NPU_WORK_G is 'nine'"):
        run(dscnn, [x[:1]])


def test_a_batch_over_the_work_limit_is_refused(dscnn, monkeypatch):
    monkeypatch.setenv("EDGEDEPLOY_NPU_WORK_G", "1")
    cost = leaf_cost(dscnn, decode(dscnn.commands))
    cases = 10**9 // cost.work + 1
    assert "over the work limit of 1,000,000,000" in cost.over(cases, keep_outputs=False)
    assert cost.over(cases - 1, keep_outputs=False) is None


def test_tensor_sizes_name_the_tensor():
    t = Tensor("x", (1, 2, 3), "int16", 1, 0)
    assert t.nbytes == 12


def test_a_stream_of_too_many_operations_is_refused_as_it_is_decoded(dscnn):
    words = list(dscnn.commands)
    first = decode(words)[0].word  # the first operation command (a DMA)
    flood = words[: first + 1] + [words[first]] * (OPERATIONS_LIMIT + 10)
    t0 = time.perf_counter()
    with pytest.raises(NpuModelError, match=f"word {first + OPERATIONS_LIMIT} starts operation 65,536, over the "
                                            "limit of 65,536 operations per stream"):
        decode(flood, "x.tflite")
    assert time.perf_counter() - t0 < 10
