"""File helpers: hashing and all-or-nothing writes.

Outputs are written under a temporary name and renamed when complete, so an
interrupted run never leaves a half-written artifact behind.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import logging
import os
import shutil
import stat
import tempfile
from pathlib import Path
from typing import Any

from edgedeploy.errors import InvalidInputError, UsageError
from edgedeploy.core.nospace import writing


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
    """Write ``data`` to ``path`` all or nothing, with the mode a plain ``open`` would give (0644 under umask 022).

    Inside a run folder this process holds, the temporary file lies in that folder's scratch folder, which the
    next command cleans after a kill; elsewhere it lies beside ``path``. A ``path`` that is a link is written
    through (the link stays a link); one that is a device, FIFO or socket (``/dev/stdout``) is written to as a
    stream, never replaced. A full disk is a :class:`~edgedeploy.errors.DiskFullError` naming ``path``, and leaves
    nothing behind.
    """
    path = Path(path)
    with writing(path):
        _atomic_write(path, data)


def _atomic_write(path: Path, data: bytes) -> None:
    try:
        st = os.stat(path)
    except (FileNotFoundError, NotADirectoryError):
        st = None
    if st is not None and not stat.S_ISREG(st.st_mode) and not stat.S_ISDIR(st.st_mode):
        _write_stream(path, data)
        return
    real = Path(os.path.realpath(path))  # a link to a file: write the file it names, keep the link
    real.parent.mkdir(parents=True, exist_ok=True)
    run = _held_run_of(real)
    folder = scratch_dir(Path(run)) if run is not None else real.parent
    fd, tmp = tempfile.mkstemp(prefix=f".{real.name}.", suffix=".part", dir=folder)
    try:
        with os.fdopen(fd, "wb") as fh:
            os.fchmod(fh.fileno(), 0o666 & ~current_umask())  # mkstemp makes it 0600
            fh.write(data)
        os.replace(tmp, real)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def _write_stream(path: Path, data: bytes) -> None:
    """Write to a device, FIFO or socket path as a stream (nothing to rename over it). A FIFO nobody reads is one
    error, not a command that waits forever."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_NONBLOCK | getattr(os, "O_NOCTTY", 0))
    except OSError as exc:
        if exc.errno in (errno.ENXIO, errno.EAGAIN):
            raise UsageError(f"{short(str(path))} is a FIFO that nothing reads", "start its reader first") from None
        raise
    os.set_blocking(fd, True)
    with os.fdopen(fd, "wb") as fh:
        fh.write(data)
        fh.flush()  # here, not at the close, so that a full device (/dev/full) is an error of this call


def atomic_write_text(path: Path, text: str) -> None:
    atomic_write_bytes(path, text.encode("utf-8"))


LOCK_NAME = ".edgedeploy.lock"
# A run (or bundle) folder's own scratch folder: every staging folder, temporary file and replaced stage folder
# of a command lies here while it is written. It is made by edgedeploy with SCRATCH_MARK inside, and only what is
# inside a marked scratch folder is ever removed as a leftover: never a file because of the shape of its name.
SCRATCH = ".edgedeploy-tmp"
SCRATCH_MARK = ".edgedeploy-scratch"
# Written into every stage folder edgedeploy makes: a stage folder is replaced only when it holds this mark, so a
# user's folder that happens to sit where a stage would go is never deleted.
STAGE_MARK = ".edgedeploy-stage"
_MARK_TEXT = "made by edgedeploy; removed by it\n"
_held: dict[str, Any] = {}
_owner_pid = os.getpid()


def _held_run_of(path: Path) -> str | None:
    """The innermost run folder this process holds that contains ``path`` (a resolved path), if any."""
    text = str(path)
    found = [k for k in _held if text == k or text.startswith(k.rstrip(os.sep) + os.sep)]
    return max(found, key=len) if found else None


