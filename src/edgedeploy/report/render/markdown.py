"""The report document as Markdown."""

from __future__ import annotations

from typing import Any, Mapping, Sequence

from ..columns import shown_columns
from .walk import walk_lines
from .cells import COMPRESSION_HEADERS, _comparison_lines, _compression_rows, _req_text, cell_text, Footnotes


def _md_escape(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _md_table(headers: Sequence[str], rows: Sequence[Sequence[str]], right: Sequence[bool]) -> list[str]:
    out = ["| " + " | ".join(_md_escape(h) for h in headers) + " |",
           "|" + "|".join("---:" if r else ":---" for r in right) + "|"]
    out += ["| " + " | ".join(_md_escape(c) for c in row) + " |" for row in rows]
    return out


def render_markdown(doc: Mapping[str, Any]) -> str:
    notes = Footnotes()
    lines = [f"# edgedeploy report: {doc['run_dir']}", ""]
    lines.append(f"Manifest `{doc['manifest']['path']}` (sha256 `{doc['manifest']['sha256'][:16]}…`), "
                 f"edgedeploy {doc['edgedeploy_version']}, "
                 + ", ".join(f"{k} {v}" for k, v in doc["tools"].items()) + f", written {doc['created']}.")
    lines += ["", "## Requirements", ""] + [f"- {t}" for t in _req_text(doc)]
    lines += ["", "## Recommendation", ""]
    lines += [f"- {r['message']}" for r in doc["recommendations"].values()] or ["- no target compiled"]
    if doc.get("walk"):
        lines += ["", "## Walk", ""] + [f"- {line}" for line in walk_lines(doc["walk"])]
    lines += ["", "## Results", ""]
    cols = shown_columns(doc)
    lines += _md_table([c.header for c in cols], [[cell_text(r, c, notes) for c in cols] for r in doc["rows"]],
                       [c.kind != "text" for c in cols])
    lines += ["", "## Pareto front (per target)", ""]
    for t, p in doc["pareto"].items():
        lines.append(f"- {t}: {', '.join(p['front']) or 'none'} ({p['note']})")
    lines += ["", "## Compression diagnostics", ""]
    comp = _compression_rows(doc)
    if comp:
        lines += _md_table([h for _, h in COMPRESSION_HEADERS],
                           [[r[k] for k, _ in COMPRESSION_HEADERS] for r in comp],
                           [False, False, True, True, True, True, False])
    else:
        lines.append("- not computed")
    cmp_lines = _comparison_lines(doc)
    if cmp_lines:
        lines += ["", "## Comparison", ""] + [f"- {t}" for t in cmp_lines]
    lines += ["", "## Notes", ""] + [f"- {n}" for n in doc["notes"]]
    if notes.reasons:
        lines += ["", "## Unavailable values", ""]
        lines += [f"- [{i}] unavailable: {r}" for i, r in enumerate(notes.reasons, 1)]
    return "\n".join(lines) + "\n"
