"""The generated CMake files, rendered from the templates in ``templates/``.

A template names its variable parts ``@NAME@`` (CMake's own ``configure_file`` style), which
leaves CMake's ``${...}`` syntax as it is.
"""

from __future__ import annotations

import re
from functools import cache
from importlib import resources
from typing import Mapping

from .. import __version__
from .c_files import BundleSpec

_PLACEHOLDER = re.compile(r"@([A-Z_]+)@")


@cache
def template(name: str) -> str:
    """The text of ``templates/NAME`` (package data)."""
    return resources.files(__package__).joinpath("templates", name).read_text(encoding="utf-8")


def fill(text: str, values: Mapping[str, str]) -> str:
    """``text`` with each ``@KEY@`` replaced by ``values[KEY]``; an unknown key is a programming error."""

    def sub(m: re.Match[str]) -> str:
        return values[m.group(1)]

    return _PLACEHOLDER.sub(sub, text)


def render_cmakelists(spec: BundleSpec, has_golden: bool) -> str:
    """The bundle's ``CMakeLists.txt``: ``add_subdirectory()`` gives ``edgedeploy::NAME`` (and ``NAME_golden``).

    With a CPU path (``spec.cpu``), ``NAME_cpu.c`` is part of ``edgedeploy::NAME``.
    """
    n = spec.name
    cpu = f" ${{CMAKE_CURRENT_SOURCE_DIR}}/{n}_cpu.c" if spec.cpu is not None else ""
    golden = "\n" + fill(template("CMakeLists.golden.in"), {"NAME": n}) if has_golden else ""
    note = f" and edgedeploy::{n}_golden (golden vectors)." if has_golden else "."
    return fill(
        template("CMakeLists.txt.in"), {"VERSION": __version__, "NAME": n, "GOLDEN_NOTE": note, "GOLDEN_BLOCK": golden, "CPU_SOURCE": cpu}
    )


def render_cmake_module(edgedeploy_hint: str | None = None) -> str:
    """``edgedeploy.cmake``: ``edgedeploy_add_model()`` regenerates model sources at build time."""
    hint = f' HINTS "{edgedeploy_hint}"' if edgedeploy_hint else ""
    return fill(template("edgedeploy.cmake.in"), {"VERSION": __version__, "HINTS": hint})