def scratch_dir(root: Path) -> Path:
    """``root``'s scratch folder, made (with its mark) when absent. One that edgedeploy did not make (no mark, or a
    link, or a file) is refused, never written into or emptied. On a full disk, what was made here is removed."""
    folder = Path(root) / SCRATCH
    mark = folder / SCRATCH_MARK
    if not os.path.lexists(folder):
        made = False
        try:
            with writing(root):
                with contextlib.suppress(FileExistsError):
                    os.mkdir(folder, 0o777 & ~current_umask())
                    made = True
                if not os.path.lexists(mark):
                    with open(mark, "w", encoding="utf-8") as fh:
                        fh.write(_MARK_TEXT)
        except BaseException:
            if made:
                shutil.rmtree(folder, ignore_errors=True)
            raise
    if folder.is_symlink() or not folder.is_dir() or not mark.is_file():
        raise UsageError(f"{short(str(folder))} exists and edgedeploy did not make it",
                         "move it away: edgedeploy keeps its temporary files in a folder of that name")
    return folder


def new_staging_dir(final: Path, root: Path | None = None) -> Path:
    """A fresh staging folder for the stage folder ``final``, in the scratch folder of ``root``: by default the run
    folder being written (the innermost one this process holds that contains ``final``, else ``final``'s parent).
    It is marked as a stage folder edgedeploy made."""
    final = Path(final)
    if root is None:
        real = Path(os.path.realpath(final))
        run = _held_run_of(real)
        root = Path(run) if run is not None else real.parent
    with writing(root):
        root.mkdir(parents=True, exist_ok=True)
    scratch = scratch_dir(root)
    tmp = None
    try:
        with writing(root):  # a full disk names the folder being written, not the scratch name
            tmp = Path(tempfile.mkdtemp(prefix=f"{final.name}.", suffix=".part", dir=scratch))
            os.chmod(tmp, 0o777 & ~current_umask())  # mkdtemp makes it 0700; renamed into place as it is
            with open(tmp / STAGE_MARK, "w", encoding="utf-8") as fh:
                fh.write(_MARK_TEXT)
    except BaseException:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
        with contextlib.suppress(OSError):
            remove_empty_scratch(root)
        raise
    return tmp


def clear_staging_dir(tmp: Path) -> None:
    """Empty a staging folder from :func:`new_staging_dir` for a fresh try, keeping its mark."""
    for entry in os.scandir(tmp):
        if entry.name == STAGE_MARK:
            continue
        if entry.is_dir(follow_symlinks=False):
            shutil.rmtree(entry.path)
        else:
            os.unlink(entry.path)


def promote(tmp: Path, final: Path) -> None:
    """Replace ``final`` with the finished staging folder ``tmp`` (from :func:`new_staging_dir` for ``final``).

    An existing ``final`` is replaced only when edgedeploy made it (it holds the stage mark); anything else there
    (a user's folder, a link, a file) is refused and left as it is.
    """
    tmp, final = Path(tmp), Path(final)
    scratch = tmp.parent
    root = scratch.parent
    real_root = os.path.realpath(root)
    real_final = os.path.realpath(final.parent)
    if (scratch.name != SCRATCH or final.name in ("", ".", "..") or not tmp.name.startswith(f"{final.name}.")
            or not (real_final == real_root or real_final.startswith(real_root.rstrip(os.sep) + os.sep))):
        raise ValueError(f"promote: {tmp} is not a staging folder for {final}")
    if os.path.lexists(final):
        ours = not final.is_symlink() and final.is_dir() and os.path.isfile(os.path.join(final, STAGE_MARK))
        if not ours:
            raise UsageError(f"{short(str(final))} exists and edgedeploy did not write it",
                             "move it away, or choose another output folder; edgedeploy replaces only its own folders")
        with writing(final):
            old = Path(tempfile.mkdtemp(prefix=f"{final.name}.", suffix=".old", dir=scratch))
        os.replace(final, old / final.name)
        try:
            os.replace(tmp, final)
        except BaseException:  # the earlier folder goes back: a failed replacement keeps the last good output
            os.replace(old / final.name, final)
            os.rmdir(old)
            raise
        shutil.rmtree(old, ignore_errors=True)
    else:
        with writing(final):
            final.parent.mkdir(parents=True, exist_ok=True)
        os.replace(tmp, final)


_SYSTEM_TMP: str | None = None
PRIVATE_TMP_ENV = "EDGEDEPLOY_PRIVATE_TMP"


