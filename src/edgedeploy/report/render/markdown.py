"""The report document as Markdown."""

from __future__ import annotations

import html
from typing import Any, Mapping, Sequence

from ..columns import shown_columns
from .walk_text import walk_lines
from ..node_times import TIME_HEADERS, TIME_NOTE, time_rows
from .cells import COMPRESSION_HEADERS, _comparison_lines, _compression_rows, _req_text, cell_text, Footnotes


def md_text(text: Any) -> str:
    """``text`` (a name, a warning, a path from a run folder) as Markdown that shows it and runs nothing: raw HTML
    (``<script>``, ``<img onerror=...>``) escaped as the HTML report escapes it, on one line."""
    return html.escape(str(text), quote=False).replace("\r", " ").replace("\n", " ")


def md_code(text: Any) -> str:
    """``text`` inside a code span: a backtick would close the span early, so it becomes a quote."""
    return md_text(text).replace("`", "'")


def _md_escape(text: str) -> str:
    return md_text(text).replace("|", "\\|")


def _md_table(headers: Sequence[str], rows: Sequence[Sequence[str]], right: Sequence[bool]) -> list[str]:
    out = ["| " + " | ".join(_md_escape(h) for h in headers) + " |",
           "|" + "|".join("---:" if r else ":---" for r in right) + "|"]
    out += ["| " + " | ".join(_md_escape(c) for c in row) + " |" for row in rows]
    return out


def render_markdown(doc: Mapping[str, Any]) -> str:
    notes = Footnotes()
    lines = [f"# edgedeploy report: {md_text(doc['run_dir'])}", ""]
    lines.append(f"Manifest `{md_code(doc['manifest']['path'])}` (sha256 `{md_code(doc['manifest']['sha256'][:16])}…`), "
                 f"edgedeploy {md_text(doc['edgedeploy_version'])}, "
                 + ", ".join(f"{md_text(k)} {md_text(v)}" for k, v in doc["tools"].items())
                 + f", written {md_text(doc['created'])}.")
    lines += ["", "## Requirements", ""] + [f"- {md_text(t)}" for t in _req_text(doc)]
    lines += ["", "## Recommendation", ""]
    lines += [f"- {md_text(r['message'])}" for r in doc["recommendations"].values()] or ["- no target compiled"]
    if doc.get("walk"):
        lines += ["", "## Walk", ""] + [f"- {md_text(line)}" for line in walk_lines(doc["walk"])]
    lines += ["", "## Results", ""]
    cols = shown_columns(doc)
    lines += _md_table([c.header for c in cols], [[cell_text(r, c, notes) for c in cols] for r in doc["rows"]],
                       [c.kind != "text" for c in cols])
    lines += ["", "## Pareto front (per target)", ""]
    for t, p in doc["pareto"].items():
        lines.append(f"- {md_text(t)}: {md_text(', '.join(p['front']) or 'none')} ({md_text(p['note'])})")
    lines += ["", "## Compression diagnostics", ""]
    comp = _compression_rows(doc)
    if comp:
        lines += _md_table([h for _, h in COMPRESSION_HEADERS],
                           [[r[k] for k, _ in COMPRESSION_HEADERS] for r in comp],
                           [False, False, True, True, True, True, False])
    else:
        lines.append("- not computed")
    times = time_rows(doc)
    if times:
        lines += ["", "## Time by step of each node", "", md_text(TIME_NOTE), ""]
        lines += _md_table(TIME_HEADERS, times, [False, False, True, True, True, True])
    cmp_lines = _comparison_lines(doc)
    if cmp_lines:
        lines += ["", "## Comparison", ""] + [f"- {md_text(t)}" for t in cmp_lines]
    lines += ["", "## Notes", ""] + [f"- {md_text(n)}" for n in doc["notes"]]
    if notes.reasons:
        lines += ["", "## Unavailable values", ""]
        lines += [f"- [{i}] unavailable: {md_text(r)}" for i, r in enumerate(notes.reasons, 1)]
    return "\n".join(lines) + "\n"
