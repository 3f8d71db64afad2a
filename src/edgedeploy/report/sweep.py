"""The report of a sweep (several models, one run folder each): one document comparing them.

A sweep folder ``OUT`` holds ``sweep.json`` (written by :mod:`edgedeploy.pipeline.sweep`: which models, which folders,
each one's status and error) and one run folder per model. :func:`build_sweep_report` builds each member's
report document from its own manifest (:func:`.build.build_report`, the same requirements for all), then
:func:`compare_models` (a pure function of those documents) puts them side by side:

- ``rows``: models x leaves x targets with the leaf's quality (int8 accuracy, or the task's metric), flash,
  SRAM, NPU cycles and latency, whether it meets the requirements, and whether it is its model's recommendation;
- ``models``: each model's status, quality measure, data, recommendation per target and walk;
- ``overall``: per target, one (model, leaf) recommended across models: among the pairs that meet the
  requirements, those no other meeting pair beats on quality, flash and latency at once; of them the least
  optimized, then the best quality, then the smaller flash (as :mod:`.recommend` does within one model).
  Models judged by different metrics, or measured on different data, are not ranked against each other: the
  document says why and gives no overall pick.

The regression gate works per model: ``report OUT --compare OLD.json`` with OLD.json a sweep report compares
each model's report with the same model's in OLD.json.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, Mapping, Sequence

from .. import __version__
from ..errors import InvalidInputError, UsageError
from edgedeploy.core.files import read_input_text, sha256_file, short
from edgedeploy.core.manifest import Manifest, now_iso
from edgedeploy.core.names import is_valid
from .limits import Requirements, Tolerance
from .recommend import dominates

SWEEP_FILE = "sweep.json"
SWEEP_SCHEMA = "edgedeploy.sweep"
SWEEP_SCHEMA_VERSION = 1
REPORT_SCHEMA = "edgedeploy.sweep_report"
REPORT_SCHEMA_VERSION = 1
# the member report values a comparison row keeps
ROW_KEYS = ("int8_accuracy_pct", "int8_accuracy_delta_pts", "int8_metric", "int8_metric_drop", "compiled_model_bytes",
            "sram_bytes", "total_cycles", "latency_ms")


def is_sweep_dir(path: Path) -> bool:
    return (Path(path) / SWEEP_FILE).is_file()


def load_sweep_record(out: Path) -> dict[str, Any]:
    """``OUT/sweep.json``, checked: its schema, and each model's name a valid folder name."""
    path = Path(out) / SWEEP_FILE
    try:
        if not path.exists():
            raise FileNotFoundError(path)
        record = json.loads(read_input_text(path, "sweep record", "manifest"))  # regular, bounded
    except FileNotFoundError:
        raise InvalidInputError(f"{path} does not exist", "run `edgedeploy compile PROJECT.toml` with [[models]] "
                                "into this folder first") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise InvalidInputError(f"{path} cannot be read as JSON ({exc})", "run the sweep again") from exc
    if not isinstance(record, dict) or record.get("schema") != SWEEP_SCHEMA:
        raise InvalidInputError(f"{path} is not a sweep record (schema {SWEEP_SCHEMA})", "run the sweep again")
    if not isinstance(record.get("schema_version"), int) or record["schema_version"] > SWEEP_SCHEMA_VERSION:
        raise InvalidInputError(f"{path} has sweep schema version {record.get('schema_version')}, which this "
                                f"edgedeploy does not read (it reads {SWEEP_SCHEMA_VERSION})", "upgrade edgedeploy")
    models = record.get("models")
    if not isinstance(models, list) or not all(isinstance(m, dict) and is_valid("model", m.get("name"))
                                                and m.get("folder") == m.get("name") for m in models):
        raise InvalidInputError(f"{path}: its models are not a list of named run folders", "run the sweep again")
    return record


def _data_of(manifest: Manifest) -> dict[str, Any] | None:
    data = (manifest.info.get("optimize") or {}).get("data")
    if not isinstance(data, Mapping):
        return None
    return {k: data.get(k) for k in ("path", "sha256", "eval_split", "n_eval", "eval_set")}