def use_private_tmp() -> str:
    """Send this process's temporary files (TensorFlow's generated code among them) to a private folder that is
    removed when the process ends, and tell worker processes to use it too (:func:`join_private_tmp`). What a
    command keeps for the user on purpose goes to :func:`system_tmp` instead."""
    global _SYSTEM_TMP
    if _SYSTEM_TMP is not None:
        return tempfile.gettempdir()
    _SYSTEM_TMP = tempfile.gettempdir()
    folder = tempfile.mkdtemp(prefix="edgedeploy-", dir=_SYSTEM_TMP)
    tempfile.tempdir = folder
    os.environ[PRIVATE_TMP_ENV] = folder
    owner = os.getpid()
    import atexit

    def remove() -> None:  # (a forked child leaves the folder to the process that made it)
        if os.getpid() == owner:
            shutil.rmtree(folder, ignore_errors=True)

    atexit.register(remove)
    return folder


def join_private_tmp() -> None:
    """In a worker process: put its temporary files in the command's private folder, when it has one."""
    folder = os.environ.get(PRIVATE_TMP_ENV)
    if folder and os.path.isdir(folder):
        tempfile.tempdir = folder


def system_tmp() -> str:
    """The system's temporary folder, for files a command leaves for the user (logs an error names)."""
    return _SYSTEM_TMP or tempfile.gettempdir()


_discarded: list[bool] = []


def discard_scratch() -> None:
    """Empty the scratch folders of every run folder this process holds (an interrupted command: the stage in
    progress leaves nothing behind). A worker process may still be writing into a staging folder for a moment, so
    the folders are emptied again when the process ends."""
    import time

    _discarded.append(True)
    for attempt in range(40):  # a worker writing its last files into a staging folder is done within ~2 s
        for key in list(_held):
            with contextlib.suppress(OSError):
                _empty_scratch(Path(key))
        if all(_scratch_is_empty(Path(key)) for key in _held):
            return
        time.sleep(0.05)


def prepare_lock() -> None:
    """Load the locking library now (a few milliseconds), while something else runs, rather than when
    :func:`lock_run_dir` is first called."""
    import filelock  # noqa: F401


def lock_run_dir(run_dir: Path, log: logging.Logger | None = None) -> None:
    """Hold the run folder's lock until this process ends; a second command waits for it and says so.

    While the lock is held no other edgedeploy process writes the folder, so what a killed command left in the
    folder's scratch folder (staging folders, temporary files, replaced stage folders) is removed here: a re-run
    then completes the folder. Nothing outside the scratch folder is removed.
    """
    from filelock import FileLock, Timeout

    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    key = os.path.realpath(run_dir)
    if key in _held:
        return
    lock = FileLock(os.path.join(key, LOCK_NAME), mode=0o666 & ~current_umask())
    try:
        lock.acquire(timeout=0)
    except Timeout:
        (log or logging.getLogger("edgedeploy")).warning(
            "%s is being written by another edgedeploy command; waiting for it to finish", run_dir)
        lock.acquire()
    if not _held:
        _register_tidy()
    _held[key] = lock
    _empty_scratch(Path(key))


def release_run_dirs() -> None:
    """Let go of every run folder this process locked (the end of a command; tests call it between tests), first
    removing their scratch folders where they are empty."""
    while _held:
        key, lock = _held.popitem()
        remove_empty_scratch(Path(key))
        lock.release(force=True)


def _register_tidy() -> None:
    global _owner_pid
    _owner_pid = os.getpid()
    import atexit

    atexit.register(_tidy_at_exit)


def _tidy_at_exit() -> None:
    if os.getpid() == _owner_pid:  # never in a forked worker: the folders are its parent's
        for key in list(_held):
            with contextlib.suppress(OSError):
                if _discarded:
                    _empty_scratch(Path(key))
                remove_empty_scratch(Path(key))


def _marked_scratch(root: Path) -> Path | None:
    folder = root / SCRATCH
    if folder.is_symlink() or not folder.is_dir() or not (folder / SCRATCH_MARK).is_file():
        return None
    return folder


def _empty_scratch(root: Path) -> None:
    """Remove what a killed command left in ``root``'s scratch folder (only a folder edgedeploy made and marked)."""
    folder = _marked_scratch(root)
    if folder is None:
        return
    for entry in os.scandir(folder):
        if entry.name == SCRATCH_MARK:
            continue
        if entry.is_dir(follow_symlinks=False):
            shutil.rmtree(entry.path, ignore_errors=True)
        else:
            with contextlib.suppress(OSError):
                os.unlink(entry.path)


