"""The export stage: a compiled model as a firmware bundle.

``edgedeploy export RUN_DIR --target T --out FWDIR`` reads the run manifest and
writes a folder that a Cortex-M build links directly:

- ``NAME.c`` / ``NAME.h``: the Vela-compiled model as a 16-byte aligned
  ``const uint8_t NAME_model[]`` placed in a named linker section, and the
  numbers firmware sizes its buffers with (tensor arena, input/output shapes,
  types, scales, zero points, class labels);
- ``CMakeLists.txt`` (``add_subdirectory(FWDIR)`` gives the library
  ``edgedeploy::NAME``) and ``edgedeploy.cmake`` (``edgedeploy_add_model()``
  regenerates the sources at build time when the model or the settings change);
- golden vectors for hardware-in-the-loop tests: real evaluation inputs,
  quantized with the model's input parameters, and the outputs the TensorFlow
  Lite Micro interpreter computes on the host with its reference kernels
  (``golden.npz``, ``NAME_golden.c`` / ``NAME_golden.h``), plus the int8 model
  they were computed from (``NAME_int8.tflite``);
- ``manifest.json``: what the bundle holds, where it came from (hashes, tool
  versions) and the list of files edgedeploy wrote.

Generated files carry no timestamps: the same inputs give byte-identical files.
The bundle is written into a staging folder and renamed into place when
complete. A folder holding files edgedeploy did not write is refused unless
``force`` is set, and even then those files are left as they are.

Decisions firmware depends on:

- Tensor arena = Vela's SRAM figure (the memory Vela planned for the
  feature maps) + a runtime margin for what the TFLM interpreter allocates
  besides (its own structures), rounded up to 16 bytes. The margin is the
  target's ``memory.runtime_margin_bytes`` on board targets and
  :data:`DEFAULT_RUNTIME_MARGIN` (16 KiB) on NPU-only targets. In Vela's
  ``Dedicated_Sram`` memory modes the arena lives in DRAM and the SRAM is the
  NPU's cache: the arena is then sized from Vela's DRAM figure (which also
  counts read-only data, so it is an upper bound) and ``NAME_FAST_MEMORY_SIZE``
  gives the cache size.
- Model section: the board target's ``memory.model_section``; NPU-only targets
  use :data:`DEFAULT_SECTION` (``.rodata.nn_model``), which the standard GNU
  and Arm linker scripts' ``*(.rodata*)`` rule already places in flash.
  ``--section`` overrides both.
- Golden inputs: from the evaluation split only (``split == 1`` or
  ``x_test``); the first example of each class in turn, in file order, so a
  few cases cover many classes. Float features are quantized as TFLite's
  QUANTIZE kernel does: ``round(x / scale) + zero_point`` rounding half away
  from zero, clamped to the type's range. The vectors come from the int8 model
  *before* Vela, since the host cannot run the ``ethos-u`` custom operator.
"""

from __future__ import annotations

import io
import json
import logging
import math
import os
import re
import shutil
import sys
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Sequence

from . import __version__
from .errors import EdgeDeployError, InvalidInputError, TargetError, ToolFailedError, ToolMissingError, UsageError
from .fsutil import new_staging_dir, promote, sha256_bytes, sha256_file
from .manifest import Manifest, StageRecord, artifacts_intact
from .tflite_model import TensorInfo, TfliteModel, read_tflite
from .names import C_KEYWORDS, c_comment

log = logging.getLogger("edgedeploy")

BUNDLE_SCHEMA = "edgedeploy.firmware"
BUNDLE_SCHEMA_VERSION = 1
BUNDLE_MANIFEST = "manifest.json"
GOLDEN_NPZ = "golden.npz"

MODEL_ALIGNMENT = 16  # Ethos-U reads the command stream and weights from 16-byte aligned addresses
ARENA_ALIGNMENT = 16
DEFAULT_SECTION = ".rodata.nn_model"
DEFAULT_RUNTIME_MARGIN = 16 * 1024
DEFAULT_GOLDEN = 8
TFLM_PACKAGE = "tflite-micro"
TFLM_PIN = "tflite-micro==0.dev20261023182759"
HOST_ARENA_MIN = 8 * 1024 * 1024

_C_KEYWORDS = frozenset(
    "auto break case char const continue default do double else enum extern float for goto if inline int long "
    "register restrict return short signed sizeof static struct switch typedef union unsigned void volatile while "
    "bool true false alignas alignof asm class namespace template this typename virtual new delete".split()
)
_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,62}$")
_SECTION_RE = re.compile(r"^[.A-Za-z_$][A-Za-z0-9_.$]{0,127}$")

# TFLite tensor type -> (C element type, numpy dtype name)
C_TYPES = {
    "int8": ("int8_t", "int8"),
    "uint8": ("uint8_t", "uint8"),
    "int16": ("int16_t", "int16"),
    "int32": ("int32_t", "int32"),
    "float32": ("float", "float32"),
    "bool": ("uint8_t", "bool"),
}


# --------------------------------------------------------------------------- options and sources


@dataclass(frozen=True)
class ExportOptions:
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


def check_c_name(name: str) -> str:
    """``name`` if it is a usable C identifier prefix, else a :class:`UsageError`."""
    if not isinstance(name, str) or not _NAME_RE.fullmatch(name) or name in _C_KEYWORDS or name in C_KEYWORDS:
        raise UsageError(
            f"--name {name!r} is not a C identifier (or is a C keyword)",
            "use letters, digits and underscores, starting with a letter or underscore (at most 63 characters)",
        )
    return name


def default_name(leaf: str) -> str:
    """A C identifier from a leaf name; the same rule as CMake's ``string(MAKE_C_IDENTIFIER)``."""
    name = re.sub(r"[^A-Za-z0-9_]", "_", leaf) or "model"
    if name[0].isdigit():
        name = "_" + name
    return name[:63]


def check_section(section: str) -> str:
    if not isinstance(section, str) or not _SECTION_RE.fullmatch(section) or ".." in section:
        raise UsageError(
            f"--section {section!r} is not a valid linker section name",
            "use letters, digits, '_', '.' and '$', e.g. nn_model or .rodata.nn_model",
        )
    return section


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
    variants = manifest.variants()
    compiled_variants = list(dict.fromkeys(r.variant for r in compiled if r.variant))
    if leaf is None:
        if len(compiled_variants) == 1:
            leaf = compiled_variants[0]
        elif not compiled_variants:
            raise InvalidInputError(
                f"{run_dir} holds no compiled model",
                "compile one first: `edgedeploy compile MODEL.tflite -t TARGET -o RUN_DIR`",
            )
        else:
            raise UsageError(
                f"{run_dir} holds {len(compiled_variants)} compiled variants", f"pass --leaf, one of: {', '.join(compiled_variants)}"
            )
    elif leaf not in variants:
        raise UsageError(
            f"{run_dir} has no variant '{leaf}'",
            f"variants in this run: {', '.join(variants) or 'none'}"
            + (f"; compiled: {', '.join(compiled_variants)}" if compiled_variants else ""),
        )
    leaf_compiled = [r for r in compiled if r.variant == leaf]
    leaf_targets = [r.target for r in leaf_compiled if r.target]
    if target is None:
        if len(leaf_targets) == 1:
            target = leaf_targets[0]
        else:
            raise UsageError(
                f"no --target given and '{leaf}' is compiled for {len(leaf_targets)} targets",
                f"pass --target, one of: {', '.join(leaf_targets) or 'none (compile it first)'}",
            )
    if target.endswith(".toml") or os.sep in target:
        from .targets import get_target

        target = get_target(target).name
    record = next((r for r in leaf_compiled if r.target == target), None)
    if record is None:
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


