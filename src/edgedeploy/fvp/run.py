"""The ``fvp`` stage: run a Vela-compiled model on a Corstone FVP and record the PMU counters.

``fvp/<variant>/<target>`` reads the ``vela_model`` output of ``compile/<variant>/<target>``
and runs it with Arm ML Embedded Evaluation Kit's ``inference_runner`` (built with
dynamic model loading) on the target's FVP. It records what the NPU model counted
(mode ``simulated``), the FVP console log, the input it fed and the output
tensors it dumped, and how far Vela's estimate was from the simulated cycles.

The input fed to the model, in this order of preference:

1. ``golden``: the first golden case of a firmware bundle written by ``edgedeploy export``
   for the same variant, target and compiled model (``golden.npz``: ``input_0``, and the
   TensorFlow Lite Micro reference outputs ``output_i``, which the dumped output is compared with);
2. ``eval_sample``: the first evaluation sample (``split == 1``, or ``x_test[0]``) of the data
   file the ``convert/<variant>`` stage recorded in ``details["data"]``, quantized with the
   model's input scale and zero point as TFLite's QUANTIZE kernel does;
3. ``zero``: every input element at the input's zero point (real value 0), for models
   compiled from a user's ``.tflite`` with no recorded data.

The dumped output is the model's output tensors in order (the runner's packing).
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

from ..errors import EdgeDeployError, InvalidInputError, ToolFailedError, UsageError
from edgedeploy.core.files import read_input_text, sha256_bytes, sha256_file, system_tmp
from edgedeploy.core.manifest import Manifest, Metric, StageRecord, ToolInfo, artifacts_intact
from edgedeploy.core.proc import run_command
from edgedeploy.core.stage import RunContext, StageResult, StageSpec, cached_record, run_stage
from edgedeploy.config.targets import Target, get_target
from edgedeploy.tflite.reader import TensorInfo, read_tflite
from .command import FvpInvocation, build_fvp_command, cpu_instance, region_limits, timelimit_for
from .discovery import find_fvp, find_runner
from .parse import FvpLog, parse_fvp_log

log = logging.getLogger("edgedeploy")

DEFAULT_TIMEOUT_S = 600.0
_ITEM_BYTES = {
    "int8": 1, "uint8": 1, "bool": 1, "int16": 2, "uint16": 2, "float16": 2, "bfloat16": 2,
    "int32": 4, "uint32": 4, "float32": 4, "int64": 8, "uint64": 8, "float64": 8,
}  # fmt: skip
_NUMPY_DTYPES = {"int8": "<i1", "uint8": "<u1", "int16": "<i2", "int32": "<i4", "float32": "<f4", "float16": "<f2"}


@dataclass
class FvpOutcome:
    record: StageRecord
    cached: bool
    console: FvpLog | None = None


@dataclass
class InputChoice:
    data: bytes
    source: str  # golden | eval_sample | zero
    description: str
    files: dict[str, Path] = field(default_factory=dict)
    golden_output: bytes | None = None


# --------------------------------------------------------------------------- tensors


def tensor_bytes(t: TensorInfo) -> int | None:
    size = _ITEM_BYTES.get(t.dtype)
    if size is None or any(d <= 0 for d in t.shape):
        return None
    n = 1
    for d in t.shape:
        n *= d
    return n * size


def _elements(t: TensorInfo) -> int:
    n = 1
    for d in t.shape:
        n *= max(d, 1)
    return n


def zero_input(tensors: tuple[TensorInfo, ...]) -> bytes:
    """Every element at the zero point (real value 0), tensors concatenated in order."""
    import numpy as np

    parts = []
    for t in tensors:
        dtype = _NUMPY_DTYPES.get(t.dtype)
        if dtype is None:
            raise InvalidInputError(f"model input {t.name} has type {t.dtype}", "use an int8, int16 or float32 input")
        zp = t.zero_point[0] if t.zero_point and t.dtype not in ("float32", "float16") else 0
        parts.append(np.full(_elements(t), zp, dtype=dtype).tobytes())
    return b"".join(parts)


def quantize_sample(sample, t: TensorInfo) -> bytes:
    """One float sample as the bytes of tensor ``t`` (quantized when the tensor is integer)."""
    import numpy as np

    dtype = _NUMPY_DTYPES.get(t.dtype)
    if dtype is None:
        raise InvalidInputError(f"model input {t.name} has type {t.dtype}", "use an int8, int16 or float32 input")
    x = np.asarray(sample).reshape(-1)
    if x.size != _elements(t):
        raise InvalidInputError(
            f"an eval sample has {x.size} values but model input {t.name} takes {_elements(t)} {tuple(t.shape)}",
            "record the data file the model was converted with",
        )
    if t.dtype in ("float32", "float16"):
        return x.astype(dtype).tobytes()
    if not t.scale:
        q = np.round(x.astype(np.float64))
    else:  # as TFLite's QUANTIZE kernel: float32 division, round half away from zero
        v = x.astype(np.float32) / np.float32(t.scale[0])
        q = np.sign(v) * np.floor(np.abs(v).astype(np.float64) + 0.5) + (t.zero_point[0] if t.zero_point else 0)
    info = np.iinfo(np.dtype(dtype))
    return np.clip(q, info.min, info.max).astype(dtype).tobytes()


# --------------------------------------------------------------------------- input choice


BUNDLE_SCHEMA = "edgedeploy.firmware"
_BUNDLE_HINT = "pass a folder written by `edgedeploy export`"


def golden_from_bundle(
    bundle: Path, leaf: str, target_name: str, vela_sha256: str, inputs: tuple[TensorInfo, ...],
    outputs: tuple[TensorInfo, ...],
) -> InputChoice:
    """The first golden case of an ``edgedeploy export`` bundle made from this very compiled model."""
    import numpy as np

    bundle = Path(bundle)
    path = bundle / "manifest.json"
    try:  # a regular file of bounded size: a FIFO there never blocks
        info = json.loads(read_input_text(path, "bundle manifest", "manifest"))
    except (OSError, ValueError, RecursionError) as exc:
        raise InvalidInputError(f"{path} cannot be read ({exc})", _BUNDLE_HINT) from exc
    if not isinstance(info, dict) or info.get("schema") != BUNDLE_SCHEMA:
        raise InvalidInputError(f"{path} is not an edgedeploy firmware bundle", _BUNDLE_HINT)
    src = info.get("source", {})
    if (src.get("leaf"), src.get("target")) != (leaf, target_name):
        raise UsageError(
            f"{bundle} was exported for '{src.get('leaf')}' on {src.get('target')}, not '{leaf}' on {target_name}",
            "pass the bundle exported for this variant and target",
        )
    if info.get("model", {}).get("sha256") != vela_sha256:
        raise InvalidInputError(
            f"{bundle} holds another compile of '{leaf}' for {target_name} than this run",
            "re-run `edgedeploy export` from this run folder",
        )
    golden = info.get("golden") or {}
    npz = bundle / str(golden.get("npz") or "golden.npz")
    if not golden.get("count") or not npz.is_file():
        raise InvalidInputError(f"{bundle} has no golden vectors", "export with --data DATA.npz --golden N")
    from edgedeploy.core.npz import read_npz

    arrays = read_npz(npz, "golden vectors", "data")  # regular, bounded, arrays only
    missing = [k for k in ["input_0", *(f"output_{i}" for i in range(len(outputs)))] if k not in arrays]
    if missing or len(inputs) != 1:
        what = ", ".join(missing) or "a single input"
        raise InvalidInputError(f"{npz} lacks {what}", "re-run `edgedeploy export`")
    if any(a.ndim == 0 or len(a) == 0 for a in arrays.values()):
        raise InvalidInputError(f"{npz} holds an array without cases", "re-run `edgedeploy export`")
    data = np.ascontiguousarray(arrays["input_0"][0]).tobytes()
    expected = b"".join(np.ascontiguousarray(arrays[f"output_{i}"][0]).tobytes() for i in range(len(outputs)))
    row = f" (data row {int(arrays['row'][0])})" if "row" in arrays else ""
    want = tensor_bytes(inputs[0])
    if want is not None and len(data) != want:
        raise InvalidInputError(f"{npz}: input_0 has {len(data)} bytes per case, the model takes {want}",
                                "re-run `edgedeploy export`")
    return InputChoice(
        data, "golden", f"golden case 0{row} of {bundle}", files={"golden": npz}, golden_output=expected
    )


def _eval_sample(manifest: Manifest, leaf: str, tensors: tuple[TensorInfo, ...]) -> InputChoice | None:
    rec = manifest.records.get(f"convert/{leaf}")
    data = rec.details.get("data") if rec is not None and rec.status == "ok" else None
    if not isinstance(data, Mapping) or not isinstance(data.get("path"), str) or len(tensors) != 1:
        return None
    path = Path(data["path"])
    if not path.is_file():
        return None
    import numpy as np

    from edgedeploy.config.data import EVAL

    from edgedeploy.core.npz import read_npz

    npz = read_npz(path, "data file", "data", keys=("x", "split", "x_test"))  # regular, bounded, arrays only
    keys = set(npz)
    if {"x", "split"} <= keys and npz["split"].ndim == 1 and npz["x"].ndim >= 1:
        rows = np.flatnonzero(npz["split"] == EVAL)
        if rows.size == 0 or int(rows[0]) >= len(npz["x"]):
            return None
        sample, where = npz["x"][int(rows[0])], f"x[{int(rows[0])}] (the first row with split == {EVAL})"
    elif "x_test" in keys and npz["x_test"].ndim >= 1 and len(npz["x_test"]):
        sample, where = npz["x_test"][0], "x_test[0]"
    else:
        return None
    return InputChoice(
        quantize_sample(sample, tensors[0]),
        "eval_sample",
        f"{path.name} {where}, quantized with the model's input scale and zero point",
        files={"data": path},
    )


def choose_input(
    manifest: Manifest,
    leaf: str,
    target_name: str,
    inputs: tuple[TensorInfo, ...],
    golden: InputChoice | None = None,
) -> InputChoice:
    """The input of the run: a golden case if given, else an eval sample if recorded, else zeros."""
    if golden is not None:
        return golden
    sample = _eval_sample(manifest, leaf, inputs)
    if sample is not None:
        return sample
    return InputChoice(zero_input(inputs), "zero", "every input element at its zero point (no recorded data)")


def compare_outputs(got: bytes, expected: bytes, outputs: tuple[TensorInfo, ...]) -> dict[str, Any]:
    """How the dumped output differs from the golden reference output, tensor by tensor."""
    import numpy as np

    differing, max_diff, offset, argmax_same = 0, 0, 0, None
    for i, t in enumerate(outputs):
        n = tensor_bytes(t)
        dtype = _NUMPY_DTYPES.get(t.dtype)
        if n is None or dtype is None or offset + n > min(len(got), len(expected)):
            return {"comparable": False}
        a = np.frombuffer(got[offset : offset + n], dtype=dtype).astype(np.float64)
        b = np.frombuffer(expected[offset : offset + n], dtype=dtype).astype(np.float64)
        differing += int(np.sum(a != b))
        max_diff = max(max_diff, float(np.max(np.abs(a - b))) if a.size else 0.0)
        if i == 0 and a.size:
            argmax_same = bool(np.argmax(a) == np.argmax(b))
        offset += n
    max_value: float | int = int(max_diff) if float(max_diff).is_integer() else max_diff
    return {
        "comparable": True,
        "elements_differing": differing,
        "max_abs_diff": max_value,
        "argmax_agrees": argmax_same,
    }


# --------------------------------------------------------------------------- metrics


def _beat_metric_name(counter: str) -> str:
    m = re.fullmatch(r"(?P<bus>[A-Z0-9]+)_(?P<dir>RD|WR)_DATA_BEAT_(?:RECEIVED|WRITTEN)", counter)
    if m:
        return f"{m['bus'].lower()}_{'read' if m['dir'] == 'RD' else 'write'}_beats"
    return f"{counter.lower()}_beats"


def fvp_metrics(console: FvpLog, target: Target, compiled: StageRecord | None) -> dict[str, Metric]:
    """Metrics of one run: simulated counters, host timings and the estimate-vs-simulation gap."""
    none = "the runner printed no Ethos-U PMU counters"

    def sim(value: Any, unit: str, reason: str = none) -> Metric:
        return Metric(value, unit, "simulated") if value is not None else Metric.missing(unit, "simulated", reason)

    m: dict[str, Metric] = {
        "npu_active_cycles": sim(console.npu_active_cycles, "cycles"),
        "npu_idle_cycles": sim(console.npu_idle_cycles, "cycles"),
        "npu_total_cycles": sim(console.npu_total_cycles, "cycles"),
    }
    for counter, value in console.beats.items():
        m[_beat_metric_name(counter)] = Metric(value, "beats", "simulated")
    m["npu_read_beats"] = sim(console.read_beats, "beats")
    m["npu_write_beats"] = sim(console.write_beats, "beats")
    total = console.npu_total_cycles
    m["npu_latency_ms"] = sim(None if total is None else total / target.npu_hz * 1e3, "ms")
    m["arena_used_bytes"] = sim(console.arena_used_bytes, "B", "the runner printed no tensor arena use")
    stats = console.stats
    no_stat = "the FVP printed no --stat block"
    m["sim_time_s"] = sim(stats.simulated_time_s if stats else None, "s", no_stat)
    m["cpu_instructions"] = sim(stats.instructions if stats else None, "count", no_stat)
    m["host_wall_time_s"] = (
        Metric(stats.wall_time_s, "s", "measured")
        if stats and stats.wall_time_s is not None
        else Metric.missing("s", "measured", no_stat)
    )
    est = compiled.metric("total_cycles") if compiled is not None else None
    est_npu = compiled.metric("npu_cycles") if compiled is not None else None
    m["vela_total_cycles"] = (
        Metric(est, "cycles", "estimated")
        if est is not None
        else Metric.missing("cycles", "estimated", "no Vela estimate")
    )
    m["vela_npu_cycles"] = (
        Metric(est_npu, "cycles", "estimated")
        if est_npu is not None
        else Metric.missing("cycles", "estimated", "no Vela estimate")
    )
    if est and total:
        m["cycles_estimate_error_pct"] = Metric(100.0 * (float(est) - total) / total, "%", "computed")
        m["cycles_simulated_to_estimated"] = Metric(total / float(est), "ratio", "computed")
    else:
        reason = "no simulated NPU cycles" if not total else "no Vela total_cycles estimate"
        m["cycles_estimate_error_pct"] = Metric.missing("%", "computed", reason)
        m["cycles_simulated_to_estimated"] = Metric.missing("ratio", "computed", reason)
    return m


# --------------------------------------------------------------------------- running


def fvp_version(fvp: Path, timeout: float = 60.0) -> str:
    """The FVP's version (``Fast Models [11.22.20 ...``), or ``unknown``."""
    try:
        res = run_command([fvp, "--version"], timeout=timeout)
    except (OSError, EdgeDeployError):
        return "unknown"
    text = f"{res.stdout}\n{res.stderr}"
    m = re.search(r"Fast Models \[([0-9][0-9.]*)", text)
    if m:
        return m.group(1)
    first = next((line.strip() for line in text.splitlines() if line.strip()), "")
    return first[:80] if res.ok and first else "unknown"