def _scratch_is_empty(root: Path) -> bool:
    folder = _marked_scratch(root)
    return folder is None or {e.name for e in os.scandir(folder)} <= {SCRATCH_MARK}


def remove_empty_scratch(root: Path) -> None:
    """Remove ``root``'s scratch folder when nothing but its mark is left (the end of a command's writing)."""
    folder = _marked_scratch(root)
    if folder is not None and _scratch_is_empty(root):
        os.unlink(folder / SCRATCH_MARK)
        with contextlib.suppress(OSError):
            os.rmdir(folder)


# Size limits of what edgedeploy reads (docs/files.md lists them). A flatbuffer cannot exceed 2 GiB.
MIB = 1 << 20
LIMITS = {
    "settings": 4 * MIB,     # project, recipe and target TOML files
    "manifest": 64 * MIB,    # a run's or a bundle's manifest.json, a --compare file
    "model": 2048 * MIB,     # .tflite, .h5, .keras
    "data": 8192 * MIB,      # .npz data files
    "text": 16 * MIB,        # logs and other text read back
}


def _limit_bytes(limit: str | int) -> int:
    return LIMITS[limit] if isinstance(limit, str) else int(limit)


def check_input_file(path: Path | str, what: str, limit: str | int = "settings") -> Path:
    """``path`` as a regular file of at most ``limit`` bytes (a key of :data:`LIMITS` or a number), checked before
    anything opens it: a FIFO, socket or device file, a folder, a missing file or an oversized one is one
    :class:`InvalidInputError` naming the file and the fix (a link to a regular file is followed)."""
    path = Path(path)
    max_bytes = _limit_bytes(limit)
    shown = short(str(path))
    try:
        st = os.stat(path)
    except FileNotFoundError:
        raise InvalidInputError(f"{what} {shown} does not exist", "check the path") from None
    except OSError as exc:
        raise InvalidInputError(f"cannot read {what} {shown} ({exc.strerror})", "check the path and its permissions"
                                ) from None
    if stat.S_ISDIR(st.st_mode):
        raise InvalidInputError(f"{what} {shown} is a folder, not a file", "pass the file itself")
    if not stat.S_ISREG(st.st_mode):
        kind = ("a FIFO" if stat.S_ISFIFO(st.st_mode) else "a socket" if stat.S_ISSOCK(st.st_mode)
                else "a device file" if stat.S_ISCHR(st.st_mode) or stat.S_ISBLK(st.st_mode) else "not a regular file")
        raise InvalidInputError(f"{what} {shown} is {kind}, not a regular file", "pass a regular file")
    if st.st_size > max_bytes:
        raise InvalidInputError(f"{what} {shown} is {st.st_size:,} bytes, over the limit of {max_bytes:,}",
                                "see 'Size limits' in docs/files.md")
    return path


def read_input_bytes(path: Path | str, what: str, limit: str | int = "settings") -> bytes:
    """The bytes of a checked input file (:func:`check_input_file`), never more than its limit even if it grows."""
    path = check_input_file(path, what, limit)
    max_bytes = _limit_bytes(limit)
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_NOCTTY", 0))
    with os.fdopen(fd, "rb") as fh:
        if not stat.S_ISREG(os.fstat(fh.fileno()).st_mode):  # swapped between the check and the open
            raise InvalidInputError(f"{what} {short(str(path))} is not a regular file", "pass a regular file")
        data = fh.read(max_bytes + 1)
    if len(data) > max_bytes:
        raise InvalidInputError(f"{what} {short(str(path))} is over the limit of {max_bytes:,} bytes",
                                "see 'Size limits' in docs/files.md")
    return data


def read_input_text(path: Path | str, what: str, limit: str | int = "settings") -> str:
    """The UTF-8 text of a checked input file; text that is not UTF-8 is one error naming the file."""
    data = read_input_bytes(path, what, limit)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InvalidInputError(f"{what} {short(str(path))} is not UTF-8 text (byte {exc.start})",
                                "save it as UTF-8") from None


SHORT_LIMIT = 160


def short(text: str, limit: int = SHORT_LIMIT) -> str:
    """``text`` shortened in the middle to at most ``limit`` characters, for error lines."""
    text = str(text)
    if len(text) <= limit:
        return text
    keep = limit - 3
    return f"{text[:keep - keep // 2]}...{text[-(keep // 2):]}"
