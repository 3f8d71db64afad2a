"""The output folder: what an earlier export left there, and the atomic write of a bundle."""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping

from ..errors import UsageError
from ..fsutil import LOCK_NAME, lock_run_dir, new_staging_dir
from .common import BUNDLE_MANIFEST, BUNDLE_SCHEMA


@dataclass
class OutDirState:
    path: Path
    exists: bool
    owned: set[str] = field(default_factory=set)  # files an earlier export wrote
    foreign: list[str] = field(default_factory=list)  # entries edgedeploy did not write


def lock_out_dir(out: Path) -> None:
    """Hold ``out``'s lock (the run folder's kind) until this process ends: a second export into the same folder
    waits for the first and says so, so two bundles never interleave. Creates ``out`` when absent."""
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise UsageError(f"--out {out} is a file", "pass a folder path for the firmware bundle")
    try:
        lock_run_dir(out)
    except OSError as exc:
        raise UsageError(f"--out {out} cannot be written ({exc.strerror})",
                         "check the path and its permissions") from exc


def inspect_out_dir(out: Path) -> OutDirState:
    """What is already in ``out``: files an earlier export recorded as its own, and anything else."""
    out = Path(out)
    if not out.exists():
        return OutDirState(out, False)
    if not out.is_dir():
        raise UsageError(f"--out {out} is a file", "pass a folder path for the firmware bundle")
    owned: set[str] = set()
    manifest_path = out / BUNDLE_MANIFEST
    if manifest_path.is_file():
        try:
            data = json.loads(manifest_path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            data = {}
        if isinstance(data, dict) and data.get("schema") == BUNDLE_SCHEMA:
            owned = {BUNDLE_MANIFEST} | {str(f) for f in (data.get("files") or {})}
    foreign = sorted(p.name for p in out.iterdir()
                     if p.name != LOCK_NAME and (p.name not in owned or not p.is_file()))
    return OutDirState(out, True, owned & {p.name for p in out.iterdir()}, foreign)


def _refuse_foreign(out: Path, state: OutDirState, force: bool) -> None:
    if state.foreign and not force:
        shown = ", ".join(state.foreign[:5]) + (f" and {len(state.foreign) - 5} more" if len(state.foreign) > 5 else "")
        raise UsageError(
            f"--out {out} holds files edgedeploy did not write ({shown})",
            "pass an empty or new folder, or --force to write beside them (they are left as they are)",
        )


def _write_bundle(out: Path, files: Mapping[str, bytes], state: OutDirState, force: bool) -> None:
    """Write ``files`` (manifest.json last) into ``out`` through a staging folder.

    File by file, not by renaming the folder: ``out`` holds the lock the next export waits on.
    """
    _refuse_foreign(out, state, force)
    clash = sorted(set(state.foreign) & set(files))
    if clash:
        raise UsageError(
            f"--out {out} holds {', '.join(clash)}, which edgedeploy did not write and would overwrite",
            "move those files away, or choose another --out or --name",
        )
    staged = new_staging_dir(out)
    try:
        for name, data in files.items():
            (staged / name).write_bytes(data)
        out.mkdir(parents=True, exist_ok=True)
        for name in [n for n in files if n != BUNDLE_MANIFEST] + [BUNDLE_MANIFEST]:
            os.replace(staged / name, out / name)
        for stale in sorted(state.owned - set(files)):
            if (out / stale).is_file() and not (out / stale).is_symlink():
                (out / stale).unlink(missing_ok=True)
    finally:
        shutil.rmtree(staged, ignore_errors=True)
