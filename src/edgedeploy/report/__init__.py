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

from edgedeploy.core.lazy import lazy_exports

# Name -> the module that defines it. Imported when first used, so a command that needs one table
# (the compile table, say) does not load every part of the reporter.
_EXPORTS = {
    "build_report": ".build",
    "int8_model_path": ".collect",
    "ALL_COLUMNS": ".columns",
    "JUDGMENT_COLUMNS": ".columns",
    "KEY_COLUMNS": ".columns",
    "SCHEMA": ".columns",
    "SCHEMA_VERSION": ".columns",
    "VALUE_COLUMNS": ".columns",
    "Column": ".columns",
    "weight_diagnostics": ".compression",
    "pareto_front": ".judge",
    "unmet_targets": ".judge",
    "DEFAULT_TOLERANCES": ".limits",
    "Requirements": ".limits",
    "Tolerance": ".limits",
    "parse_size": ".limits",
    "parse_tolerances": ".limits",
    "requirements_from_project": ".limits",
    "requirements_from_table": ".limits",
    "compare_reports": ".regressions",
    "load_report_json": ".regressions",
    "raise_on_regression": ".regressions",
    "LEAF_LEVELS": ".levels",
    "PALETTE_LIMIT": ".levels",
    "REFERENCE_LEAF": ".levels",
    "base_leaf": ".levels",
    "is_clustered_leaf": ".levels",
    "leaf_level": ".levels",
}

__all__ = sorted(_EXPORTS)


__getattr__ = lazy_exports(__name__, _EXPORTS)