def build_sweep_report(out: Path, requirements: Requirements = Requirements()) -> dict[str, Any]:
    """The comparing report of the sweep folder ``out`` (schema ``edgedeploy.sweep_report``)."""
    from .build import build_report

    out = Path(out)
    record = load_sweep_record(out)
    members = []
    for m in record["models"]:
        folder = out / m["folder"]
        entry = {"name": m["name"], "folder": m["folder"], "run_dir": str(folder), "status": m.get("status"),
                 "error": m.get("error"), "seconds": m.get("seconds")}
        doc = None
        if (folder / "manifest.json").is_file():
            try:
                doc = build_report(folder, requirements, compression=False)
                entry["data"] = _data_of(Manifest.load(folder))
            except InvalidInputError as exc:
                entry["unavailable"] = exc.one_line()
        else:
            entry["unavailable"] = f"no run folder {folder} (status {m.get('status')})"
        members.append((entry, doc))
    sweep = {"path": str(out / SWEEP_FILE), "sha256": sha256_file(out / SWEEP_FILE),
             **{k: record.get(k) for k in ("project", "mode", "targets", "started", "finished")}}
    return compare_models(members, requirements, run_dir=str(out), sweep=sweep)


def measure_of(doc: Mapping[str, Any]) -> dict[str, Any] | None:
    """What a member's leaves are judged by: accuracy, or its task's metric (name, unit, direction)."""
    for r in doc.get("rows", []):
        cell = r["values"].get("int8_accuracy_pct") or {}
        if cell.get("value") is not None:
            return {"name": "accuracy", "unit": "%", "higher_is_better": True}
        cell = r["values"].get("int8_metric") or {}
        if cell.get("value") is not None:
            return {"name": cell.get("metric", "metric"), "unit": cell.get("unit", ""),
                    "higher_is_better": bool(cell.get("higher_is_better", True))}
    return None


def _quality(row: Mapping[str, Any]) -> float | None:
    """The row's quality across models, higher better (accuracy, or the metric signed by its direction)."""
    acc = (row["values"].get("int8_accuracy_pct") or {}).get("value")
    if acc is not None:
        return float(acc)
    cell = row["values"].get("int8_metric") or {}
    if cell.get("value") is None:
        return None
    return float(cell["value"]) if cell.get("higher_is_better", True) else -float(cell["value"])


def _point(row: Mapping[str, Any]) -> tuple[float, float, float]:
    q = _quality(row)
    flash = (row["values"].get("compiled_model_bytes") or {}).get("value")
    cycles = (row["values"].get("total_cycles") or {}).get("value")
    return (math.inf if q is None else -q, math.inf if flash is None else float(flash),
            math.inf if cycles is None else float(cycles))


def _order(row: Mapping[str, Any]) -> tuple:
    level = row.get("level")
    q, flash, cycles = _point(row)
    return (level is None, level if level is not None else 0, q, flash, cycles, row["model"], row["leaf"])


def comparable(models: Sequence[Mapping[str, Any]]) -> tuple[bool, str]:
    """Whether the models' leaves can be ranked against each other on quality, and why not."""
    judged = [m for m in models if m.get("measure")]
    if len(judged) < 2:
        return True, ""
    names = {m["measure"]["name"] for m in judged}
    if len(names) > 1:
        shown = ", ".join(f"{m['name']} by {m['measure']['name']}" for m in judged)
        return False, (f"the models are judged by different metrics ({shown}): their leaves are not ranked "
                       "against each other on quality")
    # the same evaluation samples: the same clips and classes (``eval_set``, even through different front ends),
    # else the same file and split
    data = {d.get("eval_set") or (d.get("sha256"), d.get("eval_split")) for m in judged for d in [m.get("data") or {}]}
    if len(data) > 1 or any(k is None or (isinstance(k, tuple) and k[0] is None) for k in data):
        shown = ", ".join(f"{m['name']}: {Path(str((m.get('data') or {}).get('path'))).name}" for m in judged)
        return False, (f"the models were scored on different data ({shown}): their {next(iter(names))} is not "
                       "ranked across models")
    return True, ""


