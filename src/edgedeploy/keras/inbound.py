"""The tensors a layer's call reads, as a functional model's config writes them.

Each entry of a layer's ``inbound_nodes`` is one call of the layer; inside it, nested in lists and in the call's
keyword arguments, a reference to a tensor is ``[layer, node, tensor]`` or ``[layer, node, tensor, kwargs]``.
"""

from __future__ import annotations

from typing import Any


def is_ref(obj: Any) -> bool:
    """Whether ``obj`` is a reference to a tensor: ``[layer name, node index, tensor index]``, with the call's
    keyword arguments as a fourth item or without."""
    return (isinstance(obj, (list, tuple)) and len(obj) in (3, 4) and isinstance(obj[0], str)
            and isinstance(obj[1], int) and isinstance(obj[2], int))


def call_refs(node: Any) -> list[Any]:
    """The references one call (an entry of ``inbound_nodes``) reads, in order, each as the config writes it; the
    keyword arguments a reference carries are not searched."""
    found: list[Any] = []

    def walk(obj: Any) -> None:
        if is_ref(obj):
            found.append(obj)
        elif isinstance(obj, (list, tuple)):
            for v in obj:
                walk(v)
        elif isinstance(obj, dict):
            for v in obj.values():
                walk(v)

    walk(node)
    return found
