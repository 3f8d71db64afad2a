"""Rendering a report document: a pure function of the document, one module per format."""

from __future__ import annotations

from typing import Any, Mapping

from .data import render_csv, render_json
from .html import render_html
from .markdown import render_markdown
from .text import render_table


FORMATS = ("table", "json", "csv", "markdown", "html")


def render(doc: Mapping[str, Any], fmt: str, width: int = 200) -> str:
    if doc.get("schema") == "edgedeploy.sweep_report":  # several models' runs side by side
        from .sweep import render_sweep

        return render_sweep(doc, fmt, width)
    if fmt == "json":
        return render_json(doc)
    if fmt == "csv":
        return render_csv(doc)
    if fmt == "markdown":
        return render_markdown(doc)
    if fmt == "html":
        return render_html(doc)
    if fmt == "table":
        return render_table(doc, width)
    raise ValueError(fmt)
