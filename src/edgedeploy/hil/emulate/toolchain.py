"""The pieces an emulated run needs, found on this machine: cross compiler, C++ library, CMake, QEMU, TFLM tree.

Each missing piece is a :class:`ToolMissingError` (exit 5) naming the Debian package that provides it.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from edgedeploy.errors import ToolMissingError
from edgedeploy.core.proc import run_command, which

TFLM_ENV = "EDGEDEPLOY_TFLM_DIR"
QEMU = "qemu-system-arm"
QEMU_MACHINE = "mps3-an547"
ARM_GCC = "arm-none-eabi-gcc"
ARM_GXX = "arm-none-eabi-g++"

# piece -> (what it is, Debian package)
PACKAGES = {
    ARM_GCC: ("the Arm cross compiler", "gcc-arm-none-eabi"),
    "newlib": ("the C library for arm-none-eabi (newlib, rdimon semihosting)", "libnewlib-arm-none-eabi"),
    "libstdc++": ("the C++ library for arm-none-eabi", "libstdc++-arm-none-eabi-newlib"),
    "cmake": ("CMake", "cmake"),
    QEMU: ("QEMU for Arm (the mps3-an547 Cortex-M55 board)", "qemu-system-arm"),
}
# files that mark a TFLM tree generated for Cortex-M55 with CMSIS-NN (and the ARMCM55 device files)
TFLM_MARKERS = (
    "tensorflow/lite/micro/micro_interpreter.cc",
    "tensorflow/lite/micro/micro_mutable_op_resolver.h",
    "third_party/cmsis_nn/Include/arm_nnfunctions.h",
    "third_party/cortex_dfp/ARMCM55/Source/startup_ARMCM55.c",
    "third_party/cortex_dfp/ARMCM55/Config/ARMCM55_gcc.ld",
)


@dataclass(frozen=True)
class Toolchain:
    gcc: str
    gxx: str
    cmake: str
    gcc_version: str

    def cmake_defines(self) -> list[str]:
        return [f"-DEDGEDEPLOY_ARM_GCC={self.gcc}", f"-DEDGEDEPLOY_ARM_GXX={self.gxx}"]


def missing(piece: str, detail: str = "") -> ToolMissingError:
    what, package = PACKAGES[piece]
    return ToolMissingError(
        f"{what} ({piece}) was not found{': ' + detail if detail else ''}", f"apt-get install {package}"
    )


def lib_found(gxx: str, lib: str) -> bool:
    """Whether the compiler finds ``lib`` for a Cortex-M55 (hard float) build."""
    res = run_command([gxx, "-mcpu=cortex-m55", "-mfloat-abi=hard", "-mthumb", f"-print-file-name={lib}"], timeout=30)
    return res.ok and os.path.isabs(res.stdout.strip())


def find_toolchain() -> Toolchain:
    """The cross compiler, its C and C++ libraries and CMake, or a ToolMissingError naming the package."""
    gcc, gxx = which(ARM_GCC), which(ARM_GXX)
    if gcc is None or gxx is None:
        raise missing(ARM_GCC)
    if not lib_found(gxx, "librdimon.a"):
        raise missing("newlib", "librdimon.a")
    if not lib_found(gxx, "libstdc++.a"):
        raise missing("libstdc++", "libstdc++.a")
    cmake = which("cmake")
    if cmake is None:
        raise missing("cmake")
    version = run_command([gcc, "-dumpfullversion"], timeout=30).stdout.strip() or "unknown"
    return Toolchain(gcc=gcc, gxx=gxx, cmake=cmake, gcc_version=version)


def find_qemu() -> str:
    qemu = which(QEMU)
    if qemu is None:
        raise missing(QEMU)
    return qemu


def qemu_version(qemu: str) -> str:
    res = run_command([qemu, "--version"], timeout=30)
    first = res.stdout.strip().splitlines()[:1]
    return first[0].replace("QEMU emulator version", "").strip() if first else "unknown"


def find_tflm(tflm_dir: Path | str | None) -> Path:
    """The TFLM tree: ``tflm_dir``, else ``$EDGEDEPLOY_TFLM_DIR``; checked for the files a build needs."""
    given = tflm_dir or os.environ.get(TFLM_ENV)
    if not given:
        raise ToolMissingError(
            "no TensorFlow Lite Micro source tree given",
            f"pass --tflm-dir DIR or set {TFLM_ENV} to a TFLM tree generated for cortex-m55 with CMSIS-NN "
            "(create_tflm_tree.py TARGET=cortex_m_generic TARGET_ARCH=cortex-m55 OPTIMIZED_KERNEL_DIR=cmsis_nn) "
            "plus the ARMCM55 files of Cortex_DFP under third_party/cortex_dfp",
        )
    root = Path(given).expanduser().resolve()
    absent = [m for m in TFLM_MARKERS if not (root / m).is_file()]
    if absent:
        raise ToolMissingError(
            f"{root} is not a TFLM tree for Cortex-M55: {absent[0]} is missing",
            f"pass --tflm-dir (or {TFLM_ENV}) pointing at a tree generated with create_tflm_tree.py for cortex-m55 "
            "with CMSIS-NN, with the ARMCM55 device files under third_party/cortex_dfp",
        )
    return root
