"""A folder with one subfolder per class (Keras' ``image_dataset_from_directory`` convention), of images or WAV files.

Labels are the class folders' names in sorted order. With ``train/`` and ``test/`` (or ``validation/``)
subfolders, each holding the class folders, those are the fine-tune and evaluation splits; otherwise a seeded,
stratified choice of each class's files is held out for evaluation, and the manifest records every file's split.
Files are listed in sorted order (subfolders of a class folder included); hidden files and files of other types
are left out and counted. A linked folder that leads back to the data folder or one above it (``loop -> .``) is
skipped with a warning: followed, it would be a class holding every other class's files.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import InvalidInputError
from .samples import EVAL, FIT, stratified_split

IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png", ".bmp", ".gif")
AUDIO_SUFFIXES = (".wav",)
FIT_FOLDER = "train"
EVAL_FOLDERS = ("test", "validation")  # the first one present evaluates

log = logging.getLogger("edgedeploy")


@dataclass
class Listing:
    root: Path
    kind: str  # "image" or "audio"
    labels: list[str]
    files: list[str]  # relative to root, with "/" separators
    y: np.ndarray  # class index per file
    split: np.ndarray  # 0 fine-tune, 1 evaluate per file
    split_from: str  # how the split was made, in words
    left_out: int  # hidden files and files of other types
    links_skipped: list[str]  # linked folders that lead back to the data folder (relative to root)

    def describe(self) -> dict[str, Any]:
        counts = {name: {"fine_tune": int(np.sum((self.y == i) & (self.split == FIT))),
                         "evaluation": int(np.sum((self.y == i) & (self.split == EVAL)))}
                  for i, name in enumerate(self.labels)}
        return {"folder": str(self.root.resolve()), "kind": self.kind, "labels": self.labels,
                "labels_from": "class folder names, sorted", "split_from": self.split_from,
                "per_class": counts, "files_left_out": self.left_out,
                **({"links_skipped": self.links_skipped} if self.links_skipped else {})}


def _loops(path: Path, root: Path) -> bool:
    """``path`` is a link that leads to ``root`` or a folder above it (walking it would walk ``root`` again)."""
    if not path.is_symlink():
        return False
    target, top = os.path.realpath(path), os.path.realpath(root)
    return top == target or top.startswith(target.rstrip(os.sep) + os.sep)


def _subfolders(path: Path, root: Path, skipped: list[str]) -> list[str]:
    """The visible subfolders of ``path`` in sorted order, less links that loop back to ``root`` (appended to
    ``skipped``, each with a warning)."""
    try:
        entries = sorted((e.name, e.is_dir(follow_symlinks=True)) for e in os.scandir(path))
    except OSError as exc:
        raise InvalidInputError(f"data folder {path} cannot be listed ({exc.strerror or type(exc).__name__})",
                                "give a readable folder") from None
    names = []
    for name, is_dir in entries:
        if not is_dir or name.startswith("."):
            continue
        if _loops(path / name, root):
            rel = (path / name).relative_to(root).as_posix()
            if rel not in skipped:
                skipped.append(rel)
                log.warning("data folder %s: skipped %s, a link back to the data folder (%s -> %s)", root, rel,
                            rel, os.readlink(path / name))
            continue
        names.append(name)
    return names


def _class_files(folder: Path) -> tuple[list[Path], int]:
    """Every file under ``folder`` with a known suffix, sorted, and how many others were left out."""
    found: list[Path] = []
    left_out = 0
    for dirpath, dirnames, filenames in os.walk(folder):
        dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
        for name in sorted(filenames):
            if name.startswith(".") or not name.lower().endswith(IMAGE_SUFFIXES + AUDIO_SUFFIXES):
                left_out += 1
                continue
            found.append(Path(dirpath) / name)
    return sorted(found), left_out


def _scan(root: Path, base: Path, skipped: list[str]) -> tuple[dict[str, list[Path]], int]:
    classes: dict[str, list[Path]] = {}
    names = _subfolders(base, root, skipped)
    left_out = sum(1 for e in os.scandir(base) if e.is_file())
    for name in names:
        classes[name], n = _class_files(base / name)
        left_out += n
    if not classes:
        raise InvalidInputError(f"data folder {base} has no class subfolders",
                                "put each class's files in a subfolder named after the class")
    empty = [name for name, files in classes.items() if not files]
    if empty:
        raise InvalidInputError(f"data folder {base}: class{'es' if len(empty) > 1 else ''} "
                                f"{', '.join(empty)} {'have' if len(empty) > 1 else 'has'} no samples",
                                f"add image or WAV files, or remove the folder{'s' if len(empty) > 1 else ''}")
    return classes, left_out


def _kind(root: Path, files: list[Path]) -> str:
    images = [f for f in files if f.name.lower().endswith(IMAGE_SUFFIXES)]
    audio = [f for f in files if f.name.lower().endswith(AUDIO_SUFFIXES)]
    if images and audio:
        raise InvalidInputError(f"data folder {root} holds both images ({images[0]}) and WAV files ({audio[0]})",
                                "keep one kind of sample per data folder")
    return "image" if images else "audio"


def list_folder(root: Path, eval_fraction: float, seed: int) -> Listing:
    """The files of a class folder, their labels and splits (see the module's docstring)."""
    root = Path(root)
    skipped: list[str] = []
    subs = _subfolders(root, root, skipped)
    eval_name = next((e for e in EVAL_FOLDERS if e in subs), None)
    if FIT_FOLDER in subs and eval_name:
        fit, left_fit = _scan(root, root / FIT_FOLDER, skipped)
        ev, left_eval = _scan(root, root / eval_name, skipped)
        unknown = sorted(set(ev) - set(fit))
        if unknown:
            raise InvalidInputError(f"data folder {root / eval_name}: class{'es' if len(unknown) > 1 else ''} "
                                    f"{', '.join(unknown)} {'have' if len(unknown) > 1 else 'has'} no samples in "
                                    f"{root / FIT_FOLDER}", "give every class fine-tune samples")
        labels = sorted(fit)
        rows = [(f, labels.index(c), FIT) for c in labels for f in fit[c]]
        rows += [(f, labels.index(c), EVAL) for c in sorted(ev) for f in ev[c]]
        files = [f for f, _, _ in rows]
        y = np.array([c for _, c, _ in rows], dtype=np.int64)
        split = np.array([s for _, _, s in rows], dtype=np.int8)
        split_from = f"the folders {FIT_FOLDER}/ (fine-tune) and {eval_name}/ (evaluation)"
        left_out = left_fit + left_eval
    else:
        classes, left_out = _scan(root, root, skipped)
        labels = sorted(classes)
        files = [f for c in labels for f in classes[c]]
        y = np.array([labels.index(c) for c in labels for _ in classes[c]], dtype=np.int64)
        _kind(root, files)
        split = stratified_split(y, eval_fraction, seed)
        if not np.any(split == EVAL):
            raise InvalidInputError(f"data folder {root}: too few files to hold any out for evaluation",
                                    "give each class at least two files, or train/ and test/ subfolders")
        split_from = f"a seeded stratified choice of {eval_fraction:g} of each class (seed {seed})"
    return Listing(root, _kind(root, files), labels, [f.relative_to(root).as_posix() for f in files], y, split,
                   split_from, left_out, skipped)
