"""A real full disk for tests: a small tmpfs mounted for one test, filled to leave a chosen number of bytes.

Writes then fail as they do on a full disk (``ENOSPC``), in this process, in a worker process and in any program a
test starts. Mounting needs root (CAP_SYS_ADMIN); elsewhere the tests that use it are skipped with that reason. The
mount is the test's own (under its ``tmp_path``) and is unmounted when the test ends, pass or fail.

Use it as a fixture: ``from fulldisk import small_disk`` in a test module, then a ``small_disk`` argument.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
from pathlib import Path

import pytest

DISK_BYTES = 4 << 20  # a tmpfs of 4 MiB: room for a run folder of the bundled DS-CNN and its firmware bundle
FILL_NAME = ".fill"


class SmallDisk:
    """A mounted tmpfs at :attr:`path`; :meth:`fill` leaves a chosen number of bytes free."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def free(self) -> int:
        st = os.statvfs(self.path)
        return st.f_bavail * st.f_frsize

    def fill(self, leave: int) -> int:
        """Take all the free space but ``leave`` bytes (rounded down to whole pages) with one file; returns what is
        free then."""
        filler = self.path / FILL_NAME
        filler.unlink(missing_ok=True)
        take = self.free() - leave
        if take > 0:
            fd = os.open(filler, os.O_CREAT | os.O_WRONLY, 0o600)
            try:
                os.posix_fallocate(fd, 0, take)
            finally:
                os.close(fd)
        return self.free()

    def empty(self) -> None:
        """Give the filled space back."""
        (self.path / FILL_NAME).unlink(missing_ok=True)


@pytest.fixture
def small_disk(tmp_path):
    mount = tmp_path / "small-disk"
    mount.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={DISK_BYTES},mode=0755", "tmpfs", str(mount)],
                          capture_output=True, text=True)
    if done.returncode != 0:
        pytest.skip("a real full disk needs a small tmpfs, and mounting one needs root (CAP_SYS_ADMIN): "
                    + (done.stderr.strip() or f"mount exited {done.returncode}"))
    try:
        yield SmallDisk(mount)
    finally:
        subprocess.run(["umount", "-l", str(mount)], capture_output=True)


def tree_digest(root: Path) -> dict[str, str]:
    """Every file under ``root`` (relative path -> sha256), to check that a failed command changed nothing."""
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file() and p.name != FILL_NAME}


def leftovers(root: Path) -> list[str]:
    """What a failed command left behind under ``root``: scratch folders, staging folders, temporary files."""
    return sorted(str(p.relative_to(root)) for p in root.rglob("*")
                  if p.name == ".edgedeploy-tmp" or p.name.endswith((".part", ".old")))