def fvp_environment(fvp: Path) -> dict[str, str] | None:
    """Corstone-320 loads Python libraries shipped beside the FVP: add ``<install>/python/lib``."""
    for up in fvp.resolve().parents[:3]:
        lib = up / "python" / "lib"
        if lib.is_dir():
            current = os.environ.get("LD_LIBRARY_PATH", "")
            return {"LD_LIBRARY_PATH": os.pathsep.join(p for p in (str(lib), current) if p)}
    return None


def _keep_failed_log(log_path: Path, leaf: str, target: str) -> Path | None:
    if not log_path.is_file():
        return None
    safe = re.sub(r"[^A-Za-z0-9_.-]", "_", f"{leaf}-{target}").replace("..", "_")[:80]  # a file name, not a path
    fd, kept = tempfile.mkstemp(prefix=f"edgedeploy-fvp-{safe}-", suffix=".log", dir=system_tmp())
    os.close(fd)
    shutil.copyfile(log_path, kept)
    return Path(kept)


def _compiled(manifest: Manifest, leaf: str, target: Target) -> tuple[StageRecord, Path]:
    rec = manifest.records.get(f"compile/{leaf}/{target.name}")
    if rec is None or rec.status != "ok":
        have = sorted(f"{r.variant} on {r.target}" for r in manifest.find(stage="compile") if r.status == "ok")
        listed = f"compiled in this run: {', '.join(have)}" if have else "nothing is compiled in this run yet"
        raise InvalidInputError(
            f"{manifest.run_dir} has no compile of variant '{leaf}' for target {target.name} ({listed})",
            f"run `edgedeploy compile MODEL -t {target.name} -o {manifest.run_dir}` first",
        )
    art = rec.output("vela_model")
    if art is None or not artifacts_intact(manifest, [art]):
        raise InvalidInputError(
            f"the Vela model of compile/{leaf}/{target.name} is missing or changed in {manifest.run_dir}",
            "re-run `edgedeploy compile` for it",
        )
    return rec, manifest.resolve(art)


