"""File helpers: hashing and all-or-nothing writes.

Outputs are written under a temporary name and renamed when complete, so an
interrupted run never leaves a half-written artifact behind.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import re
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


def current_umask() -> int:
    """The process's umask, read without changing it where Linux allows."""
    try:
        with open("/proc/self/status", encoding="ascii") as fh:
            for line in fh:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` all or nothing, with the mode a plain ``open`` would give (0644 under umask 022)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".part", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            os.fchmod(fh.fileno(), 0o666 & ~current_umask())  # mkstemp makes it 0600
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
    tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.", suffix=".part", dir=final.parent))
    os.chmod(tmp, 0o777 & ~current_umask())  # mkdtemp makes it 0700; the folder is renamed into place as it is
    return tmp


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


LOCK_NAME = ".edgedeploy.lock"
_held: dict[str, Any] = {}
# what tempfile.mkstemp/mkdtemp (8 random characters) and promote name their temporary files and folders
_STALE = re.compile(r"\..+\.(?:[A-Za-z0-9_]{8}\.part|old\d+)")
_STAGE_DEPTH = 3  # stage/variant/target


def prepare_lock() -> None:
    """Load the locking library now (a few milliseconds), while something else runs, rather than when
    :func:`lock_run_dir` is first called."""
    import filelock  # noqa: F401


def lock_run_dir(run_dir: Path, log: logging.Logger | None = None) -> None:
    """Hold the run folder's lock until this process ends; a second command waits for it and says so.

    While the lock is held no other edgedeploy process writes the folder, so the staging folders left by a
    killed run (``.NAME.XXXX.part``, ``.NAME.oldPID``) are removed here from a folder an edgedeploy command
    wrote before (it holds the lock file, or a manifest): a re-run then completes the folder, even one killed
    before its first stage was recorded.
    """
    from filelock import FileLock, Timeout

    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    key = os.path.realpath(run_dir)
    if key in _held:
        return
    # a folder an earlier edgedeploy command wrote: it left its lock file (and a manifest once a stage ended)
    ours = os.path.exists(os.path.join(key, LOCK_NAME)) or os.path.isfile(os.path.join(key, "manifest.json"))
    lock = FileLock(os.path.join(key, LOCK_NAME), mode=0o666 & ~current_umask())
    try:
        lock.acquire(timeout=0)
    except Timeout:
        (log or logging.getLogger("edgedeploy")).warning(
            "%s is being written by another edgedeploy command; waiting for it to finish", run_dir)
        lock.acquire()
    _held[key] = lock
    if ours:
        _remove_stale_staging(Path(key))


def release_run_dirs() -> None:
    """Let go of every run folder this process locked (the end of a command; tests call it between tests)."""
    while _held:
        _, lock = _held.popitem()
        lock.release(force=True)


def _remove_stale_staging(run_dir: Path) -> None:
    """Remove what a killed edgedeploy left in its own run folder: temporary files and staging folders beside
    the manifest and the stage folders, nothing deeper and nothing else."""
    for folder, dirs, files in os.walk(run_dir):
        depth = len(Path(folder).relative_to(run_dir).parts)
        for name in [d for d in dirs if _STALE.fullmatch(d)]:
            shutil.rmtree(os.path.join(folder, name), ignore_errors=True)
            dirs.remove(name)
        for name in files:
            if _STALE.fullmatch(name) and not os.path.islink(os.path.join(folder, name)):
                with contextlib.suppress(OSError):
                    os.unlink(os.path.join(folder, name))
        if depth >= _STAGE_DEPTH - 1:
            dirs.clear()