# --------------------------------------------------------------------------- pure C generation


def c_float(value: float) -> str:
    """A float32 constant that round-trips exactly (``0.00390625f``, ``1.0f``)."""
    value = float(value)
    if not math.isfinite(value):
        raise InvalidInputError(f"cannot write {value} as a C float constant", "check the model's quantization")
    import numpy as np

    text = np.format_float_positional(np.float32(value), unique=True, trim="0")
    if "e" not in text and len(text.replace("-", "").replace(".", "").lstrip("0")) > 12:
        text = np.format_float_scientific(np.float32(value), unique=True, trim="0")
    if "." not in text and "e" not in text:
        text += ".0"
    if text.endswith("."):
        text += "0"
    return text + "f"


def c_string(text: str) -> str:
    """A C string literal; anything outside printable ASCII becomes an octal escape."""
    out = []
    for byte in text.encode("utf-8"):
        ch = chr(byte)
        if ch in '"\\':
            out.append("\\" + ch)
        elif 0x20 <= byte < 0x7F and ch != "?":  # '?' escaped so no trigraph can form
            out.append(ch)
        else:
            out.append(f"\\{byte:03o}")
    return '"' + "".join(out) + '"'


def c_int(value: int) -> str:
    """An integer for a ``#define``: negative values in parentheses, so ``x-ZP`` stays ``x-(-128)``."""
    value = int(value)
    return f"({value})" if value < 0 else str(value)


def c_bytes(data: bytes, per_line: int = 12, indent: str = "    ") -> str:
    """``data`` as the lines of a C initializer: ``0x1c, 0x00, ...``."""
    lines = []
    for start in range(0, len(data), per_line):
        chunk = data[start : start + per_line]
        lines.append(indent + " ".join(f"0x{b:02x}," for b in chunk))
    return "\n".join(lines)


def c_numbers(values: Sequence[Any], ctype: str, per_line: int = 16, indent: str = "    ") -> str:
    """Numbers of one C type as the lines of an initializer."""
    if ctype == "float":
        items = [c_float(v) for v in values]
        per_line = min(per_line, 8)
    else:
        items = [str(int(v)) for v in values]
    lines = []
    for start in range(0, len(items), per_line):
        lines.append(indent + " ".join(f"{v}," for v in items[start : start + per_line]))
    return "\n".join(lines)


def model_attribute(section: str, alignment: int = MODEL_ALIGNMENT) -> str:
    """The GCC/Clang/Arm Compiler 6 attribute that aligns the model and names its section."""
    if alignment < 1 or alignment & (alignment - 1):
        raise UsageError(f"alignment {alignment} is not a power of two", "use 16 (what Ethos-U needs) or more")
    check_section(section)
    return f"__attribute__((aligned({alignment}), section({c_string(section)})))"


