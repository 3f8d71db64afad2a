"""Build the FVP command line for a board target: pure functions, no processes.

The command follows Arm's own tools for each board (ML Embedded Evaluation Kit,
MLIA, ExecuTorch's ``run_fvp.sh``):

* ``-C <num_macs_param>=<MACs>`` selects the NPU configuration the model was compiled for
  (``ethosu.num_macs`` on the MPS3 boards Corstone-300/310,
  ``mps4_board.subsystem.ethosu.num_macs`` on the MPS4 board Corstone-320);
* every ``[fvp.params]`` entry of the target file as ``-C key=value`` (headless
  UART on stdout, no telnet, no visualisation, shut down at end of test);
* ``-a runner.axf`` and, for the Kit's ``inference_runner`` built with dynamic model
  loading, ``--data model.tflite@0x90000000``, ``--data input.bin@0x92000000`` and
  ``--dump cpu0=output.bin@Memory:0x93000000,N`` (the CPU instance is
  ``mps4_board.subsystem.cpu0`` on Corstone-320);
* ``--stat`` (simulation statistics at exit) and ``--timelimit S`` (the FVP stops
  itself after S seconds and prints "CPU time has been exceeded").
"""

from __future__ import annotations

import configparser
import math
from dataclasses import dataclass
from pathlib import Path

from ..errors import UsageError
from edgedeploy.config.targets import Target

#: Size of the output region the Kit's runner reserves after the OFM base (DYNAMIC_OFM_SIZE).
DEFAULT_OUTPUT_REGION_BYTES = 0x0100_0000
#: The FVP stops itself this long before the subprocess timeout, so its statistics are printed.
TIMELIMIT_MARGIN_S = 10


@dataclass(frozen=True)
class FvpInvocation:
    """What to run: the FVP, the runner and the files it loads and dumps."""

    fvp: Path
    runner: Path
    model: Path
    input_bin: Path | None = None
    output_bin: Path | None = None
    output_bytes: int = 0
    timelimit_s: float | None = None
    stat: bool = True


def hex_address(value: int) -> str:
    return f"0x{value:08x}"


def cpu_instance(target: Target) -> str:
    """The FVP's CPU component, for ``--dump``: it sits in the same subsystem as the NPU.

    ``ethosu.num_macs`` -> ``cpu0`` (MPS3); ``mps4_board.subsystem.ethosu.num_macs`` ->
    ``mps4_board.subsystem.cpu0`` (MPS4). A target file may name it as ``fvp.cpu_instance``.
    """
    settings = _fvp(target)
    explicit = (target.raw.get("fvp") or {}).get("cpu_instance") if target.raw else None
    if isinstance(explicit, str) and explicit:
        return explicit
    param = settings.num_macs_param
    prefix = param[: param.index("ethosu.")] if "ethosu." in param else ""
    return f"{prefix}cpu0"


def timelimit_for(timeout_s: float) -> int:
    """The FVP's own ``--timelimit`` for an overall ``timeout_s``: a margin shorter, at least 1 s."""
    margin = max(TIMELIMIT_MARGIN_S, 0.1 * timeout_s)
    return max(1, int(math.floor(timeout_s - margin)))


def _fvp(target: Target):
    if target.kind != "board" or target.fvp is None:
        raise UsageError(
            f"target {target.name} is an NPU configuration, not a board with an FVP",
            "pass a board target such as corstone-300-u55-128 (see `edgedeploy targets list`)",
        )
    return target.fvp


def config_options(target: Target, macs: int | None = None) -> list[str]:
    """The ``-C`` options: the NPU's MAC count, then the target file's ``[fvp.params]``."""
    settings = _fvp(target)
    argv = ["-C", f"{settings.num_macs_param}={macs or target.macs_per_cycle}"]
    for key, value in settings.params:
        argv += ["-C", f"{key}={value}"]
    return argv


def build_fvp_command(target: Target, inv: FvpInvocation, macs: int | None = None) -> list[str]:
    """The full argv of one FVP run of ``inv`` on ``target``."""
    settings = _fvp(target)
    argv = [str(inv.fvp), *config_options(target, macs), "-a", str(inv.runner)]
    argv += ["--data", f"{inv.model}@{hex_address(settings.model_address)}"]
    if inv.input_bin is not None:
        argv += ["--data", f"{inv.input_bin}@{hex_address(settings.input_address)}"]
    if inv.output_bin is not None and inv.output_bytes > 0:
        argv += [
            "--dump",
            f"{cpu_instance(target)}={inv.output_bin}@Memory:{hex_address(settings.output_address)},{inv.output_bytes}",
        ]
    if inv.stat:
        argv.append("--stat")
    if inv.timelimit_s is not None:
        argv += ["--timelimit", str(int(math.ceil(inv.timelimit_s)))]
    return argv


def region_limits(target: Target) -> dict[str, int]:
    """Bytes available to the model, input and output regions (from the addresses' spacing)."""
    s = _fvp(target)
    return {
        "model": s.input_address - s.model_address,
        "input": s.output_address - s.input_address,
        "output": DEFAULT_OUTPUT_REGION_BYTES,
    }


# --------------------------------------------------------------------------- runner build facts


_PLATFORMS = {
    "FVP_Corstone_SSE-300": ("mps3", "sse-300"),
    "FVP_Corstone_SSE-310": ("mps3", "sse-310"),
    "FVP_Corstone_SSE-320": ("mps4", "sse-320"),
}
_CONFIG_PREFIX = {"ethos-u55": "H", "ethos-u65": "Y", "ethos-u85": "Z"}


def _arena_cache_size(target: Target) -> int | None:
    parser = configparser.ConfigParser()
    parser.read(target.vela_ini_path(), encoding="utf-8")
    section = f"Memory_Mode.{target.vela.memory_mode}"
    seen = set()
    while section in parser and section not in seen:
        seen.add(section)
        if parser.has_option(section, "arena_cache_size"):
            return int(parser.get(section, "arena_cache_size"), 0)
        section = parser.get(section, "inherit", fallback="")
    return None


def mlek_build_options(target: Target) -> list[str]:
    """CMake options of the Kit that match a board target (platform, subsystem, NPU, memory mode)."""
    settings = _fvp(target)
    platform = next((v for k, v in _PLATFORMS.items() if settings.binary.startswith(k)), None)
    opts = []
    if platform:
        opts += [f"-DTARGET_PLATFORM={platform[0]}", f"-DTARGET_SUBSYSTEM={platform[1]}"]
    family = target.npu_family
    opts += [
        f"-DETHOS_U_NPU_ID={family.rsplit('-', 1)[1].upper()}",
        f"-DETHOS_U_NPU_CONFIG_ID={_CONFIG_PREFIX.get(family, 'H')}{target.macs_per_cycle}",
    ]
    mode = target.vela.memory_mode
    for name in ("Shared_Sram", "Dedicated_Sram", "Sram_Only"):
        if mode.startswith(name):
            opts.append(f"-DETHOS_U_NPU_MEMORY_MODE={name}")
            if name == "Dedicated_Sram":
                size = _arena_cache_size(target)
                if size:
                    opts.append(f"-DETHOS_U_NPU_CACHE_SIZE={size}")
            break
    return opts