def _overall(rows: list[dict[str, Any]], target: str, ok: bool, why: str,
             models: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    group = [r for r in rows if r["target"] == target]
    own = "; ".join(f"{m['name']}: {(m['recommendations'].get(target) or {}).get('leaf') or 'none'}"
                    for m in models if m.get("recommendations") is not None)
    if not ok:
        for r in group:
            r["front"] = None
        return {"target": target, "model": None, "leaf": None, "front": [],
                "message": f"no overall recommendation on {target}: {why}; each model's own: {own or 'none'}"}
    judged = [r for r in group if _quality(r) is not None and math.isfinite(sum(_point(r)[1:]))]
    points = {id(r): _point(r) for r in judged}
    for r in group:
        r["front"] = None if id(r) not in points else not any(
            dominates(points[id(o)], points[id(r)]) for o in judged if o is not r)
    front = sorted((r for r in judged if r["front"]), key=_order)
    meeting = [r for r in judged if r.get("meets_requirements") in (True, None)]
    if not meeting:
        return {"target": target, "model": None, "leaf": None, "front": [f"{r['model']}/{r['leaf']}" for r in front],
                "message": f"no (model, leaf) meets the requirements on {target}"}
    candidates = [r for r in meeting if not any(dominates(points[id(o)], points[id(r)]) for o in meeting
                                                if o is not r)]
    best = min(candidates, key=_order)
    best["overall"] = True
    q = _quality(best)
    measure = next((m["measure"] for m in models if m["name"] == best["model"] and m.get("measure")), None) or {}
    shown_q = "" if q is None else (f"{q:.2f}% accuracy" if measure.get("name") == "accuracy" else
                                    f"int8 {measure.get('name')} {abs(q):.4g}")
    flash = best["values"]["compiled_model_bytes"]["value"]
    latency = (best["values"].get("latency_ms") or {}).get("value")
    why_not = ("; no requirements set: the least-optimized pair no other beats on quality, flash and latency"
               if all(r.get("meets_requirements") is None for r in group) else
               "; the least-optimized pair meeting the requirements that no other meeting pair beats on quality, "
               "flash and latency")
    return {"target": target, "model": best["model"], "leaf": best["leaf"],
            "front": [f"{r['model']}/{r['leaf']}" for r in front],
            "message": (f"{target}: {best['model']} / {best['leaf']} ({shown_q}, {int(flash):,} B flash"
                        + (f", {latency:.3f} ms" if latency is not None else "") + ")" + why_not)}


def compare_models(members: Sequence[tuple[Mapping[str, Any], Mapping[str, Any] | None]],
                   requirements: Requirements = Requirements(), *, run_dir: str = "",
                   sweep: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The comparing document of member reports: ``members`` are (entry, report document or None) with entry
    ``{"name", "status", "error", "data", ...}``; a pure function of them."""
    models: list[dict[str, Any]] = []
    rows: list[dict[str, Any]] = []
    notes: list[str] = []
    for entry, doc in members:
        model = {**entry, "measure": None, "recommendations": None, "walk": None, "report": None}
        if doc is not None:
            model["measure"] = measure_of(doc)
            model["recommendations"] = {t: {"leaf": r.get("leaf"), "message": r.get("message")}
                                        for t, r in doc.get("recommendations", {}).items()}
            walk = doc.get("walk")
            model["walk"] = None if not walk else {k: walk.get(k) for k in ("stopped", "recommended", "message")}
            model["report"] = {k: v for k, v in doc.items() if k != "html"}
            for r in doc["rows"]:
                if not r.get("target"):
                    continue
                rows.append({"model": entry["name"], "leaf": r["leaf"], "target": r["target"], "level": r.get("level"),
                             "values": {k: r["values"][k] for k in ROW_KEYS if k in r["values"]},
                             "meets_requirements": r.get("meets_requirements"), "recommended": bool(r.get("recommended")),
                             "front": None, "overall": False})
        if entry.get("status") != "ok":
            err = entry.get("error") or {}
            notes.append(f"model {entry['name']} {entry.get('status') or 'unknown'}"
                         + (f" (exit {err.get('exit_code')}): {err.get('message')}" if err else "")
                         + ("; its rows are missing" if doc is None else ""))
        elif doc is None:
            notes.append(f"model {entry['name']}: {entry.get('unavailable', 'no report')}")
        models.append(model)
    ok, why = comparable(models)
    if why:
        notes.append(why)
    targets = sorted({r["target"] for r in rows})
    overall = {t: _overall(rows, t, ok, why, models) for t in targets}
    names = [m["name"] for m in models]
    rows.sort(key=lambda r: (r["target"], names.index(r["model"]), _order(r)[:2], r["leaf"]))
    return {
        "schema": REPORT_SCHEMA,
        "schema_version": REPORT_SCHEMA_VERSION,
        "edgedeploy_version": __version__,
        "created": now_iso(),
        "run_dir": run_dir,
        "sweep": dict(sweep or {}),
        "requirements": requirements.to_dict(),
        "comparable": {"ranked": ok, "why": why},
        "targets": targets,
        "models": models,
        "rows": rows,
        "overall": overall,
        "notes": notes,
    }


def compare_sweeps(old: Mapping[str, Any], new: Mapping[str, Any], tolerances: Mapping[str, Tolerance],
                   against: str = "") -> dict[str, Any]:
    """The regression gate per model: each model's report against the same model's in ``old``."""
    from .regressions import compare_reports

    if old.get("schema") != REPORT_SCHEMA:
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
        comp = compare_reports(theirs, mine, tolerances, against=against)
        per_model[m["name"]] = comp
        regressions += [{**r, "model": m["name"], "text": f"{m['name']}: {r['text']}"} for r in comp["regressions"]]
    for name in sorted(set(olds) - {m["name"] for m in new["models"]}):
        regressions.append({"model": name, "text": f"model {name}: in {against or 'the reference'} but missing now"})
    return {"against": against, "against_created": old.get("created"), "passed": not regressions,
            "regressions": regressions, "per_model": per_model,
            "added": sorted({m["name"] for m in new["models"]} - set(olds))}


def load_sweep_report_json(path: Path) -> dict[str, Any]:
    """A sweep report written earlier with ``--format json``; a one-run report is refused with the way out."""
    from .regressions import load_report_json

    from .regressions import check_report_rows

    try:
        data = json.loads(read_input_text(path, "reference report", "manifest"))  # regular, bounded
    except (InvalidInputError, OSError, UnicodeDecodeError, json.JSONDecodeError, RecursionError):
        return load_report_json(path)  # its one-line errors for a missing or broken file
    if isinstance(data, dict) and data.get("schema") == REPORT_SCHEMA:
        models = data.get("models")
        if not isinstance(models, list):
            raise InvalidInputError(f"{path} has no models", "write the reference report again")
        for i, m in enumerate(models):
            if not isinstance(m, dict) or not isinstance(m.get("name"), str):
                raise InvalidInputError(f"{path}: model {i} has no name", "write the reference report again")
            report = m.get("report")
            if report is not None and not (isinstance(report, dict) and isinstance(report.get("rows"), list)):
                raise InvalidInputError(f"{path}: the report of model {short(m['name'], 60)} has no rows",
                                        "write the reference report again")
            if report is not None:
                check_report_rows(report["rows"], f"{path} model {short(m['name'], 60)}")
        return data
    return load_report_json(path)


def sweep_unmet(doc: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Targets where (model, leaf) pairs were judged against requirements and none met them."""
    out = []
    for t in doc["targets"]:
        judged = [r for r in doc["rows"] if r["target"] == t and r.get("meets_requirements") is not None]
        if judged and not any(r["meets_requirements"] for r in judged):
            out.append({"target": t, "message": f"no (model, leaf) of the sweep meets the requirements on {t}"})
    return out
