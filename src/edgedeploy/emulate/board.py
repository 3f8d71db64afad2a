"""An emulated board with the bundle's firmware on it: find the tools, build once, run inputs."""

from __future__ import annotations

import json
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

from ..errors import InvalidInputError, UsageError
from ..fsutil import sha256_file
from ..tflite_model import read_tflite
from . import firmware as fw
from .qemu import DEFAULT_TIMEOUT, FirmwareReport, run_firmware
from .tflm import OpKernel, TflmLibrary, build_library, op_kernels
from .toolchain import Toolchain, find_qemu, find_tflm, find_toolchain, qemu_version

BUNDLE_MANIFEST = "manifest.json"
_REEXPORT = "export it again with golden vectors: `edgedeploy export RUN_DIR --golden N --data DATA.npz --out FWDIR`"


def read_bundle(bundle: Path) -> dict[str, Any]:
    """The bundle's manifest, checked for a CPU path whose files are as the export wrote them."""
    path = Path(bundle) / BUNDLE_MANIFEST
    if not path.is_file():
        raise InvalidInputError(f"{bundle} is not a firmware bundle (no {BUNDLE_MANIFEST})", "pass a folder written by `edgedeploy export`")
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise InvalidInputError(f"{path} is not readable JSON ({exc})", "export the bundle again") from exc
    if not isinstance(manifest, dict) or manifest.get("schema") != "edgedeploy.firmware":
        raise InvalidInputError(f"{path} is not an edgedeploy firmware manifest", "pass a folder written by `edgedeploy export`")
    cpu = manifest.get("cpu_model")
    if not cpu:
        raise InvalidInputError(f"{bundle} has no CPU path (the int8 model before Vela as C)", _REEXPORT)
    files = manifest.get("files") or {}
    for name in (cpu["c_source"], cpu["model"], f"{manifest['name']}.h"):
        info = files.get(name)
        if info is None or not (Path(bundle) / name).is_file() or sha256_file(Path(bundle) / name) != info.get("sha256"):
            raise InvalidInputError(f"{Path(bundle) / name} is missing or differs from what `edgedeploy export` wrote", "export the bundle again")
    return manifest


class EmulatedBoard:
    """The bundle's CPU path built into firmware for QEMU's mps3-an547; :meth:`run` feeds it inputs.

    The tools are looked up first (a missing one is exit 5 naming its Debian package), then TFLM is
    built or taken from the cache, then the firmware is built in ``build_dir`` (a temporary folder,
    removed by :meth:`close`, when not given).
    """

    def __init__(
        self, bundle: Path, tflm_dir: Path | str | None = None, build_dir: Path | None = None, timeout: float = DEFAULT_TIMEOUT,
        stack_bytes: int = fw.DEFAULT_STACK,
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
        self.build_dir = Path(tempfile.mkdtemp(prefix="edgedeploy-emulate-")) if build_dir is None else Path(build_dir)
        self._runs = 0
        try:
            ops = read_tflite(self.bundle / self.manifest["cpu_model"]["model"]).op_counts
            self.kernels: list[OpKernel] = op_kernels(self.tree, ops)
            start = time.perf_counter()
            self.library: TflmLibrary = build_library(self.tree, self.kernels, self.toolchain)
            project = self.build_dir / "firmware"
            fw.write_project(project, self.bundle, self.manifest, self.tree, self.kernels, self.library, stack_bytes)
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
        self.close(keep=exc_type is not None)
