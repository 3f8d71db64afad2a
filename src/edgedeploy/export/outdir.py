"""The output folder: what an earlier export left there, and the atomic write of a bundle."""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping

from ..errors import UsageError
from ..errors import EdgeDeployError
from edgedeploy.core.files import (
    LOCK_NAME,
    SCRATCH,
    new_staging_dir,
    read_input_text,
    remove_empty_scratch,
    sha256_file,
)
from edgedeploy.core.nospace import writing
from edgedeploy.core.stage import lock_output, place_staged
from .conventions import BUNDLE_MANIFEST, BUNDLE_SCHEMA


@dataclass
class OutDirState:
    path: Path
    exists: bool
    owned: set[str] = field(default_factory=set)  # files an earlier export wrote
    foreign: list[str] = field(default_factory=list)  # entries edgedeploy did not write


def lock_out_dir(out: Path) -> None:
    """Hold ``out``'s lock (the run folder's kind, :func:`~edgedeploy.core.stage.lock_output`) until this process
    ends: a second export into the same folder waits for the first and says so, so two bundles never interleave.
    Creates ``out`` when absent."""
    out = Path(out)
    lock_output(out, f"--out {out}", "pass a folder path for the firmware bundle")


def inspect_out_dir(out: Path) -> OutDirState:
    """What is already in ``out``: files an earlier export recorded as its own, and anything else."""
    out = Path(out)
    if not out.exists():
        return OutDirState(out, False)
    if not out.is_dir():
        raise UsageError(f"--out {out} is a file", "pass a folder path for the firmware bundle")
    owned = _owned_files(out)
    foreign = sorted(p.name for p in out.iterdir() if p.name not in (LOCK_NAME, SCRATCH) and p.name not in owned)
    return OutDirState(out, True, owned, foreign)


def _owned_files(out: Path) -> set[str]:
    """The files of ``out`` an earlier export wrote: named in its bundle manifest and still holding the bytes the
    manifest records (a regular file, not a link). A manifest that merely names a file does not make it ours."""
    manifest_path = out / BUNDLE_MANIFEST
    if manifest_path.is_symlink() or not manifest_path.is_file():
        return set()
    try:
        data = json.loads(read_input_text(manifest_path, "bundle manifest", "manifest"))
    except (EdgeDeployError, ValueError):
        return set()
    files = data.get("files") if isinstance(data, dict) and data.get("schema") == BUNDLE_SCHEMA else None
    if not isinstance(files, dict):
        return set()
    owned = {BUNDLE_MANIFEST}
    for name, meta in files.items():
        path = out / str(name)
        if (not isinstance(name, str) or "/" in name or name in ("", ".", "..", BUNDLE_MANIFEST)
                or not isinstance(meta, dict) or path.is_symlink() or not path.is_file()):
            continue
        try:
            if sha256_file(path) == meta.get("sha256"):
                owned.add(name)
        except OSError:
            continue
    return owned


def _refuse_foreign(out: Path, state: OutDirState, force: bool) -> None:
    if state.foreign and not force:
        shown = ", ".join(state.foreign[:5]) + (f" and {len(state.foreign) - 5} more" if len(state.foreign) > 5 else "")
        raise UsageError(
            f"--out {out} holds files edgedeploy did not write ({shown})",
            "pass an empty or new folder, or --force to write beside them (they are left as they are)",
        )


def _write_bundle(out: Path, files: Mapping[str, bytes], state: OutDirState, force: bool) -> None:
    """Write ``files`` (manifest.json last) into ``out`` through a staging folder, on the stage lifecycle's
    :func:`~edgedeploy.core.stage.place_staged`.

    File by file, not by renaming the folder: ``out`` holds the lock the next export waits on. Every file is
    written in full before the first is moved into place, so a full disk leaves the earlier bundle as it was (and
    no staging folder); its :class:`~edgedeploy.errors.DiskFullError` names the file being written.
    """
    _refuse_foreign(out, state, force)
    clash = sorted(set(state.foreign) & set(files))
    if clash:
        raise UsageError(
            f"--out {out} holds {', '.join(clash)}, which edgedeploy did not write and would overwrite",
            "move those files away, or choose another --out or --name",
        )
    with writing(out):
        out.mkdir(parents=True, exist_ok=True)

    def work() -> None:
        for name, data in files.items():
            with writing(out / name):
                (staged / name).write_bytes(data)

    def place(staged: Path) -> None:
        out.mkdir(parents=True, exist_ok=True)
        for name in [n for n in files if n != BUNDLE_MANIFEST] + [BUNDLE_MANIFEST]:
            os.replace(staged / name, out / name)
        for stale in sorted(state.owned - set(files)):
            if (out / stale).is_file() and not (out / stale).is_symlink():
                (out / stale).unlink(missing_ok=True)
        shutil.rmtree(staged, ignore_errors=True)

    try:
        staged = new_staging_dir(out / "bundle", root=out)  # inside --out, never beside it
        place_staged(staged, out, work, place)
    finally:
        remove_empty_scratch(out)
