"""Which compiled model, int8 model and target of a run an export reads."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

from ..errors import InvalidInputError, TargetError, UsageError
from edgedeploy.core.manifest import Manifest, StageRecord, artifacts_intact
from .common import check_c_name, check_section


@dataclass(frozen=True)
class ExportOptions:
    """What ``edgedeploy export`` writes: bundle folder, (leaf, target), C name, golden cases, data, section."""

    out: Path
    target: str | None = None
    leaf: str | None = None
    name: str | None = None
    golden: int | None = None  # None: DEFAULT_GOLDEN when evaluation data is known, else 0
    data: Path | None = None
    section: str | None = None
    force: bool = False

    def check(self) -> None:
        if self.name is not None:
            check_c_name(self.name)
        if self.section is not None:
            check_section(self.section)
        if self.golden is not None and self.golden < 0:
            raise UsageError(f"--golden is {self.golden}", "pass a number of golden cases >= 0")


@dataclass
class ExportSource:
    """What the run manifest says about one (leaf, target) pair."""

    run_dir: Path
    manifest: Manifest
    leaf: str
    target: str
    target_info: dict[str, Any]
    compile_record: StageRecord
    vela_model: Path
    int8_record: StageRecord
    int8_model: Path
    data_info: dict[str, Any] = field(default_factory=dict)


def _ok(records: Sequence[StageRecord]) -> list[StageRecord]:
    return [r for r in records if r.status in ("ok", "cached")]


def locate(run_dir: Path, leaf: str | None, target: str | None) -> ExportSource:
    """Find the compiled model, the int8 model and the target of ``leaf`` on ``target`` in a run."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise InvalidInputError(
            f"run folder {run_dir} does not exist",
            "point at a folder written by `edgedeploy compile` or `edgedeploy optimize`",
        )
    manifest = Manifest.load(run_dir)
    compiled = _ok(manifest.find(stage="compile"))
    leaf = _pick_leaf(manifest, compiled, leaf)
    leaf_compiled = [r for r in compiled if r.variant == leaf]
    leaf_targets = [r.target for r in leaf_compiled if r.target]
    target = _pick_target(leaf, leaf_targets, target)
    record = _compile_record(manifest, leaf, target, leaf_compiled, leaf_targets)
    vela_art = record.output("vela_model")
    if vela_art is None or not artifacts_intact(manifest, [vela_art]):
        shown = manifest.resolve(vela_art) if vela_art else run_dir / record.id
        raise InvalidInputError(
            f"the Vela-compiled model of '{leaf}' for {target} ({shown}) is missing or was changed after compile",
            f"write it again: {_compile_hint(manifest, leaf, target)}",
        )
    int8_record, int8_art = _int8_source(manifest, leaf, record)
    if int8_art is None or not artifacts_intact(manifest, [int8_art]):
        where = f"{int8_record.id}" if int8_record else f"convert/{leaf} or import/{leaf}"
        raise InvalidInputError(
            f"the int8 model of '{leaf}' before Vela ({where} in {run_dir}) is missing or was changed",
            "re-run the command that wrote it (`edgedeploy optimize` or `edgedeploy compile MODEL.tflite`)",
        )
    info = manifest.targets.get(target)
    if info is None:
        raise InvalidInputError(
            f"{manifest.path} records no resolved target '{target}'", "re-run `edgedeploy compile` for this target"
        )
    data_info = dict(int8_record.details.get("data") or {}) if int8_record else {}
    return ExportSource(
        run_dir=run_dir,
        manifest=manifest,
        leaf=leaf,
        target=target,
        target_info=info,
        compile_record=record,
        vela_model=manifest.resolve(vela_art),
        int8_record=int8_record,
        int8_model=manifest.resolve(int8_art),
        data_info=data_info,
    )


def _pick_leaf(manifest: Manifest, compiled: list[StageRecord], leaf: str | None) -> str:
    """``leaf`` once the run is known to have it; without one, the run's only compiled variant."""
    run_dir = manifest.run_dir
    variants = manifest.variants()
    compiled_variants = list(dict.fromkeys(r.variant for r in compiled if r.variant))
    if leaf is None:
        if len(compiled_variants) == 1:
            return compiled_variants[0]
        if not compiled_variants:
            raise InvalidInputError(
                f"{run_dir} holds no compiled model",
                "compile one first: `edgedeploy compile MODEL.tflite -t TARGET -o RUN_DIR`",
            )
        raise UsageError(
            f"{run_dir} holds {len(compiled_variants)} compiled variants", f"pass --leaf, one of: {', '.join(compiled_variants)}"
        )
    if leaf not in variants:
        raise UsageError(
            f"{run_dir} has no variant '{leaf}'",
            f"variants in this run: {', '.join(variants) or 'none'}"
            + (f"; compiled: {', '.join(compiled_variants)}" if compiled_variants else ""),
        )
    return leaf


def _pick_target(leaf: str, leaf_targets: list[str], target: str | None) -> str:
    """The target's name: ``target`` (a name, or a target file read for its name), else the leaf's only one."""
    if target is None:
        if len(leaf_targets) != 1:
            raise UsageError(
                f"no --target given and '{leaf}' is compiled for {len(leaf_targets)} targets",
                f"pass --target, one of: {', '.join(leaf_targets) or 'none (compile it first)'}",
            )
        target = leaf_targets[0]
    if target.endswith(".toml") or os.sep in target:
        from edgedeploy.config.targets import get_target

        target = get_target(target).name
    return target


def _compile_record(manifest: Manifest, leaf: str, target: str, leaf_compiled: list[StageRecord],
                    leaf_targets: list[str]) -> StageRecord:
    """The successful compile of ``leaf`` for ``target``; its failure or absence is an error saying what to run."""
    record = next((r for r in leaf_compiled if r.target == target), None)
    if record is not None:
        return record
    run_dir = manifest.run_dir
    failed = next((r for r in manifest.find(stage="compile", variant=leaf, target=target) if r.status == "failed"), None)
    if failed is not None:
        raise InvalidInputError(
            f"the compile of '{leaf}' for {target} in {run_dir} failed: {failed.error}",
            "fix that and re-run `edgedeploy compile` for this target",
        )
    raise TargetError(
        f"{run_dir} has no model of '{leaf}' compiled for {target}",
        f"targets compiled for '{leaf}': {', '.join(leaf_targets) or 'none'}; "
        f"to add it, compile for it: {_compile_hint(manifest, leaf, target)}",
    )


def _compile_hint(manifest: Manifest, leaf: str, target: str) -> str:
    """The command that compiles ``leaf`` for ``target`` into this run."""
    for rec in _ok(manifest.find(stage="import", variant=leaf)):
        if rec.params.get("source"):
            return f"`edgedeploy compile {rec.params['source']} -t {target} -o {manifest.run_dir}`"
    return f"re-run the command that made {manifest.run_dir} with `-t {target}`"


def _int8_source(manifest: Manifest, leaf: str, compiled: StageRecord):
    """The record holding the int8 model Vela compiled: the compile record's parent, else convert/ or import/."""
    candidates = []
    if compiled.parent and compiled.parent in manifest.records:
        candidates.append(manifest.records[compiled.parent])
    for stage in ("convert", "import"):
        candidates.extend(_ok(manifest.find(stage=stage, variant=leaf)))
    for rec in candidates:
        art = rec.output("int8_model")
        if art is not None:
            return rec, art
    return (candidates[0] if candidates else None), None
