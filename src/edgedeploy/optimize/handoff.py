"""The Keras model a node stage saved last in this process, for the leaf stage that converts it.

In a run on one process the tree's leaf stage follows its node's. Loading the node's file again would rebuild the
same model (and, for a QAT node, its whole quantization-aware graph, then retrace it); the leaf takes the model
itself instead when the file it was given is, byte for byte, the one that model was saved to. Only one model is
kept, so a process holds at most one beyond what its stages hold; anything else loads the file as before.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

_last: tuple[str, str, Any] | None = None  # (node, sha256 of the file it saved, model)


def _sha256(path: Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def keep(node: str, saved: Path, model: Any) -> None:
    """``model`` of ``node`` was just saved to ``saved``."""
    global _last
    _last = (node, _sha256(saved), model)


def take(node: str, saved: Path) -> Any | None:
    """The model of ``node`` that was saved to a file holding ``saved``'s bytes, once; else None."""
    global _last
    if _last is None or _last[0] != node:
        return None
    _, digest, model = _last
    _last = None
    return model if digest == _sha256(saved) else None


def drop() -> None:
    """Let go of the kept model (at the end of a run)."""
    global _last
    _last = None
