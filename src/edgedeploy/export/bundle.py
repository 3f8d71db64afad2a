"""Reading a firmware bundle back: its manifest checked as user input before anything uses it.

``emulate``, the HIL plugin and ``verify`` read bundles that may have been edited or handed over by someone else.
Every value that reaches C, CMake, a path or a shell is checked here again, as ``export`` checked it when it wrote
it: names are C identifiers, files are plain names inside the bundle, sections are linker section names, shapes
are small non-negative integers and types are the ones ``export`` writes.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Any

from ..errors import EdgeDeployError, InvalidInputError
from edgedeploy.core.files import read_input_bytes, read_input_text, sha256_bytes, short
from edgedeploy.core.manifest import check_recorded_file
from .conventions import _SECTION_RE, BUNDLE_MANIFEST, BUNDLE_SCHEMA, C_TYPES, check_c_name

_FILE_RE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}")
_SHA_RE = re.compile(r"[0-9a-f]{64}")
_MAX_DIMS, _MAX_ELEMENTS = 8, 1 << 28
_REEXPORT = "export the bundle again with `edgedeploy export`"


def _bad(path: Path, key: str, value: object, allowed: str) -> InvalidInputError:
    return InvalidInputError(f"{short(str(path))}: {key} is {short(repr(value), 80)}, not {allowed}", _REEXPORT)


def _file_name(path: Path, key: str, value: object, files: dict[str, Any]) -> str:
    """A plain file name inside the bundle that the manifest lists (never a path, never outside the bundle)."""
    if not isinstance(value, str) or not _FILE_RE.fullmatch(value) or ".." in value:
        raise _bad(path, key, value, "a plain file name inside the bundle")
    if value not in files:
        raise _bad(path, key, value, "a file the manifest's `files` lists")
    return value


def _check_files(path: Path, files: object) -> dict[str, Any]:
    if not isinstance(files, dict):
        raise _bad(path, "files", type(files).__name__, "a table of file names")
    for name, meta in files.items():
        if not _FILE_RE.fullmatch(name) or ".." in name:
            raise _bad(path, "a name in files", name, "a plain file name inside the bundle")
        if not isinstance(meta, dict) or not isinstance(meta.get("sha256"), str) or not _SHA_RE.fullmatch(meta["sha256"]):
            raise _bad(path, f"files.{name}.sha256", (meta or {}).get("sha256") if isinstance(meta, dict) else meta,
                       "64 lower-case hex digits")
    return files


def _check_tensors(path: Path, key: str, tensors: object) -> None:
    if not isinstance(tensors, list) or not tensors:
        raise _bad(path, key, tensors, "a list of tensors")
    for i, t in enumerate(tensors):
        where = f"{key}[{i}]"
        if not isinstance(t, dict) or not isinstance(t.get("name"), str):
            raise _bad(path, where, t, "a tensor with a name")
        shape = t.get("shape")
        if (not isinstance(shape, list) or len(shape) > _MAX_DIMS
                or not all(isinstance(d, int) and not isinstance(d, bool) and 0 <= d <= _MAX_ELEMENTS for d in shape)
                or math.prod(shape) > _MAX_ELEMENTS):
            raise _bad(path, f"{where}.shape", shape, f"at most {_MAX_DIMS} small non-negative integers")
        if t.get("dtype") not in C_TYPES:
            raise _bad(path, f"{where}.dtype", t.get("dtype"), f"one of {', '.join(C_TYPES)}")
        for q in ("scale", "zero_point"):
            v = t.get(q)
            if v is not None and not (isinstance(v, list) and all(
                    isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) for x in v)):
                raise _bad(path, f"{where}.{q}", v, "a list of finite numbers")


def read_bundle_manifest(bundle: Path | str) -> dict[str, Any]:
    """The manifest of the bundle folder ``bundle``, checked key by key (one line naming the key on a bad one)."""
    bundle = Path(bundle)
    path = bundle / BUNDLE_MANIFEST
    if not path.exists() and not path.is_symlink():
        raise InvalidInputError(f"{short(str(bundle))} is not a firmware bundle (no {BUNDLE_MANIFEST})",
                                "pass a folder written by `edgedeploy export`")
    try:
        manifest = json.loads(read_input_text(path, "bundle manifest", "manifest"))
    except ValueError as exc:
        raise InvalidInputError(f"{short(str(path))} is not valid JSON ({exc})", _REEXPORT) from None
    if not isinstance(manifest, dict) or manifest.get("schema") != BUNDLE_SCHEMA:
        raise InvalidInputError(f"{short(str(path))} is not an edgedeploy firmware bundle manifest",
                                "pass a folder written by `edgedeploy export`")
    try:
        check_c_name(manifest.get("name"))
    except EdgeDeployError:
        raise _bad(path, "name", manifest.get("name"), "a C identifier") from None
    files = _check_files(path, manifest.get("files"))
    model = manifest.get("model")
    if not isinstance(model, dict):
        raise _bad(path, "model", model, "a table")
    for key in ("c_source", "c_header"):
        _file_name(path, f"model.{key}", model.get(key), files)
    if model.get("tflite") is not None:  # the compiled model as a file (bundles exported before it lack the key)
        _file_name(path, "model.tflite", model.get("tflite"), files)
    section = model.get("section")
    if not isinstance(section, str) or not _SECTION_RE.fullmatch(section) or ".." in section:
        raise _bad(path, "model.section", section, "a linker section name (letters, digits, '_', '.', '$')")
    cpu = manifest.get("cpu_model")
    if cpu is not None:
        if not isinstance(cpu, dict):
            raise _bad(path, "cpu_model", cpu, "a table")
        for key in ("c_source", "model"):
            _file_name(path, f"cpu_model.{key}", cpu.get(key), files)
    golden = manifest.get("golden") or {}
    if not isinstance(golden, dict):
        raise _bad(path, "golden", golden, "a table")
    count = golden.get("count", 0)
    if not isinstance(count, int) or isinstance(count, bool) or not 0 <= count <= 1_000_000:
        raise _bad(path, "golden.count", count, "a count from 0 to 1,000,000")
    if count:
        _file_name(path, "golden.npz", golden.get("npz"), files)
        ref = golden.get("reference") or {}
        if not isinstance(ref, dict):
            raise _bad(path, "golden.reference", ref, "a table")
        if ref.get("model") is not None:
            _file_name(path, "golden.reference.model", ref.get("model"), files)
    _check_tensors(path, "inputs", manifest.get("inputs"))
    _check_tensors(path, "outputs", manifest.get("outputs"))
    labels = manifest.get("labels")
    if labels is not None and not (isinstance(labels, list) and all(isinstance(x, str) for x in labels)):
        raise _bad(path, "labels", labels, "a list of strings")
    return manifest


def read_bundle_file(bundle: Path | str, manifest: dict[str, Any], name: str, what: str, limit: str = "model") -> bytes:
    """The bytes of the file ``name`` of a bundle whose manifest :func:`read_bundle_manifest` checked: a regular
    file within ``limit``, holding exactly what the manifest's ``files`` table records (its sha256)."""
    path = Path(bundle) / name
    recorded = ((manifest.get("files") or {}).get(name) or {}).get("sha256")
    if recorded is None:
        raise InvalidInputError(f"{what} {name} is not listed in {short(str(Path(bundle) / BUNDLE_MANIFEST))}",
                                _REEXPORT)
    check_bundle_files(bundle, manifest, [name], what)  # the shared check, before a byte is read
    data = read_input_bytes(path, what, limit)
    if sha256_bytes(data) != recorded:  # changed between the check and the read: refused the same way
        check_bundle_files(bundle, manifest, [name], what)
        raise InvalidInputError(f"{what} {short(str(path))} changed while it was read", _REEXPORT)
    return data


