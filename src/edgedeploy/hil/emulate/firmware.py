"""The firmware: a CMake project that links the bundle (``add_subdirectory``, ``edgedeploy::NAME``) and TFLM.

The program runs the bundle's CPU path (``NAME_cpu_model``, the int8 model before Vela) with a
``MicroMutableOpResolver`` holding only the model's operators and a tensor arena of the header's
``NAME_CPU_TENSOR_ARENA_SIZE``. It is linked for QEMU's ``mps3-an547`` board with the CMSIS ARMCM55
startup code and linker template, the latter with room for TFLM: code and read-only data in the
512 KiB ITCM at 0, data in the 512 KiB DTCM at 0x20000000, a 32 KiB stack (TFLM overflows the
template's 1 KiB, which the stack limit register turns into a UsageFault).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

from edgedeploy import __version__
from edgedeploy.errors import InvalidInputError, ToolFailedError
from edgedeploy.export.bundle import cmake_path
from edgedeploy.export.conventions import check_c_name
from edgedeploy.core.files import atomic_write_text
from edgedeploy.core.proc import check_disk_full, run_command
from edgedeploy.hil.emulate.render import fill, template
from edgedeploy.hil.emulate.tflm import OpKernel, TflmLibrary, cmake_generator
from edgedeploy.hil.emulate.toolchain import Toolchain

LINKER_TEMPLATE = "third_party/cortex_dfp/ARMCM55/Config/ARMCM55_gcc.ld"
MEMORY = {"__ROM_SIZE": 0x00080000, "__RAM_SIZE": 0x00080000, "__STACK_SIZE": 0x00008000, "__HEAP_SIZE": 0x00010000}
DEFAULT_STACK = MEMORY["__STACK_SIZE"]


@dataclass(frozen=True)
class Firmware:
    elf: Path
    build_dir: Path
    seconds: float


def linker_script(template_text: str, section: str, stack_bytes: int = DEFAULT_STACK) -> str:
    """The ARMCM55 GCC linker template with the sizes in :data:`MEMORY` (stack: ``stack_bytes``) and the model's section in flash."""
    text = template_text
    for symbol, value in {**MEMORY, "__STACK_SIZE": stack_bytes}.items():
        text, n = re.subn(rf"^{symbol}\s*=\s*0x[0-9A-Fa-f]+;", f"{symbol} = 0x{value:08X};", text, flags=re.M)
        if n != 1:
            raise InvalidInputError(f"the linker template has no single '{symbol} = ...;' line", "use the ARMCM55_gcc.ld of Cortex_DFP")
    anchor = "    *(.rodata*)\n"
    if anchor not in text:
        raise InvalidInputError("the linker template places no *(.rodata*) in .text", "use the ARMCM55_gcc.ld of Cortex_DFP")
    if not section.startswith(".rodata"):
        text = text.replace(anchor, anchor + f"    KEEP(*({section}))\n", 1)
    return text


def write_project(
    project: Path, bundle: Path, manifest: Mapping[str, Any], tree: Path, kernels: list[OpKernel], library: TflmLibrary,
    stack_bytes: int = DEFAULT_STACK, serve: bool = False,
) -> None:
    """The firmware project; ``serve``: the device runner on UART0 instead of the golden vectors over semihosting."""
    name = check_c_name(manifest["name"])  # read back from a bundle: checked again before it reaches CMake and C
    values = {
        "VERSION": __version__,
        "NAME": name,
        "P": name.upper(),
        "TFLM_DIR": cmake_path(tree, "the TFLM folder"),
        "BUNDLE_DIR": cmake_path(bundle, "the bundle folder"),
        "TFLM_LIBRARY": cmake_path(library.path, "the TFLM library"),
        "TFLM_SCHEMA_HEADER": cmake_path(library.schema_header, "the TFLM library"),
        "NUM_OPS": str(max(len(kernels), 1)),
        "ADD_OPS": "\n".join(f"  resolver.{k.method}();  // {k.op}" for k in kernels),
        "RUNNER_LIBS": " edgedeploy::runner_an547" if serve else "",
        "IN_BYTES": " + ".join(f"{name.upper()}_INPUT_{i}_BYTES" for i in range(len(manifest["inputs"]))),
        "OUT_BYTES": " + ".join(f"{name.upper()}_OUTPUT_{i}_BYTES" for i in range(len(manifest["outputs"]))),
    }
    project.mkdir(parents=True, exist_ok=True)
    section = str((manifest.get("model") or {}).get("section") or ".rodata")
    files = {
        "CMakeLists.txt": fill(template("firmware_CMakeLists.txt.in"), values),
        "main.cc": fill(template("main_serve.cc.in" if serve else "main.cc.in"), values),
        "tflm.cmake": template("tflm.cmake"),
        "toolchain.cmake": template("arm-none-eabi.cmake"),
        "an547.ld": linker_script((tree / LINKER_TEMPLATE).read_text(encoding="utf-8"), section, stack_bytes),
    }
    for name, text in files.items():
        path = project / name
        if not path.is_file() or path.read_text(encoding="utf-8") != text:  # unchanged files keep their time: no rebuild
            atomic_write_text(path, text)


def build(project: Path, toolchain: Toolchain, timeout: float = 600) -> Firmware:
    """Configure and build the firmware project; a failure is a ToolFailedError with the compiler's last lines."""
    build_dir = project / "build"
    cfg = run_command(
        [toolchain.cmake, "-S", project, "-B", build_dir, "-G", cmake_generator(),
         f"-DCMAKE_TOOLCHAIN_FILE={project / 'toolchain.cmake'}", "-DCMAKE_BUILD_TYPE=Release", *toolchain.cmake_defines()],
        timeout=300,
        log_file=project / "configure.log",
    )
    check_disk_full(cfg, "configuring the firmware", project)
    if not cfg.ok:
        raise ToolFailedError(f"configuring the firmware failed: {_errors(cfg.stdout + cfg.stderr)}", f"see {project / 'configure.log'}")
    res = run_command([toolchain.cmake, "--build", build_dir], timeout=timeout, log_file=project / "build.log")
    check_disk_full(res, "building the firmware", project)
    if not res.ok:
        raise ToolFailedError(f"building the firmware failed: {_errors(res.stdout + res.stderr)}", f"see {project / 'build.log'}")
    elf = build_dir / "firmware.elf"
    if not elf.is_file():
        raise ToolFailedError(f"the firmware build wrote no {elf}", f"see {project / 'build.log'}")
    return Firmware(elf, build_dir, cfg.seconds + res.seconds)


def _errors(output: str, lines: int = 3) -> str:
    """The compiler's or linker's error lines, else the output's last lines, as one line."""
    found = [ln.strip() for ln in output.splitlines() if "error" in ln.lower() or "overflowed" in ln]
    shown = found[:lines] or [ln.strip() for ln in output.strip().splitlines()[-lines:]]
    return " | ".join(shown)
