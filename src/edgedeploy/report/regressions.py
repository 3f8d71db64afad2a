"""The regression gate: compare a report with one written earlier."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Mapping

from ..errors import InvalidInputError, RegressionError, UsageError
from edgedeploy.core.files import read_input_text, short
from edgedeploy.core.units import fmt_in_unit
from .columns import SCHEMA, SCHEMA_VERSION, SWEEP_REPORT_SCHEMA, value_of
from .judge import leaf_rank
from .limits import GATED, Tolerance


def load_report_json(path: Path) -> dict[str, Any]:
    import json

    path = Path(path)
    try:  # a regular file of bounded size: a FIFO or /dev/zero never blocks or fills memory
        data = json.loads(read_input_text(path, "reference report", "manifest"))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise InvalidInputError(f"{path} is not valid JSON ({exc})", "pass a report written with --format json") from exc
    except RecursionError:
        raise InvalidInputError(f"{path} is nested too deeply to be a report", "pass a report written with "
                                "--format json") from None
    if not isinstance(data, dict) or data.get("schema") != SCHEMA:
        raise InvalidInputError(f"{path} is not an edgedeploy report (schema {SCHEMA})",
                                "write one with `edgedeploy report RUN_DIR --format json --out FILE`")
    if not isinstance(data.get("schema_version"), int) or data["schema_version"] > SCHEMA_VERSION:
        raise InvalidInputError(
            f"{path} has report schema version {data.get('schema_version')}, which this edgedeploy does not "
            f"understand (it reads {SCHEMA_VERSION})",
            "upgrade edgedeploy or write the reference report again",
        )
    if not isinstance(data.get("rows"), list):
        raise InvalidInputError(f"{path} has no rows", "write the reference report again")
    check_report_rows(data["rows"], str(path))
    return data


def check_report_rows(rows: Any, where: str) -> None:
    """The rows of a reference report as the gate reads them, checked like any input: each a table with a
    ``leaf`` name, a ``target`` name or null, and ``values`` whose gated cells are tables holding a finite number,
    null or nothing. A hand-made row that breaks this is one :class:`InvalidInputError` naming it."""
    hint = "write the reference report again with `edgedeploy report RUN --format json --out FILE`"

    def bad(i: int, what: str) -> InvalidInputError:
        return InvalidInputError(f"{where}: row {i} {what}", hint)

    if not isinstance(rows, list):
        raise InvalidInputError(f"{where}: `rows` is not a list", hint)
    for i, row in enumerate(rows):
        if not isinstance(row, dict):
            raise bad(i, f"is {type(row).__name__}, not a table")
        if not isinstance(row.get("leaf"), str) or not row["leaf"]:
            raise bad(i, "has no leaf name")
        if row.get("target") is not None and not isinstance(row["target"], str):
            raise bad(i, f"has target {short(repr(row['target']), 40)}, not a name")
        values = row.get("values", {})
        if not isinstance(values, dict):
            raise bad(i, "has `values` that are not a table")
        for vkey, *_ in GATED.values():
            cell = values.get(vkey)
            if cell is None:
                continue
            if not isinstance(cell, dict):
                raise bad(i, f"value {vkey} is {short(repr(cell), 40)}, not a table with a `value`")
            v = cell.get("value")
            if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float)) or abs(v) > 2**63
                                  or not math.isfinite(v)):
                raise bad(i, f"value {vkey} is {short(repr(v), 40)}, not a finite number")
            for k, kind in (("higher_is_better", bool), ("metric", str), ("unavailable", str)):
                if cell.get(k) is not None and not isinstance(cell[k], kind):
                    raise bad(i, f"value {vkey} has `{k}` {short(repr(cell[k]), 40)}")


def compare_reports(old: Mapping[str, Any], new: Mapping[str, Any], tolerances: Mapping[str, Tolerance],
                    against: str = "") -> dict[str, Any]:
    """The regression gate: what got worse (beyond the tolerance), better or changed from the report ``old`` to
    ``new``, row by row; for a sweep's report, model by model, each model's rows through the same gate."""
    if new.get("schema") == SWEEP_REPORT_SCHEMA:
        return _compare_models(old, new, tolerances, against)
    return _compare_rows(old, new, tolerances, against)


def _compare_models(old: Mapping[str, Any], new: Mapping[str, Any], tolerances: Mapping[str, Tolerance],
                    against: str) -> dict[str, Any]:
    """Each model's report of the sweep ``new`` against the same model's in ``old``."""
    if old.get("schema") != SWEEP_REPORT_SCHEMA:
        raise UsageError(f"{against or 'the reference'} is the report of one run, and this is a sweep's",
                         "compare a sweep with a sweep report (`report OUT --format json`), or one model with "
                         "`edgedeploy report OUT/NAME --compare OLD.json`")
    olds = {m["name"]: m.get("report") for m in old.get("models", [])}
    per_model, regressions = {}, []
    for m in new["models"]:
        theirs, mine = olds.get(m["name"]), m.get("report")
        if theirs is None:
            continue
        if mine is None:
            regressions.append({"model": m["name"], "text": f"model {m['name']}: in {against} but has no report now"})
            continue
        comp = _compare_rows(theirs, mine, tolerances, against)
        per_model[m["name"]] = comp
        regressions += [{**r, "model": m["name"], "text": f"{m['name']}: {r['text']}"} for r in comp["regressions"]]
    for name in sorted(set(olds) - {m["name"] for m in new["models"]}):
        regressions.append({"model": name, "text": f"model {name}: in {against or 'the reference'} but missing now"})
    return {"against": against, "against_created": old.get("created"), "passed": not regressions,
            "regressions": regressions, "per_model": per_model,
            "added": sorted({m["name"] for m in new["models"]} - set(olds))}


def _compare_rows(old: Mapping[str, Any], new: Mapping[str, Any], tolerances: Mapping[str, Tolerance],
                  against: str) -> dict[str, Any]:
    """One run's report against an earlier one of the same run, row by row."""

    def index(doc: Mapping[str, Any]) -> dict[tuple, Mapping[str, Any]]:
        # A leaf not compiled for any target has one row with target None: its int8 metric is still gated.
        return {(r["leaf"], r.get("target")): r for r in doc["rows"]}

    old_rows, new_rows = index(old), index(new)
    new_leaves = {leaf for leaf, _ in new_rows}
    regressions, changes = [], []
    for key in sorted(old_rows, key=lambda k: (k[1] or "", leaf_rank(k[0]))):
        leaf, target = key
        where = f"{leaf} on {target}" if target else leaf
        if key not in new_rows and target is None and leaf in new_leaves:
            continue  # compiled since: its rows per target are compared with the reference's own
        if key not in new_rows:
            regressions.append({"leaf": leaf, "target": target, "metric": None,
                                "text": f"{where}: in {against or 'the reference'} but missing now"})
            continue
        o_vals, n_vals = old_rows[key].get("values", {}), new_rows[key]["values"]
        for name, (vkey, higher_better, label, unit) in GATED.items():
            o, n = value_of(o_vals.get(vkey)), value_of(n_vals.get(vkey))
            if name == "metric":  # the leaf's own metric, with its direction
                cell = n_vals.get(vkey) or o_vals.get(vkey) or {}
                higher_better, label = bool(cell.get("higher_is_better", True)), f"int8 {cell.get('metric', 'metric')}"
            if o is None and n is None:
                continue
            base = {"leaf": leaf, "target": target, "metric": name, "old": o, "new": n}
            if n is None:
                regressions.append({**base, "text": f"{where}: {label} was {fmt_in_unit(o, unit)}, now "
                                                    f"unavailable ({n_vals.get(vkey, {}).get('unavailable', '')})"})
                continue
            if o is None:
                changes.append({**base, "text": f"{where}: {label} now {fmt_in_unit(n, unit)} "
                                                "(unavailable in the reference)"})
                continue
            if n == o:
                continue
            worse_by = (o - n) if higher_better else (n - o)
            tol = tolerances[name]
            rel = f" ({100.0 * (n - o) / o:+.1f}%)" if o else ""
            diff = (f"{n - o:+.2f} pts" if unit == "%" else f"{n - o:+.4g}" if name == "metric" else
                    f"{n - o:+,.0f}")
            text = (f"{where}: {label} {fmt_in_unit(o, unit)} → {fmt_in_unit(n, unit)}, {diff}{rel}")
            if worse_by > tol.allowed(o) + 1e-9:
                regressions.append({**base, "text": f"{text}; worse than the tolerance {name}={tol}"})
            else:
                verdict = "better" if worse_by < 0 else f"within the tolerance {name}={tol}"
                changes.append({**base, "text": f"{text}; {verdict}"})
    added = [f"{leaf} on {target}" if target else leaf for (leaf, target) in new_rows
             if (leaf, target) not in old_rows]
    return {
        "against": against,
        "against_created": old.get("created"),
        "tolerances": {k: str(t) for k, t in tolerances.items()},
        "passed": not regressions,
        "regressions": regressions,
        "changes": changes,
        "added": added,
    }


def raise_on_regression(comparison: Mapping[str, Any]) -> None:
    regs = comparison["regressions"]
    if not regs:
        return
    shown = "; ".join(r["text"] for r in regs[:3])
    more = f"; and {len(regs) - 3} more" if len(regs) > 3 else ""
    raise RegressionError(
        f"{len(regs)} regression(s) against {comparison['against'] or 'the reference report'}: {shown}{more}",
        "fix the change, or accept it with a wider --tolerance or a new reference report",
    )
