"""Names, constants and checks every part of the export shares."""

from __future__ import annotations

import re

from ..errors import UsageError
from edgedeploy.core.names import C_KEYWORDS


BUNDLE_SCHEMA = "edgedeploy.firmware"
BUNDLE_SCHEMA_VERSION = 1
BUNDLE_MANIFEST = "manifest.json"
GOLDEN_NPZ = "golden.npz"

MODEL_ALIGNMENT = 16  # Ethos-U reads the command stream and weights from 16-byte aligned addresses
ARENA_ALIGNMENT = 16
DEFAULT_SECTION = ".rodata.nn_model"
DEFAULT_RUNTIME_MARGIN = 16 * 1024
DEFAULT_GOLDEN = 8
TFLM_PACKAGE = "tflite-micro"
TFLM_PIN = "tflite-micro==0.dev20261023182759"
HOST_ARENA_MIN = 8 * 1024 * 1024

_C_KEYWORDS = frozenset(
    "auto break case char const continue default do double else enum extern float for goto if inline int long "
    "register restrict return short signed sizeof static struct switch typedef union unsigned void volatile while "
    "bool true false alignas alignof asm class namespace template this typename virtual new delete".split()
)
_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,62}$")
_SECTION_RE = re.compile(r"^[.A-Za-z_$][A-Za-z0-9_.$]{0,127}$")

# TFLite tensor type -> (C element type, numpy dtype name)
C_TYPES = {
    "int8": ("int8_t", "int8"),
    "uint8": ("uint8_t", "uint8"),
    "int16": ("int16_t", "int16"),
    "int32": ("int32_t", "int32"),
    "float32": ("float", "float32"),
    "bool": ("uint8_t", "bool"),
}


def check_c_name(name: object) -> str:
    """``name`` if it is a usable C identifier prefix, else a :class:`UsageError`."""
    if not isinstance(name, str) or not _NAME_RE.fullmatch(name) or name in _C_KEYWORDS or name in C_KEYWORDS:
        raise UsageError(
            f"--name {name!r} is not a C identifier (or is a C keyword)",
            "use letters, digits and underscores, starting with a letter (at most 63 characters)",
        )
    if name.startswith("_"):
        # C reserves identifiers that begin with '_' at file scope, where NAME_model[] and the macros live
        raise UsageError(f"--name {name!r} begins with '_', which C reserves for the compiler and its library",
                         "start the name with a letter")
    return name


def default_name(leaf: str) -> str:
    """A C identifier from a leaf name; the same rule as CMake's ``string(MAKE_C_IDENTIFIER)``."""
    name = re.sub(r"[^A-Za-z0-9_]", "_", leaf) or "model"
    if not name[0].isalpha() or name in _C_KEYWORDS or name in C_KEYWORDS:  # a variant named 9abc, _x or int
        name = "m_" + name.lstrip("_")
    return name[:63]


def check_section(section: str) -> str:
    if not isinstance(section, str) or not _SECTION_RE.fullmatch(section) or ".." in section:
        raise UsageError(
            f"--section {section!r} is not a valid linker section name",
            "use letters, digits, '_', '.' and '$', e.g. nn_model or .rodata.nn_model",
        )
    return section
