"""The ``fvp`` stage: run a Vela-compiled model on a Corstone FVP and record the PMU counters.

``fvp/<variant>/<target>`` reads the ``vela_model`` output of ``compile/<variant>/<target>``
and runs it with Arm ML Embedded Evaluation Kit's ``inference_runner`` (built with
dynamic model loading) on the target's FVP. It records what the NPU model counted
(mode ``simulated``, :mod:`.counters`), the FVP console log, the input it fed (chosen in
:mod:`.stimulus`) and the output tensors it dumped, and how far Vela's estimate was from
the simulated cycles.
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import EdgeDeployError, InvalidInputError, ToolFailedError
from edgedeploy.core.files import sha256_bytes, sha256_file, system_tmp
from edgedeploy.core.manifest import Manifest, Metric, StageRecord, ToolInfo, checked_artifact, remake_hint
from edgedeploy.core.proc import ProcResult, run_command
from edgedeploy.core.units import fmt_seconds
from edgedeploy.core.stage import RunContext, StageResult, StageSpec, cached_record, run_stage
from edgedeploy.config.targets import Target, get_target
from edgedeploy.tflite.reader import TfliteModel, read_tflite
from .command import FvpInvocation, build_fvp_command, cpu_instance, region_limits, timelimit_for
from .counters import fvp_metrics
from .discovery import Found, find_fvp, find_runner
from .parse import FvpLog, parse_fvp_log
from .stimulus import InputChoice, choose_input, compare_outputs, golden_from_bundle, tensor_bytes

log = logging.getLogger("edgedeploy")

DEFAULT_TIMEOUT_S = 600.0


@dataclass
class FvpOutcome:
    """One FVP run: its stage record (simulated counters, cycles), whether it was reused, and the parsed console log."""

    record: StageRecord
    cached: bool
    console: FvpLog | None = None


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
    if art is None:
        raise InvalidInputError(f"{manifest.path}: compile/{leaf}/{target.name} records no Vela model",
                                remake_hint(manifest, rec))
    # its bytes as the compile wrote them (the shared check: one message shape for every command that reads it)
    return rec, checked_artifact(manifest, rec, art, f"the Vela-compiled model of '{leaf}' for {target.name}")


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
    assert tgt.fvp is not None  # (find_fvp takes only a board target)
    compiled, vela_model = _compiled(manifest, leaf, tgt)
    found_runner = find_runner(tgt, runner)
    if timeout <= 0:
        raise InvalidInputError(f"--timeout is {timeout}", "give a positive number of seconds")
    model = read_tflite(vela_model)
    choice, output_bytes = _fitted_input(manifest, leaf, tgt, compiled, vela_model, model, golden)

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

    job = _FvpJob(tgt, leaf, found_fvp, found_runner, vela_model, model, compiled, choice, output_bytes,
                  timeout, timelimit, version, ctx.stage_dir(spec.id))
    ctx.manifest.targets[tgt.name] = tgt.to_dict()
    rec = run_stage(ctx, spec, inputs, job.run, reuse=False)
    ctx.manifest.tools[tgt.fvp.binary] = version
    ctx.manifest.save()
    return FvpOutcome(rec, False, job.console)


def _fitted_input(manifest: Manifest, leaf: str, tgt: Target, compiled: StageRecord, vela_model: Path,
                  model: TfliteModel, golden: Path | str | None) -> tuple[InputChoice, int]:
    """The input of the run and the bytes of output to dump, once the model and its input are known to fit the
    runner's memory regions."""
    limits = region_limits(tgt)
    if model.size > limits["model"]:
        raise InvalidInputError(
            f"{vela_model} is {model.size} bytes; the runner's model region on {tgt.name} holds {limits['model']}",
            "use a smaller model or a target file with more room between fvp.model_address and fvp.input_address",
        )
    golden_choice = None
    if golden is not None:
        art = compiled.output("vela_model")
        assert art is not None  # (_compiled checked the record names its Vela model)
        vela_sha = art.sha256
        golden_choice = golden_from_bundle(Path(golden), leaf, tgt.name, vela_sha, model.inputs, model.outputs)
    choice = choose_input(manifest, leaf, tgt.name, model.inputs, golden_choice)
    if len(choice.data) > limits["input"]:
        raise InvalidInputError(
            f"the model's input is {len(choice.data)} bytes; the runner's input region holds {limits['input']}",
            "use a model with smaller inputs",
        )
    out_sizes = [tensor_bytes(t) for t in model.outputs]
    known = [n for n in out_sizes if n]
    output_bytes = sum(known) if out_sizes and len(known) == len(out_sizes) else limits["output"]
    return choice, min(output_bytes, limits["output"])


