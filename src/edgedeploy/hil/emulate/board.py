"""An emulated board with the bundle's firmware on it: find the tools, build once, run inputs."""

from __future__ import annotations

import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

from edgedeploy.errors import EdgeDeployError, InvalidInputError, UsageError
from edgedeploy.export.bundle import check_bundle_files, read_bundle_manifest
from edgedeploy.core.files import system_tmp
from edgedeploy.tflite.reader import read_tflite
from edgedeploy.hil.emulate import firmware as fw
from edgedeploy.hil.emulate.qemu import DEFAULT_TIMEOUT, FirmwareReport, run_firmware
from edgedeploy.hil.emulate.tflm import OpKernel, TflmLibrary, build_library, op_kernels
from edgedeploy.hil.emulate.toolchain import Toolchain, find_qemu, find_tflm, find_toolchain, qemu_version

BUNDLE_MANIFEST = "manifest.json"
_REEXPORT = "export it again with golden vectors: `edgedeploy export RUN_DIR --golden N --data DATA.npz --out FWDIR`"


def read_bundle(bundle: Path) -> dict[str, Any]:
    """The bundle's manifest (checked as input: :func:`edgedeploy.export.bundle.read_bundle_manifest`), with a CPU
    path, every file of it as the export wrote it (:func:`edgedeploy.export.bundle.check_bundle_files`)."""
    manifest = read_bundle_manifest(bundle)
    cpu = manifest.get("cpu_model")
    if not cpu:
        raise InvalidInputError(f"{bundle} has no CPU path (the int8 model before Vela as C)", _REEXPORT)
    check_bundle_files(bundle, manifest)  # everything the firmware build or the run reads, as export wrote it
    return manifest


class EmulatedBoard:
    """The bundle's CPU path built into firmware for QEMU's mps3-an547; :meth:`run` feeds it inputs.

    The tools are looked up first (a missing one is exit 5 naming its Debian package), then TFLM is
    built or taken from the cache, then the firmware is built in ``build_dir`` (a temporary folder,
    removed by :meth:`close`, when not given).
    """

    def __init__(
        self, bundle: Path, tflm_dir: Path | str | None = None, build_dir: Path | None = None, timeout: float = DEFAULT_TIMEOUT,
        stack_bytes: int = fw.DEFAULT_STACK, serve: bool = False,
    ) -> None:
        if stack_bytes < 256 or stack_bytes % 8:
            raise UsageError(f"stack size {stack_bytes} bytes", "pass a multiple of 8 bytes, at least 256")
        self.bundle = Path(bundle)
        self.stack_bytes = stack_bytes
        self.manifest = read_bundle(self.bundle)
        self.toolchain: Toolchain = find_toolchain()
        self.qemu = find_qemu()
        self.tree = find_tflm(tflm_dir)
        self.timeout = timeout
        self._own_dir = build_dir is None
        self.build_dir = Path(tempfile.mkdtemp(prefix="edgedeploy-emulate-", dir=system_tmp())) if build_dir is None else Path(build_dir).resolve()
        self._runs = 0
        try:
            ops = read_tflite(self.bundle / self.manifest["cpu_model"]["model"]).op_counts
            self.kernels: list[OpKernel] = op_kernels(self.tree, ops)
            start = time.perf_counter()
            self.library: TflmLibrary = build_library(self.tree, self.kernels, self.toolchain)
            project = self.build_dir / ("serve" if serve else "firmware")  # serve: the device runner on UART0
            fw.write_project(project, self.bundle, self.manifest, self.tree, self.kernels, self.library, stack_bytes, serve)
            self.firmware = fw.build(project, self.toolchain)
            self.build_seconds = time.perf_counter() - start
        except BaseException:
            self.close(keep=True)  # the build logs the error points at
            raise

    def run(self, inputs: bytes) -> tuple[FirmwareReport, bytes, float]:
        """Run the firmware on ``inputs`` (whole cases, one after another): (report, output bytes, seconds)."""
        self._runs += 1
        return run_firmware(self.qemu, self.firmware.elf, self.build_dir / f"run{self._runs}", inputs, self.timeout)

    def describe(self) -> dict[str, Any]:
        return {
            "machine": "qemu-system-arm -M mps3-an547 (Cortex-M55, no NPU)",
            "qemu": qemu_version(self.qemu),
            "compiler": f"arm-none-eabi-gcc {self.toolchain.gcc_version}",
            "tflm_dir": str(self.tree),
            "tflm_library": {
                "cache_key": self.library.key,
                "sources": self.library.sources,
                "compiled_now": self.library.compiled_now,
                "seconds": round(self.library.seconds, 1),
            },
            "operators": [k.op for k in self.kernels],
            "build_seconds": round(self.build_seconds, 1),
            "stack_size_bytes": self.stack_bytes,
        }

    def close(self, keep: bool = False) -> None:
        """Remove the temporary build folder; ``keep`` leaves it (and the logs an error names) in place."""
        if self._own_dir and not keep:
            shutil.rmtree(self.build_dir, ignore_errors=True)

    def __enter__(self) -> "EmulatedBoard":
        return self

    def __exit__(self, exc_type: Any, *exc: Any) -> None:
        # an error names the build logs to read: they stay; an interrupt (Ctrl-C, SIGTERM) leaves nothing
        self.close(keep=exc_type is not None and issubclass(exc_type, EdgeDeployError))
