"""Which compiled model, int8 model and target of a run an export reads."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

from ..errors import InvalidInputError, TargetError, UsageError
from edgedeploy.core.files import short
from edgedeploy.core.manifest import Manifest, StageRecord, checked_artifact, file_mismatch
from .conventions import check_c_name, check_section


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
    if vela_art is None:
        raise InvalidInputError(
            f"{manifest.path} records no Vela-compiled model of '{leaf}' for {target} ({record.id})",
            f"write it again: {_compile_hint(manifest, leaf, target)}",
        )
    vela_model = checked_artifact(manifest, record, vela_art, f"the Vela-compiled model of '{leaf}' for {target}")
    int8_record, int8_art = _int8_source(manifest, leaf, record)
    if int8_art is None:
        where = f"{int8_record.id}" if int8_record else f"convert/{leaf} or import/{leaf}"
        raise InvalidInputError(
            f"{manifest.path} records no int8 model of '{leaf}' before Vela ({where})",
            "re-run the command that wrote it (`edgedeploy optimize` or `edgedeploy compile MODEL.tflite`)",
        )
    int8_model = checked_artifact(manifest, int8_record, int8_art, f"the int8 model of '{leaf}' before Vela")
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
        vela_model=vela_model,
        int8_record=int8_record,
        int8_model=int8_model,
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


def recorded_data(src: ExportSource) -> tuple[Path | None, str]:
    """The data file the leaf's record names (``details.data.path``), wherever it lies, while it holds the bytes
    that record's ``sha256`` names: (path, ""); else (None, why not). A path read back from a manifest is followed
    only to the file the run was made from, never to whatever now lies there."""
    recorded, digest = src.data_info.get("path"), src.data_info.get("sha256")
    if not recorded:
        return None, "records none"
    shown = f"records its data file {short(str(recorded), 120)}"
    if not isinstance(recorded, str) or "\x00" in recorded or not isinstance(digest, str) or not digest:
        return None, f"{shown} without its sha256"
    path = Path(recorded) if os.path.isabs(recorded) else src.run_dir / recorded
    why = file_mismatch(path, digest)
    if why is not None:
        return None, f"{shown}, which {why} (the manifest records sha256 {digest[:16]}...)"
    return path, ""


def preprocess_of(manifest: Manifest) -> dict[str, Any] | None:
    """The preprocessing function a run's samples went through (``info.optimize.data_source.preprocess``)."""
    source = (manifest.info.get("optimize") or {}).get("data_source") if isinstance(manifest.info.get("optimize"),
                                                                                      dict) else None
    pre = source.get("preprocess") if isinstance(source, dict) else None
    return pre if isinstance(pre, dict) else None


def check_given_data(src: ExportSource, data: Path) -> None:
    """``--data`` for a leaf trained on preprocessed samples must hold those samples (the file the run wrote, with
    the sha256 its record names): raw rows are refused, since edgedeploy runs no code a manifest names."""
    pre = preprocess_of(src.manifest)
    if pre is None or not Path(data).is_file():  # a missing or odd file: the data reader says what is wrong
        return
    digest = src.data_info.get("sha256")
    if isinstance(digest, str) and file_mismatch(Path(data), digest) is None:
        return
    ref = short(str(pre.get("ref") or "a preprocessing function"), 100)
    written = src.data_info.get("path") or "RUN/inputs/data.npz"
    raise InvalidInputError(
        f"--data {short(str(data))} is not the samples '{src.leaf}' in {src.run_dir} was made from: they went "
        f"through the preprocessing function {ref} (info.optimize.data_source.preprocess), and raw rows would "
        "give inputs the model never saw",
        f"leave out --data to use the preprocessed samples the run wrote ({short(str(written), 120)}), or pass a "
        "copy of that file")
