"""A run's report as a Python object: shown inline by Jupyter, handed to pandas.

:class:`Report` wraps the report document (:func:`edgedeploy.report.build_report`). In a notebook it shows the
HTML report's tables and plots (:func:`edgedeploy.report.render.html.render_html`, its page styles scoped to the
cell); :meth:`Report.to_pandas` gives one row per (leaf, target) with every value column in its unit.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping

from ..errors import ToolMissingError

if TYPE_CHECKING:
    import pandas

SCOPE = "edgedeploy-report"


def _scoped_css(css: str) -> str:
    """The page's style rules, each limited to the report's own ``<div>`` (``body`` becomes the div itself)."""
    rules = []
    for selectors, body in re.findall(r"([^{}]+)\{([^{}]*)\}", css):
        scoped = []
        for sel in selectors.split(","):
            sel = sel.strip()
            if sel:
                scoped.append(f".{SCOPE}" if sel == "body" else f".{SCOPE} {sel}")
        rules.append(f"{', '.join(scoped)} {{{body}}}")
    return "\n".join(rules)


class Report:
    """The report of a run folder: leaves × targets, judgments, recommendation and plots.

    ``doc`` is the versioned report document (schema ``edgedeploy.report``), the same one ``edgedeploy report
    --json`` prints.
    """

    def __init__(self, doc: Mapping[str, Any]) -> None:
        self.doc: Mapping[str, Any] = doc

    @property
    def run_dir(self) -> Path:
        """The run folder the report reads."""
        return Path(self.doc["run_dir"])

    @property
    def recommendations(self) -> dict[str, Any]:
        """Per target: the recommended leaf (or None) and why."""
        return dict(self.doc["recommendations"])

    def html(self) -> str:
        """The whole HTML report as one self-contained page (what ``edgedeploy report -f html`` writes)."""
        from ..report.render.html import render_html

        return render_html(self.doc)

    def _repr_html_(self) -> str:
        from ..report.render.html import CSS

        page = self.html()
        body = page[page.index("<body>") + len("<body>"):page.rindex("</body>")]
        return f"<div class='{SCOPE}'><style>{_scoped_css(CSS)}</style>{body}</div>"

    def to_pandas(self) -> "pandas.DataFrame":
        """One row per (leaf, target): ``leaf``, ``target``, ``level``, ``recommended``, ``fits`` and each value
        column under its key (units in the key: ``int8_accuracy_pct``, ``compiled_model_bytes`` ...); a value that
        is unavailable is missing (NaN), its reason in the report document."""
        try:
            import pandas as pd
        except ImportError:
            raise ToolMissingError("pandas is not installed", 'pip install "edgedeploy[notebook]"') from None
        from ..report.columns import value_columns, value_of

        cols = value_columns(self.doc["rows"])
        records = []
        for row in self.doc["rows"]:
            rec: dict[str, Any] = {"leaf": row["leaf"], "target": row["target"], "level": row.get("level"),
                                   "recommended": bool(row.get("recommended")),
                                   "fits": (row.get("fit") or {}).get("fits")}
            for c in cols:
                rec[c.key] = value_of(row["values"].get(c.key))
            records.append(rec)
        frame = pd.DataFrame.from_records(records, columns=["leaf", "target", "level", "recommended", "fits",
                                                             *(c.key for c in cols)])
        frame.attrs["units"] = {c.key: c.unit for c in cols}
        frame.attrs["run_dir"] = str(self.run_dir)
        return frame

    def __repr__(self) -> str:
        rec = ", ".join(f"{t}: {r.get('leaf') or 'none'}" for t, r in self.doc["recommendations"].items())
        return (f"<edgedeploy Report of {self.doc['run_dir']}: {len(self.doc['rows'])} rows"
                + (f"; recommended {rec}" if rec else "") + ">")
