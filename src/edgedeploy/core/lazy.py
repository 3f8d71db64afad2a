"""Names a package exports but imports only when first used (a module ``__getattr__``, PEP 562).

A command that needs one function of a package (the compile table of the reporter, say) then does not load
the whole package, which keeps the command's start-up short.
"""

from __future__ import annotations

import importlib
import sys
from typing import Any, Callable, Mapping


def lazy_exports(package: str, exports: Mapping[str, str]) -> Callable[[str], Any]:
    """The ``__getattr__`` of ``package``: ``exports`` maps each name to the module (relative to ``package``) that
    defines it; the value is imported on first use and kept in the package."""

    def __getattr__(name: str) -> Any:
        module = exports.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(module, package), name)
        setattr(sys.modules[package], name, value)
        return value

    return __getattr__
