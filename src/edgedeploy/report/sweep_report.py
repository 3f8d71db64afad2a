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
  optimized, then the best quality, then the smaller flash (:func:`.judge.overall`, as the judge recommends
  within one model). Models judged by different metrics, or measured on different data, are not ranked against
  each other: the document says why and gives no overall pick.

The regression gate (:func:`.regressions.compare_reports`) works per model: ``report OUT --compare OLD.json``
with OLD.json a sweep report compares each model's report with the same model's in OLD.json.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Mapping, Sequence

from .. import __version__
from ..errors import InvalidInputError
from edgedeploy.core.files import read_input_text, sha256_file, short
from edgedeploy.core.manifest import Manifest, now_iso
from edgedeploy.core.names import is_valid
from .columns import SWEEP_REPORT_SCHEMA as REPORT_SCHEMA
from .limits import Requirements
from .judge import comparable, level_key, overall

SWEEP_FILE = "sweep.json"
SWEEP_SCHEMA = "edgedeploy.sweep"
SWEEP_SCHEMA_VERSION = 1
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
    overall_picks = {t: overall(rows, t, ok, why, models) for t in targets}
    names = [m["name"] for m in models]
    rows.sort(key=lambda r: (r["target"], names.index(r["model"]), level_key(r.get("level")), r["leaf"]))
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
        "overall": overall_picks,
        "notes": notes,
    }


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
