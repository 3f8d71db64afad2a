"""File helpers: hashing and all-or-nothing writes.

Outputs are written under a temporary name and renamed when complete, so an
interrupted run never leaves a half-written artifact behind.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any, Iterator


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def sha256_json(obj: Any) -> str:
    return sha256_bytes(json.dumps(obj, sort_keys=True, separators=(",", ":"), default=str).encode())


def atomic_write_bytes(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".part", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def atomic_write_text(path: Path, text: str) -> None:
    atomic_write_bytes(path, text.encode("utf-8"))


def atomic_write_json(path: Path, obj: Any) -> None:
    atomic_write_text(path, json.dumps(obj, indent=2, sort_keys=False, default=str) + "\n")


@contextlib.contextmanager
def staging_dir(final: Path) -> Iterator[Path]:
    """Yield a fresh temporary folder beside ``final``; on success it replaces ``final``.

    ``final`` is only ever a folder that edgedeploy itself created for one
    stage's outputs, so replacing it never deletes user files.
    """
    tmp = new_staging_dir(final)
    try:
        yield tmp
        promote(tmp, final)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def new_staging_dir(final: Path) -> Path:
    """A fresh, hidden temporary folder beside ``final``."""
    final.parent.mkdir(parents=True, exist_ok=True)
    return Path(tempfile.mkdtemp(prefix=f".{final.name}.", suffix=".part", dir=final.parent))


def promote(tmp: Path, final: Path) -> None:
    """Replace ``final`` (a folder edgedeploy wrote earlier, if any) with the finished ``tmp``.

    Only ever inside one folder: ``tmp`` must be a staging folder beside ``final``, and a ``final`` that is a
    link is replaced as a link (what it points at is never touched).
    """
    tmp, final = Path(tmp), Path(final)
    if (os.path.realpath(tmp.parent) != os.path.realpath(final.parent) or final.name in ("", ".", "..")
            or not tmp.name.startswith(f".{final.name}.")):
        raise ValueError(f"promote: {tmp} is not a staging folder beside {final}")
    if final.is_symlink():
        final.unlink()
    if final.exists():
        old = final.with_name(f".{final.name}.old{os.getpid()}")
        os.replace(final, old)
        os.replace(tmp, final)
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.replace(tmp, final)
