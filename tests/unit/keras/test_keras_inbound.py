"""The tensors a layer's call reads in a functional model's config (keras/inbound.py), as tf_keras writes them."""

from __future__ import annotations

import pytest

from edgedeploy.keras.inbound import call_refs, is_ref


@pytest.mark.parametrize("node, refs", [
    pytest.param([["conv", 0, 0, {}]], [["conv", 0, 0, {}]], id="one tensor"),
    pytest.param([["a", 0, 0, {}], ["b", 1, 0, {}]], [["a", 0, 0, {}], ["b", 1, 0, {}]], id="two tensors in order"),
    pytest.param([["x", 0, 0]], [["x", 0, 0]], id="no keyword arguments"),
    pytest.param([["x", 0, 0, {"y": 2.0, "name": None}]], [["x", 0, 0, {"y": 2.0, "name": None}]],
                 id="a scalar operand stays in the reference's arguments"),
    pytest.param([["x", 0, 0, {"mask": ["m", 0, 0]}]], [["x", 0, 0, {"mask": ["m", 0, 0]}]],
                 id="a reference's own arguments are not searched"),
    pytest.param({"args": [[["a", 0, 0], ["b", 0, 1]]]}, [["a", 0, 0], ["b", 0, 1]],
                 id="inside lists and mappings"),
    pytest.param([("a", 0, 0)], [("a", 0, 0)], id="a tuple"),
    pytest.param([[1, 2, 3], ["a", "0", 0], ["a", 0]], [], id="no reference: numbers, a text index, two items"),
])
def test_the_references_of_one_call_in_order(node, refs):
    assert call_refs(node) == refs


@pytest.mark.parametrize("obj, ref", [
    (["a", 0, 0], True), (["a", 0, 0, {}], True), (("a", 1, 2), True),
    (["a", 0, 0, {}, 5], False), (["a", 0], False), ([0, 0, 0], False), (["a", 0.0, 0], False), ("a00", False),
])
def test_a_reference_is_a_layer_a_node_and_a_tensor(obj, ref):
    assert is_ref(obj) is ref