def round_up(value: int, multiple: int) -> int:
    return -(-int(value) // multiple) * multiple


def arena_size(planned_bytes: int, margin_bytes: int, alignment: int = ARENA_ALIGNMENT) -> int:
    """Tensor arena bytes: what Vela planned plus the runtime margin, rounded up to ``alignment``."""
    if planned_bytes < 0 or margin_bytes < 0:
        raise InvalidInputError(f"negative memory figure ({planned_bytes}, {margin_bytes})", "re-run the compile")
    return round_up(planned_bytes + margin_bytes, alignment)


def c_type_of(dtype: str) -> str:
    try:
        return C_TYPES[dtype][0]
    except KeyError:
        raise InvalidInputError(
            f"tensors of type {dtype} cannot be exported to C", f"supported types: {', '.join(C_TYPES)}"
        ) from None


def dtype_bytes(dtype: str) -> int:
    import numpy as np

    return np.dtype(C_TYPES[dtype][1]).itemsize


def elements(shape: Sequence[int]) -> int:
    n = 1
    for d in shape:
        n *= max(int(d), 1)
    return n


def guard_name(name: str, suffix: str = "H") -> str:
    return f"EDGEDEPLOY_{name.upper().lstrip('_')}_{suffix}"


def tensor_defines(prefix: str, kind: str, index: int, t: TensorInfo) -> list[str]:
    """``#define`` lines describing one input or output tensor."""
    p = f"{prefix}_{kind}_{index}"
    ctype = c_type_of(t.dtype)
    n = elements(t.shape)
    lines = [
        f"#define {p}_NAME {c_string(t.name)}",
        f"#define {p}_DTYPE {c_string(t.dtype)}",
        f"#define {p}_CTYPE {ctype}",
        f"#define {p}_RANK {len(t.shape)}",
        f"#define {p}_DIMS {{{', '.join(str(int(d)) for d in t.shape)}}}",
        f"#define {p}_ELEMENTS {n}",
        f"#define {p}_BYTES {n * dtype_bytes(t.dtype)}",
    ]
    if len(t.scale) == 1:
        lines += [
            f"#define {p}_QUANTIZED 1",
            f"#define {p}_SCALE {c_float(t.scale[0])}",
            f"#define {p}_ZERO_POINT {c_int(int(t.zero_point[0]) if t.zero_point else 0)}",
        ]
    elif len(t.scale) > 1:
        lines += [f"#define {p}_QUANTIZED 2 /* per-axis: {len(t.scale)} scales, see manifest.json */"]
    else:
        lines += [f"#define {p}_QUANTIZED 0"]
    return lines


@dataclass(frozen=True)
class BundleSpec:
    """Everything the generated C and CMake files say."""

    name: str
    leaf: str
    target: str
    accelerator_config: str
    section: str
    alignment: int
    model_size: int
    model_sha256: str
    vela_version: str
    memory_mode: str
    vela_sram_bytes: int
    vela_dram_bytes: int | None
    runtime_margin_bytes: int
    tensor_arena_bytes: int
    fast_memory_bytes: int | None
    inputs: tuple[TensorInfo, ...]
    outputs: tuple[TensorInfo, ...]
    labels: tuple[str, ...] | None = None

    @property
    def prefix(self) -> str:
        return self.name.upper()


def _banner(spec: BundleSpec, what: str) -> str:
    return (
        f"/* {c_comment(what)}\n"
        f" * Generated by edgedeploy {__version__}: '{c_comment(spec.leaf)}' compiled by Vela "
        f"{c_comment(spec.vela_version)} for {c_comment(spec.target)}\n"
        f" * ({c_comment(spec.accelerator_config)}). Do not edit: re-run `edgedeploy export` instead.\n"
        f" * Vela model sha256 {c_comment(spec.model_sha256)}\n"
        " */\n"
    )


def render_model_header(spec: BundleSpec) -> str:
    p = spec.prefix
    lines = [
        _banner(spec, f"{spec.name}.h: the compiled model and the sizes firmware needs."),
        f"#ifndef {guard_name(spec.name)}",
        f"#define {guard_name(spec.name)}",
        "",
        "#include <stddef.h>",
        "#include <stdint.h>",
        "",
        "#ifdef __cplusplus",
        'extern "C" {',
        "#endif",
        "",
        f"#define {p}_TARGET {c_string(spec.target)}",
        f"#define {p}_NPU {c_string(spec.accelerator_config)}",
        f"#define {p}_MODEL_SHA256 {c_string(spec.model_sha256)}",
        "",
        "/* The Vela-compiled model (a .tflite flatbuffer with the ethos-u operator). */",
        f"#define {p}_MODEL_SIZE {spec.model_size}u",
        f"#define {p}_MODEL_ALIGNMENT {spec.alignment}",
        f"#define {p}_MODEL_SECTION {c_string(spec.section)}",
        "",
        f"/* Tensor arena: Vela's planned {'DRAM' if spec.fast_memory_bytes is not None else 'SRAM'} "
        f"({spec.memory_mode}) plus a margin for the runtime, rounded up to {ARENA_ALIGNMENT} bytes. */",
        f"#define {p}_VELA_SRAM_BYTES {spec.vela_sram_bytes}u",
    ]
    if spec.vela_dram_bytes is not None:
        lines.append(f"#define {p}_VELA_DRAM_BYTES {spec.vela_dram_bytes}u")
    lines += [
        f"#define {p}_RUNTIME_MARGIN_BYTES {spec.runtime_margin_bytes}u",
        f"#define {p}_TENSOR_ARENA_SIZE {spec.tensor_arena_bytes}u",
        f"#define {p}_TENSOR_ARENA_ALIGNMENT {ARENA_ALIGNMENT}",
    ]
    if spec.fast_memory_bytes is not None:
        lines += [
            "/* NPU cache in SRAM (Vela's arena cache; the ethos-u driver's fast memory). */",
            f"#define {p}_FAST_MEMORY_SIZE {spec.fast_memory_bytes}u",
        ]
    lines += ["", f"#define {p}_NUM_INPUTS {len(spec.inputs)}"]
    for i, t in enumerate(spec.inputs):
        lines += tensor_defines(p, "INPUT", i, t)
    lines += ["", f"#define {p}_NUM_OUTPUTS {len(spec.outputs)}"]
    for i, t in enumerate(spec.outputs):
        lines += tensor_defines(p, "OUTPUT", i, t)
    if spec.labels:
        lines += [
            "",
            "/* Class labels, in output index order. */",
            f"#define {p}_NUM_LABELS {len(spec.labels)}",
            f"#define {p}_LABELS {{{', '.join(c_string(s) for s in spec.labels)}}}",
        ]
    lines += [
        "",
        f"extern const uint8_t {spec.name}_model[{p}_MODEL_SIZE];",
        f"extern const size_t {spec.name}_model_len;",
    ]
    if spec.labels:
        lines.append(f"extern const char *const {spec.name}_labels[{p}_NUM_LABELS];")
    lines += ["", "#ifdef __cplusplus", "}", "#endif", "", f"#endif /* {guard_name(spec.name)} */", ""]
    return "\n".join(lines)


def render_model_source(spec: BundleSpec, model: bytes) -> str:
    if len(model) != spec.model_size:
        raise InvalidInputError(f"model is {len(model)} bytes, expected {spec.model_size}", "re-run the export")
    p = spec.prefix
    parts = [
        _banner(spec, f"{spec.name}.c: the compiled model, aligned and placed in section {spec.section}."),
        f'#include "{spec.name}.h"',
        "",
        f"const uint8_t {spec.name}_model[{p}_MODEL_SIZE] {model_attribute(spec.section, spec.alignment)} = {{",
        c_bytes(model),
        "};",
        "",
        f"const size_t {spec.name}_model_len = {p}_MODEL_SIZE;",
    ]
    if spec.labels:
        parts += ["", f"const char *const {spec.name}_labels[{p}_NUM_LABELS] = {p}_LABELS;"]
    return "\n".join(parts) + "\n"


@dataclass(frozen=True)
class GoldenSet:
    """Golden cases: model-typed inputs and the reference outputs, one row per case."""

    inputs: tuple[Any, ...]  # numpy arrays [N, *shape[1:]] per model input
    outputs: tuple[Any, ...]  # numpy arrays [N, *shape[1:]] per model output
    argmax: Any  # int32 [N]: arg max of output 0 per case
    label: Any  # int32 [N]: the data's class (-1 unknown)
    row: Any  # int64 [N]: row in the data file
    float_inputs: tuple[Any, ...] = ()  # the float features before quantization

    @property
    def count(self) -> int:
        return int(self.argmax.shape[0])


def render_golden_header(spec: BundleSpec, golden: GoldenSet, reference: str) -> str:
    p = spec.prefix
    g = guard_name(spec.name, "GOLDEN_H")
    lines = [
        _banner(spec, f"{spec.name}_golden.h: golden vectors for hardware-in-the-loop tests."),
        f"#ifndef {g}",
        f"#define {g}",
        "",
        "#include <stdint.h>",
        "",
        f'#include "{spec.name}.h"',
        "",
        "#ifdef __cplusplus",
        'extern "C" {',
        "#endif",
        "",
        f"/* Expected outputs from {c_comment(reference)}. */",
        f"#define {p}_GOLDEN_COUNT {golden.count}",
        f"#define {p}_GOLDEN_REFERENCE {c_string(reference)}",
        "",
    ]
    for i in range(len(golden.inputs)):
        lines.append(
            f"extern const {p}_INPUT_{i}_CTYPE {spec.name}_golden_input_{i}[{p}_GOLDEN_COUNT][{p}_INPUT_{i}_ELEMENTS];"
        )
    for i in range(len(golden.outputs)):
        lines.append(
            f"extern const {p}_OUTPUT_{i}_CTYPE {spec.name}_golden_output_{i}[{p}_GOLDEN_COUNT][{p}_OUTPUT_{i}_ELEMENTS];"
        )
    lines += [
        "/* Index of the largest element of output 0, per case. */",
        f"extern const int32_t {spec.name}_golden_argmax[{p}_GOLDEN_COUNT];",
        "/* The class the data file gives each case (-1: unknown). */",
        f"extern const int32_t {spec.name}_golden_label[{p}_GOLDEN_COUNT];",
        "",
        "#ifdef __cplusplus",
        "}",
        "#endif",
        "",
        f"#endif /* {g} */",
        "",
    ]
    return "\n".join(lines)


def _rows(name: str, decl: str, array: Any, ctype: str) -> list[str]:
    lines = [f"{decl} = {{"]
    for r in range(array.shape[0]):
        lines.append("    {")
        lines.append(c_numbers(array[r].reshape(-1).tolist(), ctype, indent="        "))
        lines.append("    },")
    lines.append("};")
    return lines


def render_golden_source(spec: BundleSpec, golden: GoldenSet) -> str:
    p = spec.prefix
    lines = [_banner(spec, f"{spec.name}_golden.c: golden vectors."), f'#include "{spec.name}_golden.h"', ""]
    for i, (arr, t) in enumerate(zip(golden.inputs, spec.inputs)):
        decl = f"const {p}_INPUT_{i}_CTYPE {spec.name}_golden_input_{i}[{p}_GOLDEN_COUNT][{p}_INPUT_{i}_ELEMENTS]"
        lines += _rows(spec.name, decl, arr, c_type_of(t.dtype)) + [""]
    for i, (arr, t) in enumerate(zip(golden.outputs, spec.outputs)):
        decl = f"const {p}_OUTPUT_{i}_CTYPE {spec.name}_golden_output_{i}[{p}_GOLDEN_COUNT][{p}_OUTPUT_{i}_ELEMENTS]"
        lines += _rows(spec.name, decl, arr, c_type_of(t.dtype)) + [""]
    lines += [f"const int32_t {spec.name}_golden_argmax[{p}_GOLDEN_COUNT] = {{"]
    lines += [c_numbers(golden.argmax.tolist(), "int32_t"), "};", ""]
    lines += [f"const int32_t {spec.name}_golden_label[{p}_GOLDEN_COUNT] = {{"]
    lines += [c_numbers(golden.label.tolist(), "int32_t"), "};"]
    return "\n".join(lines) + "\n"


def render_cmakelists(spec: BundleSpec, has_golden: bool) -> str:
    n = spec.name
    lines = [
        f"# Generated by edgedeploy {__version__}. Do not edit: re-run `edgedeploy export` instead.",
        f"# add_subdirectory() this folder to get the library edgedeploy::{n} (the model and {n}.h)"
        + (f" and edgedeploy::{n}_golden (golden vectors)." if has_golden else "."),
        "cmake_minimum_required(VERSION 3.18)",
        "if(CMAKE_SOURCE_DIR STREQUAL CMAKE_CURRENT_SOURCE_DIR)",
        f"  project(edgedeploy_{n} LANGUAGES C)",
        "endif()",
        "",
        f"add_library(edgedeploy_{n} STATIC ${{CMAKE_CURRENT_SOURCE_DIR}}/{n}.c)",
        f"target_include_directories(edgedeploy_{n} PUBLIC ${{CMAKE_CURRENT_SOURCE_DIR}})",
        f"add_library(edgedeploy::{n} ALIAS edgedeploy_{n})",
    ]
    if has_golden:
        lines += [
            "",
            f"add_library(edgedeploy_{n}_golden STATIC ${{CMAKE_CURRENT_SOURCE_DIR}}/{n}_golden.c)",
            f"target_link_libraries(edgedeploy_{n}_golden PUBLIC edgedeploy_{n})",
            f"add_library(edgedeploy::{n}_golden ALIAS edgedeploy_{n}_golden)",
        ]
    return "\n".join(lines) + "\n"


def render_cmake_module(edgedeploy_hint: str | None = None) -> str:
    """``edgedeploy.cmake``: ``edgedeploy_add_model()`` regenerates model sources at build time."""
    hint = f' HINTS "{edgedeploy_hint}"' if edgedeploy_hint else ""
    return f"""\
# Generated by edgedeploy {__version__}. include() this file from a firmware CMakeLists.txt.
#
#   edgedeploy_add_model(TARGET <lib> RUN_DIR <dir> NPU <target> [LEAF <leaf>] [NAME <c_name>]
#                        [SECTION <section>] [GOLDEN <n>] [DATA <file.npz>] [OUTPUT_DIR <dir>])
#
# creates the static library <lib> (and <lib>_golden when GOLDEN > 0) from the sources that
# `edgedeploy export` writes into OUTPUT_DIR (default: ${{CMAKE_CURRENT_BINARY_DIR}}/edgedeploy/<lib>);
# the custom target <lib>_export runs the export.
# The sources are regenerated at build time when the compiled model, the int8 model, the data file
# or any of these settings change. NAME defaults to LEAF made a C identifier, GOLDEN to 0.
# Set EDGEDEPLOY_EXECUTABLE to choose the edgedeploy command.
cmake_minimum_required(VERSION 3.18)
include_guard(GLOBAL)

find_program(EDGEDEPLOY_EXECUTABLE edgedeploy{hint} DOC "edgedeploy command used to regenerate model sources")

function(edgedeploy_add_model)
  cmake_parse_arguments(PARSE_ARGV 0 ED "" "TARGET;RUN_DIR;LEAF;NPU;NAME;SECTION;GOLDEN;DATA;OUTPUT_DIR" "")
  foreach(required TARGET RUN_DIR NPU)
    if(NOT ED_${{required}})
      message(FATAL_ERROR "edgedeploy_add_model: ${{required}} is required")
    endif()
  endforeach()
  if(ED_UNPARSED_ARGUMENTS)
    message(FATAL_ERROR "edgedeploy_add_model: unknown arguments ${{ED_UNPARSED_ARGUMENTS}}")
  endif()
  if(NOT EDGEDEPLOY_EXECUTABLE)
    message(FATAL_ERROR "edgedeploy_add_model: the edgedeploy command was not found; set EDGEDEPLOY_EXECUTABLE")
  endif()
  get_filename_component(run "${{ED_RUN_DIR}}" ABSOLUTE)
  if(ED_LEAF)
    set(leaf "${{ED_LEAF}}")
  else()
    file(GLOB leaves LIST_DIRECTORIES true RELATIVE "${{run}}/compile" "${{run}}/compile/*")
    list(LENGTH leaves n_leaves)
    if(NOT n_leaves EQUAL 1)
      message(FATAL_ERROR "edgedeploy_add_model: ${{run}} holds ${{n_leaves}} compiled variants (${{leaves}}); pass LEAF")
    endif()
    set(leaf "${{leaves}}")
  endif()
  if(ED_NAME)
    set(name "${{ED_NAME}}")
  else()
    string(MAKE_C_IDENTIFIER "${{leaf}}" name)
  endif()
  if(NOT DEFINED ED_GOLDEN OR ED_GOLDEN STREQUAL "")
    set(ED_GOLDEN 0)
  endif()
  if(ED_OUTPUT_DIR)
    get_filename_component(out "${{ED_OUTPUT_DIR}}" ABSOLUTE BASE_DIR "${{CMAKE_CURRENT_BINARY_DIR}}")
  else()
    set(out "${{CMAKE_CURRENT_BINARY_DIR}}/edgedeploy/${{ED_TARGET}}")
  endif()
  file(GLOB deps
    "${{run}}/compile/${{leaf}}/${{ED_NPU}}/*_vela.tflite"
    "${{run}}/convert/${{leaf}}/*.tflite"
    "${{run}}/import/${{leaf}}/*.tflite")
  if(NOT deps)
    message(FATAL_ERROR "edgedeploy_add_model: ${{run}} holds no model '${{leaf}}' compiled for ${{ED_NPU}}; "
                        "run `edgedeploy compile MODEL.tflite -t ${{ED_NPU}} -o ${{run}}` first")
  endif()
  set(args export "${{run}}" --leaf "${{leaf}}" --target "${{ED_NPU}}" --out "${{out}}" --name "${{name}}"
           --golden "${{ED_GOLDEN}}")
  if(ED_SECTION)
    list(APPEND args --section "${{ED_SECTION}}")
  endif()
  if(ED_DATA)
    get_filename_component(data "${{ED_DATA}}" ABSOLUTE)
    list(APPEND args --data "${{data}}")
    list(APPEND deps "${{data}}")
  endif()
  # A stamp that changes only when the settings do, so a changed setting regenerates the sources.
  set(stamp "${{CMAKE_CURRENT_BINARY_DIR}}/edgedeploy/${{ED_TARGET}}.settings")
  string(REPLACE ";" " " settings "${{args}}")
  file(CONFIGURE OUTPUT "${{stamp}}" CONTENT "${{settings}}\\n" @ONLY)
  set(sources "${{out}}/${{name}}.c")
  set(outputs "${{out}}/${{name}}.c" "${{out}}/${{name}}.h")
  if(ED_GOLDEN GREATER 0)
    list(APPEND outputs "${{out}}/${{name}}_golden.c" "${{out}}/${{name}}_golden.h")
  endif()
  add_custom_command(
    OUTPUT ${{outputs}}
    COMMAND "${{EDGEDEPLOY_EXECUTABLE}}" ${{args}}
    DEPENDS ${{deps}} "${{stamp}}"
    COMMENT "edgedeploy: exporting ${{leaf}} for ${{ED_NPU}}"
    VERBATIM)
  # One target runs the export, so parallel builds of the libraries below never run it twice.
  add_custom_target(${{ED_TARGET}}_export DEPENDS ${{outputs}})
  add_library(${{ED_TARGET}} STATIC ${{sources}})
  target_include_directories(${{ED_TARGET}} PUBLIC "${{out}}")
  add_dependencies(${{ED_TARGET}} ${{ED_TARGET}}_export)
  if(ED_GOLDEN GREATER 0)
    add_library(${{ED_TARGET}}_golden STATIC "${{out}}/${{name}}_golden.c")
    target_link_libraries(${{ED_TARGET}}_golden PUBLIC ${{ED_TARGET}})
    add_dependencies(${{ED_TARGET}}_golden ${{ED_TARGET}}_export)
  endif()
endfunction()
"""


# --------------------------------------------------------------------------- data and golden vectors


@dataclass
class EvalData:
    path: Path
    x: Any  # float32 evaluation rows, shaped like the model input (without the batch axis)
    y: Any | None  # int class per row, or None
    rows: Any  # row index of each x in the file
    labels: list[str] | None
    split: str  # how the evaluation rows were chosen
    sha256: str = ""


def load_eval_data(path: Path, input_shape: Sequence[int], num_classes: int) -> EvalData:
    """The evaluation split of a data file (see :mod:`edgedeploy.data`), with each row's index in the file."""
    import numpy as np

    from .data import EVAL, load_dataset

    ds = load_dataset(Path(path), tuple(int(d) for d in input_shape), int(num_classes))
    info = ds.describe()
    if ds.layout == "x/y/split":
        with np.load(ds.path, allow_pickle=False) as npz:
            rows = np.flatnonzero(npz["split"] == EVAL).astype(np.int64)
    else:
        rows = np.arange(len(ds.x_eval), dtype=np.int64)
    return EvalData(ds.path, ds.x_eval, ds.y_eval, rows, ds.labels, str(info["eval_split"]), ds.sha256)


def select_cases(y: Any | None, n: int) -> list[int]:
    """Positions of ``n`` cases: the first example of each class in turn, in file order."""
    import numpy as np

    if n <= 0:
        return []
    y = np.asarray(y)
    seen: dict[int, int] = {}
    keys = []
    for i, cls in enumerate(y.tolist()):
        rank = seen.get(cls, 0)
        seen[cls] = rank + 1
        keys.append((rank, cls, i))
    keys.sort()
    return [i for _, _, i in keys[:n]]


def quantize(x: Any, scale: float, zero_point: int, dtype: str) -> Any:
    """Float values to a quantized integer type, as TFLite's QUANTIZE kernel does."""
    import numpy as np

    info = np.iinfo(np.dtype(C_TYPES[dtype][1]))
    v = np.asarray(x, dtype=np.float32) / np.float32(scale)
    r = np.sign(v) * np.floor(np.abs(v).astype(np.float64) + 0.5)  # round half away from zero
    q = np.clip(r + int(zero_point), info.min, info.max)
    return q.astype(np.dtype(C_TYPES[dtype][1]))


def dequantize(q: Any, scale: float, zero_point: int) -> Any:
    import numpy as np

    return (np.asarray(q, dtype=np.float32) - np.float32(zero_point)) * np.float32(scale)


def prepare_inputs(x: Any, t: TensorInfo) -> tuple[Any, Any]:
    """Float rows typed for model input ``t``: (model-typed array, float array)."""
    import numpy as np

    xf = np.asarray(x, dtype=np.float32)
    if t.dtype in ("int8", "uint8", "int16"):
        if len(t.scale) != 1:
            raise InvalidInputError(f"model input '{t.name}' has no per-tensor scale", "export a per-tensor quantized model")
        return quantize(xf, t.scale[0], t.zero_point[0] if t.zero_point else 0, t.dtype), xf
    if t.dtype == "float32":
        return xf, xf
    raise InvalidInputError(f"model input '{t.name}' has type {t.dtype}", "golden vectors need int8, uint8, int16 or float32 inputs")


def _import_tflm():
    try:
        from tflite_micro.python.tflite_micro import runtime
    except ImportError as exc:
        raise ToolMissingError(
            "the TensorFlow Lite Micro interpreter (tflite-micro) is not installed",
            f"pip install --pre {TFLM_PIN}",
        ) from exc
    return runtime


def package_version(name: str) -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(name)
    except PackageNotFoundError:
        return "missing"


def _one_case(arr: Any, c: int, shape: Sequence[int]) -> Any:
    """Case ``c`` of ``arr`` shaped as the model's input tensor."""
    import numpy as np

    return np.ascontiguousarray(arr[c].reshape(tuple(int(d) for d in shape)))


def _drop_batch(out: Any) -> Any:
    import numpy as np

    out = np.array(out)
    return out[0].copy() if out.ndim > 1 and out.shape[0] == 1 else out.copy()


def run_tflm(model: bytes, inputs: Sequence[Any], input_shapes: Sequence[Sequence[int]], n_outputs: int) -> list[Any]:
    """Run each case through TFLM's reference kernels; per output an array [N, ...]."""
    import numpy as np

    runtime = _import_tflm()
    try:
        interp = runtime.Interpreter.from_bytes(bytes(model), arena_size=max(10 * len(model), HOST_ARENA_MIN))
    except (RuntimeError, ValueError) as exc:
        raise ToolFailedError(
            f"TensorFlow Lite Micro could not load the int8 model ({exc})",
            "check that every operator has a TFLM reference kernel",
        ) from exc
    n = inputs[0].shape[0]
    outs: list[list[Any]] = [[] for _ in range(n_outputs)]
    for c in range(n):
        interp.reset()
        for i, arr in enumerate(inputs):
            interp.set_input(_one_case(arr, c, input_shapes[i]), i)
        try:
            interp.invoke()
        except RuntimeError as exc:
            raise ToolFailedError(f"TensorFlow Lite Micro failed on golden case {c} ({exc})") from exc
        for j in range(n_outputs):
            outs[j].append(_drop_batch(interp.get_output(j)))
    return [np.stack(o) for o in outs]


def run_tflite(
    model: bytes, inputs: Sequence[Any], input_shapes: Sequence[Sequence[int]], n_outputs: int, reference: bool = False
) -> list[Any]:
    """Run each case through ``tf.lite.Interpreter``: its default (XNNPACK) kernels, or its reference kernels."""
    import warnings

    import numpy as np

    from . import tfenv

    tf = tfenv.load().tf
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        resolver = tf.lite.experimental.OpResolverType
        interp = tf.lite.Interpreter(
            model_content=bytes(model), experimental_op_resolver_type=resolver.BUILTIN_REF if reference else resolver.AUTO
        )
    interp.allocate_tensors()
    ins, outs_d = interp.get_input_details(), interp.get_output_details()
    n = inputs[0].shape[0]
    outs: list[list[Any]] = [[] for _ in range(n_outputs)]
    for c in range(n):
        for i, arr in enumerate(inputs):
            interp.set_tensor(ins[i]["index"], _one_case(arr, c, input_shapes[i]))
        interp.invoke()
        for j in range(n_outputs):
            outs[j].append(_drop_batch(interp.get_tensor(outs_d[j]["index"])))
    return [np.stack(o) for o in outs]


def compare_outputs(reference: Sequence[Any], other: Sequence[Any]) -> dict[str, Any]:
    """How far ``other`` is from ``reference``: largest absolute difference, share of elements that differ."""
    import numpy as np

    total = differing = 0
    max_diff = 0.0
    for a, b in zip(reference, other):
        da = np.asarray(a, dtype=np.float64)
        db = np.asarray(b, dtype=np.float64)
        diff = np.abs(da - db)
        total += diff.size
        differing += int(np.count_nonzero(diff))
        max_diff = max(max_diff, float(diff.max()) if diff.size else 0.0)
    a0, b0 = np.asarray(reference[0]), np.asarray(other[0])
    n = a0.shape[0]
    argmax_same = int(np.sum(a0.reshape(n, -1).argmax(1) == b0.reshape(n, -1).argmax(1)))
    return {
        "max_abs_diff": int(max_diff) if float(max_diff).is_integer() else max_diff,
        "fraction_differing": differing / total if total else 0.0,
        "elements": total,
        "elements_differing": differing,
        "argmax_agreement": argmax_same / n if n else 1.0,
    }


def make_golden(model: bytes, tflite: TfliteModel, data: EvalData, n: int) -> GoldenSet:
    import numpy as np

    if len(tflite.inputs) != 1:
        raise UsageError(
            f"golden vectors need a single-input model; {tflite.path} has {len(tflite.inputs)} inputs",
            "pass --golden 0",
        )
    picks = select_cases(data.y, n) if data.y is not None else list(range(min(n, data.x.shape[0])))
    if len(picks) < n:
        log.warning("only %d evaluation rows in %s; writing %d golden cases", len(picks), data.path, len(picks))
    picks_arr = np.asarray(picks, dtype=np.int64)
    model_in, float_in = prepare_inputs(data.x[picks_arr], tflite.inputs[0])
    outputs = run_tflm(model, [model_in], [tflite.inputs[0].shape], len(tflite.outputs))
    argmax = outputs[0].reshape(outputs[0].shape[0], -1).argmax(axis=1).astype(np.int32)
    label = (data.y[picks_arr] if data.y is not None else np.full(len(picks), -1)).astype(np.int32)
    is_quantized_input = tflite.inputs[0].dtype != "float32"
    return GoldenSet(
        inputs=(model_in,),
        outputs=tuple(outputs),
        argmax=argmax,
        label=label,
        row=data.rows[picks_arr].astype(np.int64),
        float_inputs=(float_in,) if is_quantized_input else (),
    )


def npz_bytes(arrays: Mapping[str, Any]) -> bytes:
    """An ``.npz`` (what ``numpy.savez`` writes) with fixed timestamps, so equal arrays give equal bytes."""
    import numpy as np

    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", compression=zipfile.ZIP_STORED) as zf:
        for key, value in arrays.items():
            member = io.BytesIO()
            np.lib.format.write_array(member, np.asarray(value), allow_pickle=False)
            info = zipfile.ZipInfo(f"{key}.npy", date_time=(1980, 1, 1, 0, 0, 0))
            info.external_attr = 0o644 << 16
            zf.writestr(info, member.getvalue())
    return buf.getvalue()


def golden_arrays(golden: GoldenSet, labels: Sequence[str] | None) -> dict[str, Any]:
    import numpy as np

    arrays: dict[str, Any] = {}
    for i, a in enumerate(golden.inputs):
        arrays[f"input_{i}"] = a
    for i, a in enumerate(golden.float_inputs):
        arrays[f"input_{i}_float"] = a
    for i, a in enumerate(golden.outputs):
        arrays[f"output_{i}"] = a
    arrays["argmax"] = golden.argmax
    arrays["label"] = golden.label
    arrays["row"] = golden.row
    if labels:
        arrays["labels"] = np.asarray(list(labels), dtype=str)
    return arrays


# --------------------------------------------------------------------------- the output folder


@dataclass
class OutDirState:
    path: Path
    exists: bool
    owned: set[str] = field(default_factory=set)  # files an earlier export wrote
    foreign: list[str] = field(default_factory=list)  # entries edgedeploy did not write


def inspect_out_dir(out: Path) -> OutDirState:
    """What is already in ``out``: files an earlier export recorded as its own, and anything else."""
    out = Path(out)
    if not out.exists():
        return OutDirState(out, False)
    if not out.is_dir():
        raise UsageError(f"--out {out} is a file", "pass a folder path for the firmware bundle")
    owned: set[str] = set()
    manifest_path = out / BUNDLE_MANIFEST
    if manifest_path.is_file():
        try:
            data = json.loads(manifest_path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            data = {}
        if isinstance(data, dict) and data.get("schema") == BUNDLE_SCHEMA:
            owned = {BUNDLE_MANIFEST} | {str(f) for f in (data.get("files") or {})}
    foreign = sorted(p.name for p in out.iterdir() if p.name not in owned or not p.is_file())
    return OutDirState(out, True, owned & {p.name for p in out.iterdir()}, foreign)


def _refuse_foreign(out: Path, state: OutDirState, force: bool) -> None:
    if state.foreign and not force:
        shown = ", ".join(state.foreign[:5]) + (f" and {len(state.foreign) - 5} more" if len(state.foreign) > 5 else "")
        raise UsageError(
            f"--out {out} holds files edgedeploy did not write ({shown})",
            "pass an empty or new folder, or --force to write beside them (they are left as they are)",
        )


def _write_bundle(out: Path, files: Mapping[str, bytes], state: OutDirState, force: bool) -> None:
    """Write ``files`` (manifest.json last) into ``out`` through a staging folder."""
    _refuse_foreign(out, state, force)
    clash = sorted(set(state.foreign) & set(files))
    if clash:
        raise UsageError(
            f"--out {out} holds {', '.join(clash)}, which edgedeploy did not write and would overwrite",
            "move those files away, or choose another --out or --name",
        )
    staged = new_staging_dir(out)
    try:
        for name, data in files.items():
            (staged / name).write_bytes(data)
        if not state.foreign:
            promote(staged, out)  # ``out`` is absent, empty, or holds only an earlier bundle
            return
        for name in [n for n in files if n != BUNDLE_MANIFEST] + [BUNDLE_MANIFEST]:
            os.replace(staged / name, out / name)
        for stale in sorted(state.owned - set(files)):
            if (out / stale).is_file() and not (out / stale).is_symlink():
                (out / stale).unlink(missing_ok=True)
    finally:
        shutil.rmtree(staged, ignore_errors=True)


# --------------------------------------------------------------------------- the stage


@dataclass
class ExportResult:
    out: Path
    manifest: dict[str, Any]
    files: list[str]
    warnings: list[str] = field(default_factory=list)


def _memory_plan(src: ExportSource) -> tuple[dict[str, Any], list[str]]:
    rec = src.compile_record
    warnings: list[str] = []
    sram = rec.metric("sram_bytes")
    if sram is None:
        raise InvalidInputError(
            f"the compile record {rec.id} in {src.manifest.path} has no SRAM figure",
            f"compile it again: {_compile_hint(src.manifest, src.leaf, src.target)}",
        )
    dram = rec.metric("dram_bytes")
    memory = src.target_info.get("memory") or {}
    if memory.get("runtime_margin_bytes") is not None:
        margin, margin_source = int(memory["runtime_margin_bytes"]), f"target {src.target} memory.runtime_margin_bytes"
    else:
        margin, margin_source = DEFAULT_RUNTIME_MARGIN, "edgedeploy default for NPU-only targets"
    mode = str((src.target_info.get("vela") or {}).get("memory_mode", ""))
    dedicated = mode.startswith("Dedicated_Sram")
    if dedicated:
        if dram is None:
            raise InvalidInputError(
                f"the compile record {rec.id} has no DRAM figure, needed in memory mode {mode}", "re-run the compile"
            )
        planned, fast = int(dram), int(sram)
        warnings.append(
            f"memory mode {mode}: the tensor arena is sized from Vela's DRAM figure, which also counts "
            "read-only data, so it is an upper bound"
        )
    else:
        planned, fast = int(sram), None
    return {
        "memory_mode": mode,
        "vela_sram_bytes": int(sram),
        "vela_dram_bytes": None if dram is None else int(dram),
        "planned_bytes": planned,
        "planned_from": "vela dram_bytes" if dedicated else "vela sram_bytes",
        "runtime_margin_bytes": margin,
        "runtime_margin_source": margin_source,
        "tensor_arena_bytes": arena_size(planned, margin),
        "tensor_arena_alignment": ARENA_ALIGNMENT,
        "fast_memory_bytes": fast,
    }, warnings


def resolve_section(section: str | None, target_info: Mapping[str, Any]) -> tuple[str, str]:
    if section:
        return check_section(section), "--section"
    memory = target_info.get("memory") or {}
    if memory.get("model_section"):
        return check_section(str(memory["model_section"])), f"target {target_info.get('name')} memory.model_section"
    return DEFAULT_SECTION, "edgedeploy default for NPU-only targets"


def _check_io(vela: TfliteModel, int8: TfliteModel) -> list[str]:
    def key(t: TensorInfo):
        return (tuple(t.shape), t.dtype, tuple(round(s, 9) for s in t.scale), tuple(t.zero_point))

    if [key(t) for t in vela.inputs] != [key(t) for t in int8.inputs] or [key(t) for t in vela.outputs] != [
        key(t) for t in int8.outputs
    ]:
        return [
            f"the inputs/outputs of the Vela model {vela.path.name} differ from the int8 model's; "
            "the header describes the Vela model's"
        ]
    return []


def _labels_for(src: ExportSource, data: EvalData | None, n_classes: int | None) -> tuple[list[str] | None, str | None, list[str]]:
    labels, origin = None, None
    recorded = src.data_info.get("labels")
    if recorded:
        labels, origin = [str(s) for s in recorded], f"{src.int8_record.id} details.data.labels"
    elif data is not None and data.labels:
        labels, origin = data.labels, f"{data.path.name} labels"
    if labels is not None and n_classes is not None and len(labels) != n_classes:
        return None, None, [f"{len(labels)} labels ({origin}) but output 0 has {n_classes} values; labels left out"]
    return labels, origin, []


def export_bundle(run_dir: Path, options: ExportOptions) -> ExportResult:
    """``edgedeploy export``: write the firmware bundle of one (leaf, target) pair of a run."""
    import numpy as np

    options.check()
    src = locate(Path(run_dir), options.leaf, options.target)
    out = Path(options.out)
    state = inspect_out_dir(out)
    _refuse_foreign(out, state, options.force)  # before any slow work
    name = options.name or default_name(src.leaf)
    check_c_name(name)
    section, section_source = resolve_section(options.section, src.target_info)
    memory, warnings = _memory_plan(src)

    vela_bytes = src.vela_model.read_bytes()
    int8_bytes = src.int8_model.read_bytes()
    vela_model = read_tflite(src.vela_model)
    int8_model = read_tflite(src.int8_model)
    warnings += _check_io(vela_model, int8_model)
    if not vela_model.has_ethos_u_op():
        warnings.append(f"{src.vela_model.name} holds no ethos-u operator: the whole model runs on the CPU")
    io_model = vela_model
    for t in io_model.inputs + io_model.outputs:
        c_type_of(t.dtype)

    data_path = options.data or (Path(src.data_info["path"]) if src.data_info.get("path") else None)
    n_golden = options.golden if options.golden is not None else (DEFAULT_GOLDEN if data_path else 0)
    if n_golden > 0 and data_path is None:
        raise UsageError(
            f"--golden {n_golden} needs evaluation data, and '{src.leaf}' in {src.run_dir} records none",
            "pass --data DATA.npz (or --golden 0)",
        )
    n_classes = elements(io_model.outputs[0].shape[1:]) if io_model.outputs else None
    data = None
    if data_path is not None:
        in_shape = int8_model.inputs[0].shape if int8_model.inputs else ()
        data = load_eval_data(data_path, in_shape[1:] if len(in_shape) > 1 else in_shape, n_classes or 0)
    labels, labels_origin, label_warnings = _labels_for(src, data, n_classes)
    warnings += label_warnings

    vela_version = (src.compile_record.tool.version if src.compile_record.tool else None) or src.manifest.tools.get(
        "ethos-u-vela", "unknown"
    )
    spec = BundleSpec(
        name=name,
        leaf=src.leaf,
        target=src.target,
        accelerator_config=str(src.target_info.get("accelerator_config", "")),
        section=section,
        alignment=MODEL_ALIGNMENT,
        model_size=len(vela_bytes),
        model_sha256=sha256_bytes(vela_bytes),
        vela_version=vela_version,
        memory_mode=memory["memory_mode"],
        vela_sram_bytes=memory["vela_sram_bytes"],
        vela_dram_bytes=memory["vela_dram_bytes"],
        runtime_margin_bytes=memory["runtime_margin_bytes"],
        tensor_arena_bytes=memory["tensor_arena_bytes"],
        fast_memory_bytes=memory["fast_memory_bytes"],
        inputs=io_model.inputs,
        outputs=io_model.outputs,
        labels=tuple(labels) if labels else None,
    )
    files: dict[str, bytes] = {
        f"{name}.h": render_model_header(spec).encode(),
        f"{name}.c": render_model_source(spec, vela_bytes).encode(),
    }
    tools = {
        "edgedeploy": __version__,
        "ethos-u-vela": vela_version,
        "numpy": np.__version__,
    }
    golden_info: dict[str, Any] = {"count": 0}
    if n_golden > 0 and data is not None:
        golden = make_golden(int8_bytes, int8_model, data, n_golden)
        tflm_version = package_version(TFLM_PACKAGE)
        tools[TFLM_PACKAGE] = tflm_version
        reference = f"TensorFlow Lite Micro {tflm_version} reference kernels on the int8 model before Vela"
        files[f"{name}_golden.h"] = render_golden_header(spec, golden, reference).encode()
        files[f"{name}_golden.c"] = render_golden_source(spec, golden).encode()
        files[GOLDEN_NPZ] = npz_bytes(golden_arrays(golden, labels))
        files[f"{name}_int8.tflite"] = int8_bytes
        comparison, tf_version = _tflite_comparison(int8_bytes, golden, int8_model)
        if tf_version:
            tools["tensorflow"] = tf_version
        golden_info = {
            "count": golden.count,
            "npz": GOLDEN_NPZ,
            "c_source": f"{name}_golden.c",
            "c_header": f"{name}_golden.h",
            "reference": {
                "interpreter": "tflite-micro",
                "version": tflm_version,
                "kernels": "reference",
                "model": f"{name}_int8.tflite",
                "model_sha256": sha256_bytes(int8_bytes),
                "note": "the int8 model before Vela: the host cannot run the ethos-u operator",
                "description": reference,
            },
            "data": {
                "path": str(data.path.resolve()),
                "sha256": data.sha256 or sha256_file(data.path),
                "split": data.split,
                "selection": "first example of each class in turn, in file order" if data.y is not None else "first rows",
                "rows": golden.row.tolist(),
            },
            "quantization": "round(x / scale) + zero_point, half away from zero, clamped to the input type"
            if int8_model.inputs[0].dtype != "float32"
            else "none (float input)",
            "argmax": golden.argmax.tolist(),
            "label": golden.label.tolist(),
            "argmax_matches_label": float(np.mean(golden.argmax == golden.label)) if data.y is not None else None,
            "tflite_comparison": comparison,
        }

    files["CMakeLists.txt"] = render_cmakelists(spec, golden_info["count"] > 0).encode()
    files["edgedeploy.cmake"] = render_cmake_module(str(Path(sys.executable).parent)).encode()

    def tensors(ts):
        out_list = []
        for t in ts:
            d = t.to_dict()
            d.update(
                {
                    "elements": elements(t.shape),
                    "bytes": elements(t.shape) * dtype_bytes(t.dtype),
                    "c_type": c_type_of(t.dtype),
                }
            )
            out_list.append(d)
        return out_list

    bundle = {
        "schema": BUNDLE_SCHEMA,
        "schema_version": BUNDLE_SCHEMA_VERSION,
        "edgedeploy_version": __version__,
        "name": name,
        "source": {
            "run_dir": str(src.run_dir.resolve()),
            "leaf": src.leaf,
            "target": src.target,
            "compile_stage": src.compile_record.id,
            "int8_stage": src.int8_record.id,
            "vela_model": str(src.vela_model.resolve().relative_to(src.run_dir.resolve()))
            if src.vela_model.resolve().is_relative_to(src.run_dir.resolve())
            else str(src.vela_model.resolve()),
            "int8_model": str(src.int8_model.resolve().relative_to(src.run_dir.resolve()))
            if src.int8_model.resolve().is_relative_to(src.run_dir.resolve())
            else str(src.int8_model.resolve()),
            "int8_model_sha256": sha256_bytes(int8_bytes),
        },
        "target": src.target_info,
        "model": {
            "c_source": f"{name}.c",
            "c_header": f"{name}.h",
            "symbol": f"{name}_model",
            "bytes": len(vela_bytes),
            "sha256": spec.model_sha256,
            "section": section,
            "section_source": section_source,
            "alignment": MODEL_ALIGNMENT,
        },
        "memory": memory,
        "inputs": tensors(io_model.inputs),
        "outputs": tensors(io_model.outputs),
        "labels": labels,
        "labels_source": labels_origin,
        "golden": golden_info,
        "cmake": {"library": f"edgedeploy::{name}", "module": "edgedeploy.cmake", "function": "edgedeploy_add_model"},
        "tools": tools,
        "warnings": warnings,
        "files": {f: {"sha256": sha256_bytes(b), "bytes": len(b)} for f, b in sorted(files.items())},
    }
    files[BUNDLE_MANIFEST] = (json.dumps(bundle, indent=2, sort_keys=False) + "\n").encode()
    _write_bundle(out, files, state, options.force)
    return ExportResult(out, bundle, sorted(files), warnings)


def _tflite_comparison(model: bytes, golden: GoldenSet, tflite: TfliteModel) -> tuple[dict[str, Any], str | None]:
    """How far TFLite's default (XNNPACK) kernels are from the TFLM reference on the golden inputs."""
    shapes = [t.shape for t in tflite.inputs]
    try:
        default = run_tflite(model, golden.inputs, shapes, len(tflite.outputs))
        reference = run_tflite(model, golden.inputs, shapes, len(tflite.outputs), reference=True)
    except EdgeDeployError as exc:
        return {"available": False, "reason": exc.one_line()}, None
    except (RuntimeError, ValueError) as exc:
        return {"available": False, "reason": f"tf.lite.Interpreter failed: {exc}"}, None
    result: dict[str, Any] = {"available": True, "interpreter": "tf.lite.Interpreter (default kernels, XNNPACK)"}
    result.update(compare_outputs(golden.outputs, default))
    # TFLite's own reference kernels: the same arithmetic as TFLM's, so a difference here is a red flag.
    result["reference_kernels"] = {
        "interpreter": "tf.lite.Interpreter (BUILTIN_REF reference kernels)",
        **compare_outputs(golden.outputs, reference),
    }
    return result, package_version("tensorflow")