@dataclass
class _FvpJob:
    """One FVP run of a compiled model, as the stage runs it in its output folder ``out``."""

    target: Target
    leaf: str
    fvp: Found
    runner: Found
    vela_model: Path
    model: TfliteModel
    compiled: StageRecord
    choice: InputChoice
    output_bytes: int
    timeout: float
    timelimit: int
    version: str
    final_dir: Path  # where the stage's files end up (``out`` is renamed to it)
    console: FvpLog | None = None  # the parsed console output, once the FVP has run

    def run(self, out: Path) -> StageResult:
        tgt = self.target
        assert tgt.fvp is not None  # (a board target: fvp_run found its FVP)
        input_bin, output_bin, log_path = out / "input.bin", out / "output.bin", out / "fvp.log"
        input_bin.write_bytes(self.choice.data)
        inv = FvpInvocation(
            fvp=self.fvp.path,
            runner=self.runner.path.resolve(),
            model=self.vela_model.resolve(),
            input_bin=input_bin.resolve(),
            output_bin=output_bin.resolve(),
            output_bytes=self.output_bytes,
            timelimit_s=self.timelimit,
        )
        argv = build_fvp_command(tgt, inv)
        log.info("running %s on %s (FVP time limit %d s)", self.leaf, self.fvp.path.name, self.timelimit)
        res = run_command(argv, timeout=self.timeout, cwd=out, log_file=log_path, env=fvp_environment(self.fvp.path))
        console = parse_fvp_log(f"{res.stdout}\n{res.stderr}")
        if self.console is None:
            self.console = console
        shown_argv = [a.replace(str(out.resolve()), str(self.final_dir.resolve())) for a in argv]
        self._raise_on_failure(res, console, log_path)
        warnings = []
        if console.npu_total_cycles is None:
            warnings.append("the runner printed no Ethos-U PMU counters; is it the Kit's inference_runner?")
        if console.npu_macs_per_cc is not None and console.npu_macs_per_cc != tgt.macs_per_cycle:
            warnings.append(f"the NPU reported {console.npu_macs_per_cc} MACs/cc; {tgt.name} has {tgt.macs_per_cycle}")
        outputs = {"log": log_path, "input": input_bin}
        metrics = fvp_metrics(console, tgt, self.compiled)
        output_info = self._dumped_output(output_bin, outputs, metrics, warnings)
        details = {
            "console": console.to_dict(),
            "input": {"source": self.choice.source, "description": self.choice.description,
                      "bytes": len(self.choice.data)},
            "output": output_info,
            "fvp": {"path": str(self.fvp.path), "found_by": self.fvp.how, "version": self.version},
            "runner": {"path": str(self.runner.path), "found_by": self.runner.how},
            "cpu_instance": cpu_instance(tgt),
            "exit_code": res.returncode,
            "host_seconds": round(res.seconds, 3),
        }
        return StageResult(outputs=outputs, metrics=metrics, details=details, warnings=warnings,
                           tool=ToolInfo(tgt.fvp.binary, self.version, shown_argv))

    def _raise_on_failure(self, res: ProcResult, console: FvpLog, log_path: Path) -> None:
        """A timeout, an error line in the console (even with exit code 0) or a non-zero exit fails the run."""
        what = f"FVP run of {self.leaf} on {self.target.name}"
        problem = None
        if res.timed_out:
            problem = f"{what} timed out after {fmt_seconds(res.seconds)}"
        elif console.failures:
            more = f" (and {len(console.failures) - 1} more problem lines)" if len(console.failures) > 1 else ""
            problem = f"{what} failed: {console.failures[0]}{more}"
        elif res.returncode != 0:
            problem = f"{what} failed (exit {res.returncode}): {res.tail(3)}"
        if problem:
            kept = _keep_failed_log(log_path, self.leaf, self.target.name)
            where = f"the console log is kept at {kept}" if kept else "no console output was captured"
            raise ToolFailedError(
                problem,
                f"{where}; check that the runner was built for {self.target.name} and the model was compiled for it, "
                "or raise --timeout",
            )

    def _dumped_output(self, output_bin: Path, outputs: dict[str, Path], metrics: dict[str, Metric],
                       warnings: list[str]) -> dict[str, Any]:
        """The stage's ``output`` details; the dump joins ``outputs``, its comparison with the golden reference
        ``metrics`` and ``warnings``."""
        assert self.target.fvp is not None  # (a board target: fvp_run found its FVP)
        output_info: dict[str, Any] = {"bytes_requested": self.output_bytes, "address": self.target.fvp.output_address}
        if not (output_bin.is_file() and output_bin.stat().st_size > 0):
            warnings.append("the FVP wrote no output dump; the runner may not support dynamic loading")
            return output_info
        outputs["output"] = output_bin
        output_info["sha256"] = sha256_file(output_bin)
        if self.choice.golden_output is None:
            return output_info
        cmp = compare_outputs(output_bin.read_bytes(), self.choice.golden_output, self.model.outputs)
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
        return output_info