def check_bundle_files(bundle: Path | str, manifest: dict[str, Any], names: Any = None,
                       what: str = "bundle file") -> None:
    """Every file of ``names`` (default: every file the checked ``manifest`` lists) as `edgedeploy export` wrote it:
    a regular file, not a link, with the sha256 (and size) the manifest's ``files`` table records; else one line
    naming the file (``what``) (:func:`edgedeploy.core.manifest.check_recorded_file`)."""
    files = manifest.get("files") or {}
    where = short(str(Path(bundle) / BUNDLE_MANIFEST))
    for name in (files if names is None else names):
        if not isinstance(name, str) or name not in files:
            raise InvalidInputError(f"{short(repr(name), 80)} is not a file {where} lists", _REEXPORT)
        size = files[name].get("bytes")
        check_recorded_file(Path(bundle) / name, files[name]["sha256"], what, where, _REEXPORT,
                            size if isinstance(size, int) and not isinstance(size, bool) else None, links=False,
                            writer="`edgedeploy export` wrote it")


def cmake_path(path: Path, what: str) -> str:
    """``path`` resolved, for a quoted CMake argument: a path holding a character CMake would read as syntax
    (a quote, a backslash, ``$``, ``;``, ``@`` or a control character) is refused, never pasted."""
    text = str(Path(path).resolve())
    if re.search(r'["\\$;@\x00-\x1f\x7f]', text):
        raise InvalidInputError(f"{what} {short(repr(text), 120)} holds a character CMake would read as syntax",
                                "move it to a path of plain characters")
    return text
