"""Variant names for the models ``edgedeploy compile`` imports into a run folder: short, distinct, safe as folder
names, and kept apart from the variants the folder holds already."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Mapping, Sequence


def variant_names(models: Sequence[Path]) -> list[str]:
    """A short, distinct name per model: its file name less ``_int8``; when several share a file name (the
    ``model_int8.tflite`` of every leaf of a run), the folder names tell them apart."""
    bases = [_safe_name(m.stem.removesuffix("_int8") or m.stem) for m in models]
    names: list[str] = []
    for m, base in zip(models, bases):
        if bases.count(base) > 1 and m.parent.name:
            base = _safe_name(m.parent.name if base == "model" else f"{m.parent.name}_{base}")
        name, i = base, 2
        while name in names:
            name, i = f"{base}_{i}", i + 1
        names.append(name)
    return names


def keep_apart(models: Sequence[Path], names: Sequence[str],
               earlier: Mapping[str, str | None]) -> list[tuple[str, str | None]]:
    """Names for ``models`` in a run folder that already holds the variants ``earlier`` (variant -> the file it was
    imported from; None for a leaf of ``optimize``), each with the variant it would have replaced, or None.

    A model imported before keeps its variant (a re-compile of an edited file replaces it); a model whose name is
    another model's variant of the run gets a distinct name instead of replacing it.
    """
    by_source = {src: v for v, src in earlier.items() if src}
    taken = set(earlier)
    out: list[tuple[str, str | None]] = []
    used: set[str] = set()
    for m, name in zip(models, names):
        source = str(m.resolve())
        if by_source.get(source) and by_source[source] not in used:
            name, clash = by_source[source], None
        elif name in taken and earlier.get(name) != source:
            clash = name
            base = _safe_name(f"{m.parent.name}_{name}") if m.parent.name else name
            name, i = base, 2
            while name in taken or name in used:
                name, i = f"{base}_{i}", i + 1
        else:
            clash = None
        used.add(name)
        out.append((name, clash))
    return out


def _safe_name(text: str) -> str:
    """A variant name made from a file name: characters other than letters, digits, '-' and '_' become '_'."""
    name = re.sub(r"[^A-Za-z0-9_-]", "_", text).lstrip("_-")[:56].rstrip("_-")
    return name or "model"
