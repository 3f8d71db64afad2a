"""The Keras model a node stage saved last in this process, for the leaf stage that converts it.

In a run on one process the tree's leaf stage follows its node's. Loading the node's file again would rebuild the
same model (and, for a QAT node, its whole quantization-aware graph, then retrace it); the leaf takes the model
itself instead when the file it was given is the very file that model was saved to: the same inode (the stage's
folder is renamed into place), size and modification time. Only one model is kept, so a process holds at most one
beyond what its stages hold; anything else loads the file as before.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

_last: tuple[str, tuple[int, ...], Any] | None = None  # (node, identity of the file it saved, model)


def _identity(path: Path) -> tuple[int, ...]:
    st = os.stat(path)
    return st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns


def keep(node: str, saved: Path, model: Any) -> None:
    """``model`` of ``node`` was just saved to ``saved``."""
    global _last
    _last = (node, _identity(saved), model)


def take(node: str, saved: Path) -> Any | None:
    """The model of ``node`` that was saved to the file ``saved`` (unchanged since), once; else None."""
    global _last
    if _last is None or _last[0] != node:
        return None
    _, identity, model = _last
    _last = None
    try:
        return model if identity == _identity(saved) else None
    except OSError:  # (the leaf's own load says what is wrong with the file)
        return None


def drop() -> None:
    """Let go of the kept model (at the end of a run)."""
    global _last
    _last = None
