"""The export stage: one (leaf, target) pair of a run as a firmware bundle."""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

from .. import __version__
from ..errors import EdgeDeployError, InvalidInputError, UsageError
from edgedeploy.core.files import sha256_bytes, sha256_file
from edgedeploy.tflite.interpreter import PACKAGE as LITERT_PACKAGE
from edgedeploy.tflite.reader import TensorInfo, TfliteModel, read_tflite
from .c_files import BundleSpec, CpuModel, GoldenSet, render_cpu_source, render_golden_header, render_golden_source, render_model_header, render_model_source
from .c_literals import arena_size, c_type_of, dtype_bytes, elements
from .cmake import render_cmake_module, render_cmakelists
from .conventions import (
    ARENA_ALIGNMENT,
    BUNDLE_MANIFEST,
    BUNDLE_SCHEMA,
    BUNDLE_SCHEMA_VERSION,
    DEFAULT_GOLDEN,
    DEFAULT_RUNTIME_MARGIN,
    DEFAULT_SECTION,
    GOLDEN_NPZ,
    MODEL_ALIGNMENT,
    TFLM_PACKAGE,
    check_c_name,
    check_section,
    default_name,
)
from .golden_vectors import (
    EvalData,
    compare_outputs,
    golden_arrays,
    host_arena_bytes,
    load_eval_data,
    make_golden,
    npz_bytes,
    package_version,
    run_tflite,
)
from .locate import ExportOptions, ExportSource, _compile_hint, check_given_data, locate, recorded_data
from .outdir import _refuse_foreign, _write_bundle, inspect_out_dir, lock_out_dir
from .device_runner import check_bundle_name, runner_files, runner_manifest


@dataclass
class ExportResult:
    """A written bundle: its folder, its manifest, the files written and the warnings."""

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
    data_path = _data_file(src, options)  # refused data stops here, before the output folder is touched
    out = Path(options.out)
    name = options.name or default_name(src.leaf)
    check_c_name(name)
    check_bundle_name(name)
    section, section_source = resolve_section(options.section, src.target_info)
    _refuse_foreign(out, inspect_out_dir(out), options.force)  # a refused folder is left as it was, lock file too
    lock_out_dir(out)  # another export into ``out`` is waited for, then seen as an earlier bundle
    state = inspect_out_dir(out)
    _refuse_foreign(out, state, options.force)  # before any slow work
    memory, warnings = _memory_plan(src)

    vela_bytes = src.vela_model.read_bytes()
    int8_bytes = src.int8_model.read_bytes()
    vela_model = read_tflite(src.vela_model)
    int8_model = read_tflite(src.int8_model)
    warnings += _model_warnings(src, vela_model, int8_model)
    n_classes = elements(vela_model.outputs[0].shape[1:]) if vela_model.outputs else None
    n_golden, data = _eval_data(src, options, data_path, int8_model, n_classes)
    labels, labels_origin, label_warnings = _labels_for(src, data, n_classes)
    warnings += label_warnings

    vela_version = (src.compile_record.tool.version if src.compile_record.tool else None) or src.manifest.tools.get(
        "ethos-u-vela", "unknown"
    )
    cpu, cpu_info = None, None
    if n_golden > 0 and data is not None:  # golden vectors ship the int8 model: also as C, the CPU path
        cpu, cpu_info, cpu_warnings = _cpu_model(name, int8_bytes, src.int8_model, memory)
        warnings += cpu_warnings
    spec = _bundle_spec(src, name, section, memory, vela_bytes, vela_version, vela_model, labels, cpu)
    files: dict[str, bytes] = {
        f"{name}.h": render_model_header(spec).encode(),
        f"{name}.c": render_model_source(spec, vela_bytes).encode(),
    }
    if cpu is not None:
        files[f"{name}_cpu.c"] = render_cpu_source(spec, int8_bytes).encode()
    files[f"{name}_vela.tflite"] = vela_bytes  # the C array's bytes as a file: the NPU model runs it on the host
    tools = {
        "edgedeploy": __version__,
        "ethos-u-vela": vela_version,
        "numpy": np.__version__,
    }
    golden_info: dict[str, Any] = {"count": 0}
    if n_golden > 0 and data is not None:
        golden_info = _add_golden(files, tools, spec, int8_bytes, int8_model, data, n_golden, labels)

    files.update(runner_files())  # the device runner for HIL tests over a byte stream
    files["CMakeLists.txt"] = render_cmakelists(spec, golden_info["count"] > 0).encode()
    files["edgedeploy.cmake"] = render_cmake_module(str(Path(sys.executable).parent)).encode()
    bundle = _bundle_manifest(
        src, spec, section_source, int8_bytes, files, memory=memory, cpu_info=cpu_info, labels=labels,
        labels_origin=labels_origin, golden_info=golden_info, tools=tools, warnings=warnings,
    )
    files[BUNDLE_MANIFEST] = (json.dumps(bundle, indent=2, sort_keys=False) + "\n").encode()
    _write_bundle(out, files, state, options.force)
    return ExportResult(out, bundle, sorted(files), warnings)


