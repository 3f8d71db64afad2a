"""Template files of the firmware build (package data), with ``@KEY@`` placeholders."""

from __future__ import annotations

import re
from functools import cache
from importlib import resources
from typing import Mapping

_PLACEHOLDER = re.compile(r"@([A-Z_]+)@")


@cache
def template(name: str) -> str:
    return resources.files(__package__).joinpath("templates", name).read_text(encoding="utf-8")


def fill(text: str, values: Mapping[str, str]) -> str:
    """``text`` with each ``@KEY@`` replaced by ``values[KEY]``."""
    return _PLACEHOLDER.sub(lambda m: values[m.group(1)], text)
