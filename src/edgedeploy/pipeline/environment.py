"""What is installed and usable: the core (TensorFlow stack, Vela) and the optional parts.

Versions are read from package metadata; nothing here imports TensorFlow or
Vela, and the only processes started are ``--version`` queries of the
embedded compiler and CMake.
"""

from __future__ import annotations

import platform
import re
import sys
from dataclasses import asdict, dataclass
from typing import Callable
from importlib.metadata import PackageNotFoundError, requires, version

from edgedeploy import __version__
from edgedeploy.errors import EdgeDeployError
from edgedeploy.core.proc import run_command, which

SCHEMA = "edgedeploy.doctor"
SCHEMA_VERSION = 1
MIN_PYTHON = (3, 11)

#: Python distributions the core needs, with what each is for.
CORE_PACKAGES = {
    "tensorflow": "TensorFlow (optimize, convert)",
    "tf-keras": "Keras 2 for TensorFlow Model Optimization",
    "tensorflow-model-optimization": "pruning, clustering, QAT",
    "ethos-u-vela": "Vela, the Ethos-U compiler",
    "numpy": "arrays",
    "tflite": "TFLite schema (operator names)",
    "ai-edge-litert": "LiteRT, the TFLite interpreter (int8 accuracy, verify, golden vectors)",
}


@dataclass
class Check:
    name: str
    required: bool
    found: bool
    version: str | None = None
    expected: str | None = None
    path: str | None = None
    detail: str = ""
    hint: str | None = None

    @property
    def status(self) -> str:
        if not self.found:
            return "missing"
        if self.expected and self.version and self.version != self.expected:
            return "version differs"
        return "ok"

    def to_dict(self) -> dict:
        out = asdict(self)
        out["status"] = self.status
        return out


@dataclass
class DoctorReport:
    """What ``edgedeploy doctor`` found: one check per tool, library and optional part."""

    checks: list[Check]

    @property
    def missing_required(self) -> list[Check]:
        return [c for c in self.checks if c.required and not c.found]

    @property
    def missing_optional(self) -> list[Check]:
        return [c for c in self.checks if not c.required and not c.found]

    @property
    def ok(self) -> bool:
        return not self.missing_required

    def to_dict(self) -> dict:
        return {
            "schema": SCHEMA,
            "schema_version": SCHEMA_VERSION,
            "edgedeploy_version": __version__,
            "ok": self.ok,
            "missing_required": [c.name for c in self.missing_required],
            "missing_optional": [c.name for c in self.missing_optional],
            "checks": [c.to_dict() for c in self.checks],
        }


def pinned_versions() -> dict[str, str]:
    """The ``==`` pins of edgedeploy's own dependencies, from its installed metadata."""
    pins: dict[str, str] = {}
    try:
        reqs = requires("edgedeploy") or []
    except PackageNotFoundError:
        return pins
    for req in reqs:
        if ";" in req:
            continue
        m = re.match(r"^\s*([A-Za-z0-9_.-]+)\s*==\s*([^\s,;]+)", req)
        if m:
            pins[m.group(1).lower().replace("_", "-")] = m.group(2)
    return pins


def _dist_version(name: str) -> str | None:
    try:
        return version(name)
    except PackageNotFoundError:
        return None


def _tool_version(program: str, timeout: float = 20.0) -> tuple[str | None, str | None]:
    path = which(program)
    if path is None:
        return None, None
    try:
        res = run_command([path, "--version"], timeout=timeout)
    except (OSError, EdgeDeployError):
        return path, None
    first = next((line.strip() for line in (res.stdout or res.stderr).splitlines() if line.strip()), "")
    m = re.search(r"(\d+\.\d+(?:\.\d+)?)(?!.*\d+\.\d+)", first) if first else None
    return path, (m.group(1) if m else first or None)


def core_checks() -> list[Check]:
    pins = pinned_versions()
    py = platform.python_version()
    checks = [
        Check(
            "python",
            True,
            sys.version_info[:2] >= MIN_PYTHON,
            py,
            path=sys.executable,
            detail=f"needs Python {'.'.join(map(str, MIN_PYTHON))} or newer",
            hint=None if sys.version_info[:2] >= MIN_PYTHON else "use Python 3.11 or newer",
        )
    ]
    for name, what in CORE_PACKAGES.items():
        found = _dist_version(name)
        want = pins.get(name)
        pin = f"=={want}" if want else ""
        checks.append(
            Check(name, True, found is not None, found, want, detail=what,
                  hint=None if found else f"pip install {name}{pin}")
        )
    vela = next(c for c in checks if c.name == "ethos-u-vela")
    if vela.found:
        from edgedeploy.config.targets import vela_config_files_dir

        cfg = vela_config_files_dir()
        if cfg is None or not (cfg / "Arm" / "vela.ini").is_file():
            vela.found = False
            vela.detail = "Vela is installed without its bundled config_files/Arm/vela.ini"
            vela.hint = f"pip install --force-reinstall ethos-u-vela=={vela.expected or vela.version}"
        else:
            vela.path = str(cfg / "Arm" / "vela.ini")
    return checks


