"""The report document: collect -> judge, in one function."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from .. import __version__
from ..errors import InvalidInputError
from edgedeploy.core.files import sha256_file
from edgedeploy.core.manifest import Manifest, now_iso
from edgedeploy.core.units import fmt_bytes
from edgedeploy.vela.compute import bound_layers_note, layer_bounds, npu_compute_values
from edgedeploy.config.requirements import check_requirements
from edgedeploy.report.levels import LEAF_LEVELS, REFERENCE_LEAF
from .columns import SCHEMA, SCHEMA_VERSION, columns_of, na, val, value_columns, value_of
from .limits import Requirements
from .collect import _Variant, _accuracy_values, _compile_values, _fit, _variants
from .judge import check_row, flag_over_reference, judge_uncompiled, pareto_of_target, recommend, size_budget_misses
from .plot_inputs import plot_inputs
from .compression import _compression, npu_weight_layers
from .node_times import node_times


def _walk_requirements(manifest: Manifest, requirements: Requirements) -> Requirements:
    """With none given, the requirements a ``--walk`` judged this run by (recorded in its manifest), so the
    report's recommendations agree with the walk's."""
    walk = manifest.info.get("walk") or {}
    recorded = (walk.get("requirements") if isinstance(walk, dict) else None) or {}
    if not isinstance(recorded, dict):
        raise InvalidInputError(f"{manifest.path}: info.walk.requirements is not a table",
                                "re-run the walk that wrote it into a new folder")
    values = {k: recorded.get(k) for k in Requirements.KEYS if recorded.get(k) is not None}
    if requirements.given() or requirements.sources or not values:
        return requirements
    values = check_requirements(values, f"{manifest.path}: info.walk.requirements.{{name}}", InvalidInputError,
                                "re-run the walk that wrote it into a new folder")
    return Requirements(**values, sources=(f"the walk recorded in {manifest.path}",))


def _rows(manifest: Manifest, variants: list[_Variant], ref: _Variant | None) -> list[dict[str, Any]]:
    """One row of collected values per (leaf, target); a leaf compiled for no target has one row, target None."""
    rows: list[dict[str, Any]] = []
    for v in variants:
        acc_values = _accuracy_values(v, ref)
        compiles = sorted(v.compiles, key=lambda r: r.target or "")
        for rec in compiles or (None,):
            values = {**acc_values, **_compile_values(rec, manifest, v)}
            target = rec.target if rec is not None else None
            row: dict[str, Any] = {
                "leaf": v.name,
                "target": target,
                "level": v.level,
                "kind": "leaf" if v.level is not None else ("imported" if v.imported is not None else "unknown"),
                "stages": {
                    "accuracy": v.accuracy.id if v.accuracy else None,
                    "import": v.imported.id if v.imported else None,
                    "compile": rec.id if rec else None,
                },
                "values": values,
                "pareto": None,
                "recommended": False,
                "cpu_operator_list": (rec.details.get("cpu_operators", []) if rec else []),
                "warnings": list(rec.warnings) if rec else [],
            }
            row["fit"] = _fit(values, manifest.targets.get(target or ""), target or "")
            rows.append(row)
    return rows


def _derived_values(rows: list[dict[str, Any]]) -> None:
    """Values computed from other rows (weights and MACs against the ptq leaf on the same target, the
    compute-bound share); then every row gets every value column, unavailable with a reason where it has none."""
    ptq_weights = {r["target"]: value_of(r["values"]["encoded_weights_bytes"]) for r in rows
                   if r["leaf"] == REFERENCE_LEAF}
    for r in rows:
        mine, theirs = value_of(r["values"]["encoded_weights_bytes"]), ptq_weights.get(r["target"])
        if mine is None:
            r["values"]["encoded_weights_ratio"] = na("ratio", "computed", r["values"]["encoded_weights_bytes"].get(
                "unavailable", "no NPU-encoded weights"))
        elif not theirs:
            r["values"]["encoded_weights_ratio"] = na(
                "ratio", "computed", f"no {REFERENCE_LEAF} leaf compiled for {r['target']} to compare against")
        else:
            r["values"]["encoded_weights_ratio"] = val(mine / theirs, "ratio", "computed")
        npu_compute_values(r, rows, REFERENCE_LEAF)  # MACs and cycles vs ptq, compute-bound share
        r["values"] = {c.key: r["values"].get(c.key) or na(c.unit, "measured", "the leaf is judged by accuracy")
                       for c in value_columns(rows)}


def _layer_facts(variants: list[_Variant]) -> dict[tuple[str, str], list[dict[str, Any]]]:
    """Per (leaf, target) the NPU operators of Vela's per-layer estimate, as the compile recorded them."""
    out = {}
    for v in variants:
        for rec in v.compiles:
            details = rec.details or {}
            facts = (details.get("npu_compute") or {}).get("layers")
            out[(v.name, rec.target or "")] = facts if facts is not None else layer_bounds(details.get("layers") or [])
    return out


