"""The report document as JSON and CSV."""

from __future__ import annotations

import csv
import io
import json
from typing import Any, Mapping

from ..columns import JUDGMENT_COLUMNS, columns_of, value_columns
from .cells import judgment_text


def render_json(doc: Mapping[str, Any]) -> str:
    """The document as JSON, without the plot inputs only the HTML page uses."""
    return json.dumps({k: v for k, v in doc.items() if k != "html"}, indent=2, default=str) + "\n"


def render_csv(doc: Mapping[str, Any]) -> str:
    """One line per row; numbers exactly as in the JSON, unavailable cells empty and explained in the last column."""
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow([c.key for c in columns_of(doc)] + ["unavailable"])
    for row in doc["rows"]:
        line: list[Any] = [row["leaf"], row.get("target") or "", "" if row.get("level") is None else row["level"]]
        missing = []
        for c in value_columns(doc["rows"]):
            cell = row["values"][c.key]
            v = cell.get("value")
            line.append("" if v is None else repr(v) if isinstance(v, float) else v)
            if v is None:
                missing.append(f"{c.key}: {cell.get('unavailable', 'not recorded')}")
        line += [judgment_text(row, c.key) for c in JUDGMENT_COLUMNS]
        line.append("; ".join(missing))
        writer.writerow(line)
    return buf.getvalue()