def optional_checks() -> list[Check]:
    checks: list[Check] = []
    try:
        from edgedeploy.config.targets import list_targets

        boards = [t for t in list_targets() if t.kind == "board" and t.fvp is not None]
    except EdgeDeployError as exc:
        boards = []
        checks.append(Check("board targets", False, False, detail=exc.one_line(), hint="install Vela first"))
    checks += _fvp_checks(boards) + _runner_checks(boards)
    gcc = _tool_check("arm-none-eabi-gcc", "builds firmware from `edgedeploy export` and the Kit's runner",
                      "install the Arm GNU Toolchain (Debian: apt-get install gcc-arm-none-eabi)")
    cmake = _tool_check("cmake", "configures exported firmware projects and the Kit",
                        "install CMake 3.21 or newer (pip install cmake, or apt-get install cmake)")
    checks += [gcc, cmake]
    tflm = _dist_version("tflite-micro")
    tflm_pin = pinned_versions().get("tflite-micro")
    checks.append(
        Check(
            "tflite-micro",
            False,
            tflm is not None,
            tflm,
            tflm_pin,
            detail="TensorFlow Lite for Microcontrollers' Python interpreter (golden vectors for export)",
            hint=None if tflm else f"pip install --pre tflite-micro{'==' + tflm_pin if tflm_pin else ''}",
        )
    )
    return checks + emulation_checks(gcc.found)


def _located(name: str, found, detail: str, hint: Callable[..., str]) -> Check:
    """An optional file found by :mod:`edgedeploy.fvp.discovery` (``found``: its result, None when missing);
    ``hint`` says how to get it, asked only when it is missing."""
    return Check(
        name,
        False,
        found is not None,
        path=str(found.path) if found else None,
        detail=detail + (f" (found via {found.how})" if found else ""),
        hint=None if found else hint(),
    )


def _fvp_checks(boards: list) -> list[Check]:
    """One check per FVP edgedeploy knows, naming the board targets that use it."""
    from edgedeploy.fvp.discovery import ENV_FVP_DIR, FVP_DOWNLOAD_PAGE, FVP_PACKAGES, locate_fvp_binary

    users: dict[str, list[str]] = {}
    for t in boards:
        users.setdefault(t.fvp.binary, []).append(t.name)
    checks = []
    for binary, package in FVP_PACKAGES.items():
        used_by = ", ".join(users.get(binary, [])) or "no built-in target"
        checks.append(_located(
            f"FVP {binary}", locate_fvp_binary(binary), f"simulates {package} for {used_by}",
            lambda package=package: f"download the {package} FVP from {FVP_DOWNLOAD_PAGE}, then set {ENV_FVP_DIR} "
            "or add it to PATH",
        ))
    return checks


def _runner_checks(boards: list) -> list[Check]:
    """One check per board target: the Kit's inference runner built for it."""
    from edgedeploy.fvp.command import mlek_build_options
    from edgedeploy.fvp.discovery import ENV_RUNNER, default_runner_dir, locate_runner

    checks = []
    for t in boards:
        found = locate_runner(t.name)
        opts = " ".join(mlek_build_options(t))
        checks.append(_located(
            f"runner {t.name}", found, "ML Embedded Evaluation Kit inference_runner with dynamic model loading",
            lambda t=t, opts=opts: f"build it (cmake {opts} -Dinference_runner_DYNAMIC_MEM_LOAD_ENABLED=ON "
            f"-DUSE_CASE_BUILD=inference_runner) and set {ENV_RUNNER} or copy it to "
            f"{default_runner_dir() / (t.name + '.axf')}",
        ))
    return checks


def _tool_check(program: str, detail: str, hint: str) -> Check:
    """An optional program on PATH, with the version its ``--version`` prints."""
    path, found_version = _tool_version(program)
    return Check(program, False, path is not None, found_version, path=path, detail=detail,
                 hint=None if path else hint)


def emulation_checks(have_gcc: bool) -> list[Check]:
    """What `edgedeploy emulate` and the HIL plugin's qemu device need besides the cross compiler and CMake."""
    from edgedeploy.hil.emulate.toolchain import (
        ARM_GXX,
        PACKAGES,
        QEMU,
        QEMU_MACHINE,
        TFLM_ENV,
        find_tflm,
        lib_found,
        qemu_version,
    )

    checks: list[Check] = []
    gxx = which(ARM_GXX) if have_gcc else None
    for piece, lib in (("newlib", "librdimon.a"), ("libstdc++", "libstdc++.a")):
        what, package = PACKAGES[piece]
        found = gxx is not None and lib_found(gxx, lib)
        checks.append(
            Check(
                f"{piece} (arm-none-eabi)", False, found, detail=f"{what}: {lib} for Cortex-M55 firmware (`edgedeploy emulate`)",
                hint=None if found else f"apt-get install {package}",
            )  # fmt: skip
        )
    qemu = which(QEMU)
    board = False
    if qemu is not None:
        res = run_command([qemu, "-machine", "help"], timeout=30)
        board = res.ok and QEMU_MACHINE in res.stdout
    checks.append(
        Check(
            QEMU, False, qemu is not None and board, qemu_version(qemu) if qemu else None, path=qemu,
            detail=f"emulates the {QEMU_MACHINE} board (Cortex-M55) for `edgedeploy emulate`"
            + ("" if qemu is None or board else f"; this QEMU has no {QEMU_MACHINE} machine (7.0 or newer has)"),
            hint=None if qemu and board else f"apt-get install {PACKAGES[QEMU][1]}",
        )  # fmt: skip
    )
    try:
        tree, detail = find_tflm(None), "TensorFlow Lite Micro tree for cortex-m55 with CMSIS-NN (`edgedeploy emulate`)"
    except EdgeDeployError as exc:
        tree, detail = None, exc.message
    checks.append(
        Check(
            f"TFLM tree (${TFLM_ENV})", False, tree is not None, path=str(tree) if tree else None, detail=detail,
            hint=None if tree else f"set {TFLM_ENV} to a TFLM tree generated for cortex-m55 with CMSIS-NN, or pass --tflm-dir",
        )  # fmt: skip
    )
    return checks


def run_doctor() -> DoctorReport:
    return DoctorReport(core_checks() + optional_checks())