def _judge(rows: list[dict[str, Any]], targets: list[str],
           requirements: Requirements) -> tuple[dict[str, Any], dict[str, Any]]:
    """The judge on the rows: per target the Pareto front, each row's requirement checks and the
    recommendation; a leaf compiled for no target on what needs none. Returns (pareto, recommendations)."""
    pareto: dict[str, Any] = {}
    recommendations: dict[str, Any] = {}
    for t in targets:
        group = [r for r in rows if r["target"] == t]
        pareto[t] = pareto_of_target(group, t)
        for r in group:
            check_row(r, requirements)
        recommendations[t] = recommend(group, t, requirements)
    for r in rows:
        if not r["target"]:
            judge_uncompiled(r, requirements)  # the accuracy or metric drop needs no target
        r.setdefault("requirements", {})
        r.setdefault("meets_requirements", None)
        r.setdefault("pareto_note", None)
    return pareto, recommendations


def _closing_notes(manifest: Manifest, targets: list[str], has_reference: bool) -> list[str]:
    """How a board's fit is judged, what flash means, and a missing reference leaf."""
    notes = []
    for t in targets:
        tdict = manifest.targets.get(t) or {}
        mem = tdict.get("memory")
        if tdict.get("kind") == "board" and mem:
            notes.append(
                f"{t}: fits = Vela SRAM + {fmt_bytes(mem.get('runtime_margin_bytes', 0))} runtime margin ≤ "
                f"{fmt_bytes(mem['sram_bytes'])} board SRAM, and the compiled model ≤ "
                f"{fmt_bytes(mem['flash_bytes'])} board flash"
            )
    notes.append("Flash is judged on the compiled model (*_vela.tflite), the file firmware stores in flash: it holds "
                 "Vela's weights and command stream and the flatbuffer around them. Vela's own flash estimate is "
                 "shown beside it; it is 0 on systems that read the model from DRAM (see the DRAM column)")
    if not has_reference:
        notes.append(f"no {REFERENCE_LEAF} leaf in this run: differences against it are unavailable")
    return notes


def build_report(run_dir: Path, requirements: Requirements = Requirements(), *, compression: bool = True,
                 html: bool = False) -> dict:
    """The report document of ``run_dir``: rows, judgments and recommendations (schema ``edgedeploy.report``).

    ``html`` also gathers what only the HTML page plots (per-layer cycles, a kernel through the stages) under
    the key ``html``, which the JSON and CSV formats leave out.
    """
    manifest = Manifest.load(Path(run_dir))
    requirements = _walk_requirements(manifest, requirements)
    variants = _variants(manifest)
    if not variants:
        raise InvalidInputError(
            f"{manifest.path} records no convert, import or compile stage",
            "run `edgedeploy compile` or `edgedeploy optimize` into this folder first",
        )
    ref = next((v for v in variants if v.name == REFERENCE_LEAF and v.accuracy is not None), None)
    rows = _rows(manifest, variants, ref)
    _derived_values(rows)
    notes = size_budget_misses(manifest, rows)
    notes += flag_over_reference(rows, _layer_facts(variants))
    for t in sorted({rec.target for v in variants for rec in v.compiles if rec.target}):
        note = bound_layers_note(t, [(v.name, (rec.details or {}).get("npu_compute"))
                                     for v in variants for rec in v.compiles if rec.target == t])
        notes += [note] if note else []
    targets = sorted({r["target"] for r in rows if r["target"]})
    pareto, recommendations = _judge(rows, targets, requirements)
    notes += _closing_notes(manifest, targets, ref is not None)
    doc: dict[str, Any] = {
        "schema": SCHEMA,
        "schema_version": SCHEMA_VERSION,
        "edgedeploy_version": __version__,
        "created": now_iso(),
        "run_dir": str(manifest.run_dir),
        "manifest": {"path": str(manifest.path), "sha256": sha256_file(manifest.path)},
        "tools": dict(manifest.tools),
        "targets": {
            t: {k: (manifest.targets.get(t) or {}).get(k)
                for k in ("kind", "description", "accelerator_config", "npu_hz", "memory")}
            for t in targets
        },
        "levels": dict(LEAF_LEVELS),
        "reference_leaf": REFERENCE_LEAF if ref is not None else None,
        "requirements": requirements.to_dict(),
        "columns": [{"key": c.key, "header": c.header, "unit": c.unit} for c in columns_of({"rows": rows})],
        "rows": rows,
        "pareto": pareto,
        "recommendations": recommendations,
        "walk": manifest.info.get("walk"),  # the level-by-level walk (edgedeploy.pipeline.walk), when this run was one
        "compression": _compression(manifest, variants) if compression else {},
        "npu_weights": npu_weight_layers(variants),
        "node_times": node_times(manifest),  # each optimize node's time by step, as its record gives it
        "notes": notes,
    }
    if html:
        doc["html"] = plot_inputs(manifest, doc)
    return doc