def fvp_run(
    run_dir: Path | str,
    leaf: str,
    target: Target | str,
    fvp: Path | str | None = None,
    runner: Path | str | None = None,
    timeout: float = DEFAULT_TIMEOUT_S,
    golden: Path | str | None = None,
    reuse: bool = True,
) -> FvpOutcome:
    """Run ``compile/<leaf>/<target>`` on the target's FVP and record ``fvp/<leaf>/<target>``.

    ``golden`` is a folder written by ``edgedeploy export`` for the same compile: its first
    golden case is the input, and the dumped output is compared with its reference output.

    Raises :class:`ToolMissingError` (nothing recorded) when the FVP or runner is absent,
    :class:`ToolFailedError` (recorded as a failed stage) when the run fails.
    """
    run_dir = Path(run_dir)
    manifest = Manifest.load(run_dir)
    tgt = target if isinstance(target, Target) else get_target(target)
    found_fvp = find_fvp(tgt, fvp)
    compiled, vela_model = _compiled(manifest, leaf, tgt)
    found_runner = find_runner(tgt, runner)
    if timeout <= 0:
        raise InvalidInputError(f"--timeout is {timeout}", "give a positive number of seconds")

    model = read_tflite(vela_model)
    limits = region_limits(tgt)
    if model.size > limits["model"]:
        raise InvalidInputError(
            f"{vela_model} is {model.size} bytes; the runner's model region on {tgt.name} holds {limits['model']}",
            "use a smaller model or a target file with more room between fvp.model_address and fvp.input_address",
        )
    golden_choice = None
    if golden is not None:
        vela_sha = compiled.output("vela_model").sha256
        golden_choice = golden_from_bundle(Path(golden), leaf, tgt.name, vela_sha, model.inputs, model.outputs)
    choice = choose_input(manifest, leaf, tgt.name, model.inputs, golden_choice)
    if len(choice.data) > limits["input"]:
        raise InvalidInputError(
            f"the model's input is {len(choice.data)} bytes; the runner's input region holds {limits['input']}",
            "use a model with smaller inputs",
        )
    out_sizes = [tensor_bytes(t) for t in model.outputs]
    output_bytes = sum(out_sizes) if out_sizes and all(out_sizes) else limits["output"]
    output_bytes = min(output_bytes, limits["output"])

    version = fvp_version(found_fvp.path)
    timelimit = timelimit_for(timeout)
    ctx = RunContext.open(run_dir)  # locked, and the manifest as it is now (another command may have added to it)
    spec = StageSpec(
        "fvp",
        leaf,
        tgt.name,
        parent=compiled.id,
        params={
            "fvp": tgt.fvp.binary,
            "macs": tgt.macs_per_cycle,
            "timeout_s": timeout,
            "timelimit_s": timelimit,
            "input_source": choice.source,
            "input_sha256": sha256_bytes(choice.data),
            "target_fingerprint": tgt.fingerprint(),
        },
        tool_versions={tgt.fvp.binary: version},
    )
    inputs: dict[str, Path] = {"vela_model": vela_model, "runner": found_runner.path, **choice.files}
    if reuse:
        rec = cached_record(ctx, spec, spec.cache_key(inputs))
        if rec is not None:
            log.info("stage %s: unchanged, reusing the previous result", spec.id)
            return FvpOutcome(rec, True)

    final_dir = ctx.stage_dir(spec.id)
    parsed: list[FvpLog] = []

    def run(out: Path) -> StageResult:
        input_bin, output_bin, log_path = out / "input.bin", out / "output.bin", out / "fvp.log"
        input_bin.write_bytes(choice.data)
        inv = FvpInvocation(
            fvp=found_fvp.path,
            runner=found_runner.path.resolve(),
            model=vela_model.resolve(),
            input_bin=input_bin.resolve(),
            output_bin=output_bin.resolve(),
            output_bytes=output_bytes,
            timelimit_s=timelimit,
        )
        argv = build_fvp_command(tgt, inv)
        log.info("running %s on %s (FVP time limit %d s)", leaf, found_fvp.path.name, timelimit)
        res = run_command(argv, timeout=timeout, cwd=out, log_file=log_path, env=fvp_environment(found_fvp.path))
        console = parse_fvp_log(f"{res.stdout}\n{res.stderr}")
        parsed.append(console)
        shown_argv = [a.replace(str(out.resolve()), str(final_dir.resolve())) for a in argv]
        what = f"FVP run of {leaf} on {tgt.name}"
        problem = None
        if res.timed_out:
            problem = f"{what} timed out after {res.seconds:.0f} s"
        elif console.failures:
            more = f" (and {len(console.failures) - 1} more problem lines)" if len(console.failures) > 1 else ""
            problem = f"{what} failed: {console.failures[0]}{more}"
        elif res.returncode != 0:
            problem = f"{what} failed (exit {res.returncode}): {res.tail(3)}"
        if problem:
            kept = _keep_failed_log(log_path, leaf, tgt.name)
            where = f"the console log is kept at {kept}" if kept else "no console output was captured"
            raise ToolFailedError(
                problem,
                f"{where}; check that the runner was built for {tgt.name} and the model was compiled for it, "
                "or raise --timeout",
            )
        warnings = []
        if console.npu_total_cycles is None:
            warnings.append("the runner printed no Ethos-U PMU counters; is it the Kit's inference_runner?")
        if console.npu_macs_per_cc is not None and console.npu_macs_per_cc != tgt.macs_per_cycle:
            warnings.append(f"the NPU reported {console.npu_macs_per_cc} MACs/cc; {tgt.name} has {tgt.macs_per_cycle}")
        outputs = {"log": log_path, "input": input_bin}
        output_info: dict[str, Any] = {"bytes_requested": output_bytes, "address": tgt.fvp.output_address}
        metrics = fvp_metrics(console, tgt, compiled)
        if output_bin.is_file() and output_bin.stat().st_size > 0:
            outputs["output"] = output_bin
            output_info["sha256"] = sha256_file(output_bin)
            if choice.golden_output is not None:
                cmp = compare_outputs(output_bin.read_bytes(), choice.golden_output, model.outputs)
                output_info["golden_comparison"] = cmp
                if cmp["comparable"]:
                    metrics["output_elements_differing"] = Metric(cmp["elements_differing"], "count", "computed")
                    metrics["output_max_abs_diff"] = Metric(cmp["max_abs_diff"], "LSB", "computed")
                    if cmp["elements_differing"]:
                        warnings.append(
                            f"{cmp['elements_differing']} output values differ from the golden reference "
                            f"(largest difference {cmp['max_abs_diff']:g}; top class "
                            f"{'agrees' if cmp['argmax_agrees'] else 'differs'})"
                        )
        else:
            warnings.append("the FVP wrote no output dump; the runner may not support dynamic loading")
        details = {
            "console": console.to_dict(),
            "input": {"source": choice.source, "description": choice.description, "bytes": len(choice.data)},
            "output": output_info,
            "fvp": {"path": str(found_fvp.path), "found_by": found_fvp.how, "version": version},
            "runner": {"path": str(found_runner.path), "found_by": found_runner.how},
            "cpu_instance": cpu_instance(tgt),
            "exit_code": res.returncode,
            "host_seconds": round(res.seconds, 3),
        }
        return StageResult(outputs=outputs, metrics=metrics, details=details, warnings=warnings,
                           tool=ToolInfo(tgt.fvp.binary, version, shown_argv))

    ctx.manifest.targets[tgt.name] = tgt.to_dict()
    rec = run_stage(ctx, spec, inputs, run, reuse=False)
    ctx.manifest.tools[tgt.fvp.binary] = version
    ctx.manifest.save()
    return FvpOutcome(rec, False, parsed[0] if parsed else None)
