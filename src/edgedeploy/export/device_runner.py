"""The device runner every bundle ships: C sources that answer framed requests over a byte stream.

The files (``templates/runner/``) are the same for every model: the firmware's glue passes the
model's hash, sizes and invoke function in an ``edr_config``. ``edgedeploy_frame.[ch]`` is the
codec (sync bytes, length, CRC-32), ``edgedeploy_runner.[ch]`` the request loop, and
``edgedeploy_runner_an547.[ch]`` the board support for the MPS3 AN547 (QEMU's ``mps3-an547``).
The bundle's ``CMakeLists.txt`` gives them as ``edgedeploy::runner`` and ``edgedeploy::runner_an547``.
"""

from __future__ import annotations

from functools import cache
from importlib import resources
from typing import Any

from ..errors import UsageError

FILES = (
    "edgedeploy_frame.h",
    "edgedeploy_frame.c",
    "edgedeploy_runner.h",
    "edgedeploy_runner.c",
    "edgedeploy_runner_an547.h",
    "edgedeploy_runner_an547.c",
)
PROTOCOL_VERSION = 1
_STEMS = frozenset(f.rsplit(".", 1)[0] for f in FILES)


@cache
def runner_files() -> dict[str, bytes]:
    """File name -> bytes, as they go into the bundle."""
    folder = resources.files(__package__).joinpath("templates", "runner")
    return {name: folder.joinpath(name).read_bytes() for name in FILES}


def check_bundle_name(name: str) -> None:
    """A bundle named like a runner file would overwrite it (``NAME.c``, ``NAME.h``)."""
    if name in _STEMS or name.startswith("edgedeploy_runner"):
        raise UsageError(f"--name {name!r} is the name of a file of the device runner the bundle ships", "choose another name")


def runner_manifest() -> dict[str, Any]:
    """The manifest's ``runner`` entry."""
    return {
        "protocol_version": PROTOCOL_VERSION,
        "sources": [f for f in FILES if f.endswith(".c")],
        "headers": [f for f in FILES if f.endswith(".h")],
        "cmake": {"library": "edgedeploy::runner", "board_an547": "edgedeploy::runner_an547"},
        "crc": "CRC-32 (IEEE 802.3, zlib)",
    }