def _model_warnings(src: ExportSource, vela_model: TfliteModel, int8_model: TfliteModel) -> list[str]:
    """What the bundle's user should know about the two models; a tensor type C cannot hold is refused."""
    warnings = _check_io(vela_model, int8_model)
    if not vela_model.has_ethos_u_op():
        warnings.append(f"{src.vela_model.name} holds no ethos-u operator: the whole model runs on the CPU")
    for t in vela_model.inputs + vela_model.outputs:
        c_type_of(t.dtype)
    return warnings


def _data_file(src: ExportSource, options: ExportOptions) -> Path | None:
    """The evaluation data file (``--data``, checked against a preprocessed run; else the one the run recorded,
    while it holds the bytes recorded for it); golden cases asked for without one are refused here, before the output folder is touched."""
    if options.data is not None:
        check_given_data(src, options.data)
        return options.data
    path, why = recorded_data(src)
    if path is None and options.golden:
        raise UsageError(f"--golden {options.golden} needs evaluation data, and '{src.leaf}' in {src.run_dir} {why}",
                         "pass --data DATA.npz (or --golden 0)")
    return path


def _eval_data(src: ExportSource, options: ExportOptions, data_path: Path | None, int8_model: TfliteModel,
               n_classes: int | None) -> tuple[int, EvalData | None]:
    """How many golden cases to write and the evaluation data they are drawn from (``--data``, else the data
    file the run recorded, while it holds the bytes the run recorded)."""
    n_golden = options.golden if options.golden is not None else (DEFAULT_GOLDEN if data_path else 0)
    if data_path is None:
        return n_golden, None
    in_shape = int8_model.inputs[0].shape if int8_model.inputs else ()
    kind = str(src.data_info.get("task") or "classification")  # what optimize trained it for
    return n_golden, load_eval_data(data_path, in_shape[1:] if len(in_shape) > 1 else in_shape, n_classes or 0, kind)


def _bundle_spec(src: ExportSource, name: str, section: str, memory: Mapping[str, Any], vela_bytes: bytes,
                 vela_version: str, vela_model: TfliteModel, labels: list[str] | None, cpu: CpuModel | None
                 ) -> BundleSpec:
    """What the C and CMake templates render: the compiled model, its memory plan and its tensors."""
    return BundleSpec(
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
        inputs=vela_model.inputs,
        outputs=vela_model.outputs,
        labels=tuple(labels) if labels else None,
        cpu=cpu,
    )


