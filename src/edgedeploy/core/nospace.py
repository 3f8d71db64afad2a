"""A full disk (or a full quota), recognised wherever it shows and reported as one :class:`DiskFullError`.

A full disk shows as an ``OSError`` with ``errno`` ENOSPC or EDQUOT (often with no file name: a failed ``write``
names none), as such an error's text inside another library's exception (h5py, TensorFlow), or as a line of an
external tool's output (a compiler, CMake, Vela). Each becomes one error naming the path being written, saying
that the disk is full and that freeing space is the fix: never a failure of the model or the tool.
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
from pathlib import Path
from typing import Iterator

from edgedeploy.errors import DiskFullError

NO_SPACE_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT})
# what the C library prints for ENOSPC and EDQUOT, as tools quote it
_NO_SPACE_TEXT = re.compile(r"no space left on device|disk quota exceeded", re.IGNORECASE)
HINT = "free space on that disk (or write to a folder on another one), then run the command again"


def is_no_space(exc: BaseException | None) -> bool:
    """Whether ``exc`` (or an error it was raised from) says a disk or a quota is full."""
    seen = 0
    while exc is not None and seen < 8:
        code = getattr(exc, "errno", None)
        if code in NO_SPACE_ERRNOS or (code is None and _NO_SPACE_TEXT.search(str(exc))):
            return True
        exc, seen = exc.__cause__ or exc.__context__, seen + 1
    return False


def _quota(exc: BaseException | None) -> bool:
    return getattr(exc, "errno", None) == errno.EDQUOT or "quota" in str(exc or "").lower()


def said_no_space(text: str) -> str | None:
    """The first line of a tool's ``text`` that says a disk or a quota is full, stripped, or None. A line that ends
    in a colon is joined to the next one that holds something: CMake names the file there."""
    lines = text.splitlines()
    for i, line in enumerate(lines):
        if _NO_SPACE_TEXT.search(line):
            found = line.strip()
            if found.endswith(":"):
                following = next((ln.strip() for ln in lines[i + 1:i + 4] if ln.strip()), "")
                found = f"{found} {following}".strip()
            return found
    return None


def disk_full(path: Path | str | None, *, doing: str | None = None, detail: str | None = None,
              quota: bool = False, hint: str | None = None) -> DiskFullError:
    """The error for a write to ``path`` that found no space: ``doing`` says what wrote it (Vela, a compiler),
    ``detail`` quotes the tool's own line."""
    reason = "no space left in the disk quota" if quota else "no space left on the device"
    where = f" writing {path}" if path is not None else " writing an output of this command"
    text = reason + where + (f" ({doing})" if doing else "") + (f": {detail}" if detail else "")
    return DiskFullError(text, hint or HINT)


def no_space_error(exc: BaseException, path: Path | str | None) -> DiskFullError | None:
    """``exc`` as a :class:`DiskFullError` naming the file it names, else ``path``; None when it is no full disk."""
    if isinstance(exc, DiskFullError):
        return exc
    if not is_no_space(exc):
        return None
    # a copy's or a rename's error names its source first and the file being written second (filename2)
    named = getattr(exc, "filename2", None) or getattr(exc, "filename", None)
    return disk_full(os.fsdecode(named) if isinstance(named, (str, bytes)) else path, quota=_quota(exc))


def free_bytes(path: Path | str) -> int | None:
    """The bytes free to this user on the disk that holds ``path`` (its nearest existing folder), or None."""
    folder = Path(path)
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent
    try:
        st = os.statvfs(folder)
    except OSError:
        return None
    return st.f_bavail * st.f_frsize


def ensure_room(path: Path | str, need: int) -> None:
    """A :class:`DiskFullError` naming ``path`` unless its disk has ``need`` bytes free: for a writer that does not
    survive a full disk (HDF5), checked before it starts."""
    free = free_bytes(path)
    if free is not None and free < need:
        raise disk_full(path, detail=f"{free:,} bytes free, at least {need:,} needed")


def full_stream(fd: int = 1) -> bool:
    """Whether the file descriptor ``fd`` (standard output) writes to a full disk or to the always-full device
    ``/dev/full``: where a write error that names no file came from when the command printed its result."""
    import stat

    try:
        st = os.fstat(fd)
        if stat.S_ISCHR(st.st_mode):
            return (os.major(st.st_rdev), os.minor(st.st_rdev)) == (1, 7)  # Linux's /dev/full
        return stat.S_ISREG(st.st_mode) and os.fstatvfs(fd).f_bavail == 0
    except (OSError, AttributeError):
        return False


@contextlib.contextmanager
def writing(path: Path | str) -> Iterator[None]:
    """Within the block, a full disk is a :class:`DiskFullError` naming ``path``: the file or folder as the user
    knows it, not the temporary name it is written under."""
    try:
        yield
    except OSError as exc:
        if not is_no_space(exc):
            raise
        raise disk_full(path, quota=_quota(exc)) from None
