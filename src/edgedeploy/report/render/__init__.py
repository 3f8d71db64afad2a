"""Rendering a report document: a pure function of the document, one module per format.

Each format's module is imported when it is first used, so a command that prints one table (the
compile table of :mod:`.tables`) does not load the HTML or Markdown renderers.
"""

from __future__ import annotations

from typing import Any, Mapping

from edgedeploy.core.lazy import lazy_exports
from ..columns import SWEEP_REPORT_SCHEMA

FORMATS = ("table", "json", "csv", "markdown", "html")

# Renderer name -> its module.
_RENDERERS = {"render_json": ".json_csv", "render_csv": ".json_csv", "render_markdown": ".markdown", "render_html": ".html",
              "render_table": ".text"}
_BY_FORMAT = {"json": "render_json", "csv": "render_csv", "markdown": "render_markdown", "html": "render_html",
              "table": "render_table"}

__all__ = ["FORMATS", "render", *sorted(_RENDERERS)]


__getattr__ = lazy_exports(__name__, _RENDERERS)


def render(doc: Mapping[str, Any], fmt: str, width: int = 200) -> str:
    if doc.get("schema") == SWEEP_REPORT_SCHEMA:  # several models' runs side by side
        from .sweep_formats import render_sweep

        return render_sweep(doc, fmt, width)
    if fmt not in _BY_FORMAT:
        raise ValueError(fmt)
    renderer = __getattr__(_BY_FORMAT[fmt])
    return renderer(doc, width) if fmt == "table" else renderer(doc)