def _add_golden(files: dict[str, bytes], tools: dict[str, Any], spec: BundleSpec, int8_bytes: bytes,
                int8_model: TfliteModel, data: EvalData, n_golden: int, labels: list[str] | None) -> dict[str, Any]:
    """Add the golden vectors (C, npz) and the int8 model they come from to ``files``, the reference
    interpreters' versions to ``tools``; return the manifest's ``golden`` section."""
    import numpy as np

    name = spec.name
    golden = make_golden(int8_bytes, int8_model, data, n_golden)
    tflm_version = package_version(TFLM_PACKAGE)
    tools[TFLM_PACKAGE] = tflm_version
    reference = f"TensorFlow Lite Micro {tflm_version} reference kernels on the int8 model before Vela"
    files[f"{name}_golden.h"] = render_golden_header(spec, golden, reference).encode()
    files[f"{name}_golden.c"] = render_golden_source(spec, golden).encode()
    files[GOLDEN_NPZ] = npz_bytes(golden_arrays(golden, labels))
    files[f"{name}_int8.tflite"] = int8_bytes
    comparison, litert_version = _tflite_comparison(int8_bytes, golden, int8_model)
    if litert_version:
        tools[LITERT_PACKAGE] = litert_version
    return {
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


def _tensor_entries(ts: tuple[TensorInfo, ...]) -> list[dict[str, Any]]:
    """The manifest's description of each tensor: its TFLite facts, element and byte counts, C type."""
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


def _run_relative(path: Path, run_dir: Path) -> str:
    """``path`` relative to the run folder when it lies inside it, else absolute."""
    resolved = path.resolve()
    return str(resolved.relative_to(run_dir.resolve())) if resolved.is_relative_to(run_dir.resolve()) else str(resolved)


def _bundle_manifest(
    src: ExportSource, spec: BundleSpec, section_source: str, int8_bytes: bytes, files: Mapping[str, bytes], *,
    memory: Mapping[str, Any], cpu_info: dict[str, Any] | None, labels: list[str] | None, labels_origin: str | None,
    golden_info: dict[str, Any], tools: dict[str, Any], warnings: list[str],
) -> dict[str, Any]:
    """The bundle's ``manifest.json``: where it comes from, what each part holds, every file's sha256."""
    name = spec.name
    return {
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
            "vela_model": _run_relative(src.vela_model, src.run_dir),
            "int8_model": _run_relative(src.int8_model, src.run_dir),
            "int8_model_sha256": sha256_bytes(int8_bytes),
        },
        "target": src.target_info,
        "model": {
            "c_source": f"{name}.c",
            "c_header": f"{name}.h",
            "symbol": f"{name}_model",
            "tflite": f"{name}_vela.tflite",
            "bytes": spec.model_size,
            "sha256": spec.model_sha256,
            "section": spec.section,
            "section_source": section_source,
            "alignment": MODEL_ALIGNMENT,
        },
        "memory": memory,
        "cpu_model": cpu_info,
        "inputs": _tensor_entries(spec.inputs),
        "outputs": _tensor_entries(spec.outputs),
        "labels": labels,
        "labels_source": labels_origin,
        "golden": golden_info,
        "cmake": {"library": f"edgedeploy::{name}", "module": "edgedeploy.cmake", "function": "edgedeploy_add_model"},
        "runner": runner_manifest(),
        "tools": tools,
        "warnings": warnings,
        "files": {f: {"sha256": sha256_bytes(b), "bytes": len(b)} for f, b in sorted(files.items())},
    }


def _cpu_model(
    name: str, int8_bytes: bytes, int8_path: Path, memory: Mapping[str, Any]
) -> tuple[CpuModel, dict[str, Any], list[str]]:
    """The CPU path: the int8 model before Vela and its own arena (host TFLM arena total + runtime margin)."""
    warnings: list[str] = []
    host = host_arena_bytes(int8_path)
    if host is None:
        warnings.append("the host TFLM arena total of the int8 model could not be read; the CPU arena is the NPU one")
        arena, origin = int(memory["tensor_arena_bytes"]), "the NPU path's tensor_arena_bytes"
    else:
        arena = arena_size(host, int(memory["runtime_margin_bytes"]))
        origin = f"host TFLM arena total {host} B + runtime margin {memory['runtime_margin_bytes']} B"
    cpu = CpuModel(size=len(int8_bytes), sha256=sha256_bytes(int8_bytes), tensor_arena_bytes=arena, host_arena_bytes=host)
    info = {
        "c_source": f"{name}_cpu.c",
        "symbol": f"{name}_cpu_model",
        "model": f"{name}_int8.tflite",
        "bytes": cpu.size,
        "sha256": cpu.sha256,
        "tensor_arena_bytes": arena,
        "tensor_arena_from": origin,
        "host_arena_bytes": host,
        "measured": None,  # `edgedeploy emulate` writes what the firmware used on the emulated Cortex-M55
    }
    return cpu, info, warnings


def _tflite_comparison(model: bytes, golden: GoldenSet, tflite: TfliteModel) -> tuple[dict[str, Any], str | None]:
    """How far TFLite's default (XNNPACK) kernels are from the TFLM reference on the golden inputs."""
    shapes = [t.shape for t in tflite.inputs]
    try:
        default = run_tflite(model, golden.inputs, shapes, len(tflite.outputs))
        reference = run_tflite(model, golden.inputs, shapes, len(tflite.outputs), reference=True)
    except EdgeDeployError as exc:
        return {"available": False, "reason": exc.one_line()}, None
    except (RuntimeError, ValueError) as exc:
        return {"available": False, "reason": f"LiteRT's interpreter failed: {exc}"}, None
    result: dict[str, Any] = {"available": True, "interpreter": "LiteRT Interpreter (default kernels, XNNPACK)"}
    result.update(compare_outputs(golden.outputs, default))
    # TFLite's own reference kernels: the same arithmetic as TFLM's, so a difference here is a red flag.
    result["reference_kernels"] = {
        "interpreter": "LiteRT Interpreter (BUILTIN_REF reference kernels)",
        **compare_outputs(golden.outputs, reference),
    }
    return result, package_version(LITERT_PACKAGE)
