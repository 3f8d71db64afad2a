"""Judging saved results: leaves × targets, requirements, recommendation, regressions.

The reporter reads only a run's manifest and the files it names; it never runs a tool.
It works in three steps, one module (or package) each:

- :mod:`.collect` (with :mod:`.compression` and :mod:`.stage_weights`) gathers facts from the
  manifest into one row of values per (leaf, target);
- :mod:`.judge` adds judgments (fits the board, Pareto front, meets the requirements, recommended
  leaf) and :mod:`.regressions` compares with a report written earlier;
- :mod:`.render` turns the resulting document into a table, JSON, CSV, Markdown or HTML, as a pure
  function of the document, so all formats show the same numbers.

:func:`.build.build_report` runs collect -> judge and returns the versioned JSON document.
"""

from __future__ import annotations

from .build import build_report
from .collect import int8_model_path
from .columns import ALL_COLUMNS, JUDGMENT_COLUMNS, KEY_COLUMNS, SCHEMA, SCHEMA_VERSION, VALUE_COLUMNS, Column
from .compression import weight_diagnostics
from .judge import pareto_front, unmet_targets
from .limits import (
    DEFAULT_TOLERANCES,
    Requirements,
    Tolerance,
    parse_size,
    parse_tolerances,
    requirements_from_project,
)
from .regressions import compare_reports, load_report_json, raise_on_regression
from .tree import LEAF_LEVELS, PALETTE_LIMIT, REFERENCE_LEAF, base_leaf, is_clustered_leaf, leaf_level

__all__ = [
    "ALL_COLUMNS", "DEFAULT_TOLERANCES", "JUDGMENT_COLUMNS", "KEY_COLUMNS", "LEAF_LEVELS", "PALETTE_LIMIT",
    "REFERENCE_LEAF", "SCHEMA", "SCHEMA_VERSION", "VALUE_COLUMNS", "Column", "Requirements", "Tolerance",
    "base_leaf", "build_report", "compare_reports", "int8_model_path", "is_clustered_leaf", "leaf_level",
    "load_report_json", "parse_size", "parse_tolerances", "pareto_front", "raise_on_regression",
    "requirements_from_project", "unmet_targets", "weight_diagnostics",
]
