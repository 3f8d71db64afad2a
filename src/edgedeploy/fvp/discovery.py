"""Find installed Corstone FVPs and the runner application they execute.

Nothing here starts a process. An FVP is looked up, in this order:

1. an explicit path (``--fvp``): the executable itself, or a folder to search;
2. the folders in ``EDGEDEPLOY_FVP_DIR`` (``os.pathsep``-separated);
3. ``PATH``;
4. the usual install folders: ``~/FVP_Corstone_SSE-3*/``, ``~/FVP_install_location/``,
   ``/opt/fvps/*/``, ``/opt/FVP_Corstone_SSE-3*/`` and ``/usr/local/bin``.

A folder is searched itself, then its ``models/Linux64*_GCC-*/`` subfolders
(where Arm's installers put the executables), then the same one level down
(``/opt/fvps/FVP_Corstone_SSE-300/models/Linux64_GCC-9.3``).

The runner is an Arm ML Embedded Evaluation Kit ``inference_runner`` built with
dynamic model loading for the board. It is looked up from ``--runner``, then
``EDGEDEPLOY_FVP_RUNNER`` (a file used for every board, or a folder), then
``$XDG_DATA_HOME/edgedeploy/runners`` (default ``~/.local/share/edgedeploy/runners``).
In a folder, the runner for target ``T`` is ``T.axf`` or ``T/ethos-u-inference_runner.axf``
or ``T/mlek_inference_runner.axf``.
"""

from __future__ import annotations

import glob
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Mapping

from ..errors import ToolMissingError, UsageError
from edgedeploy.core.proc import which
from edgedeploy.config.targets import FvpSettings, Target

ENV_FVP_DIR = "EDGEDEPLOY_FVP_DIR"
ENV_RUNNER = "EDGEDEPLOY_FVP_RUNNER"

#: Arm's download page for the Corstone FVPs (free, under Arm's EULA).
FVP_DOWNLOAD_PAGE = "https://developer.arm.com/Tools%20and%20Software/Fixed%20Virtual%20Platforms/IoT%20FVPs"
#: Arm ML Embedded Evaluation Kit, whose ``inference_runner`` use case is the runner.
MLEK_URL = "https://gitlab.arm.com/artificial-intelligence/ethos-u/ml-embedded-evaluation-kit"

#: The FVP executables of the Corstone boards, and the installer package each comes in.
FVP_PACKAGES = {
    "FVP_Corstone_SSE-300_Ethos-U55": "Corstone-300",
    "FVP_Corstone_SSE-300_Ethos-U65": "Corstone-300",
    "FVP_Corstone_SSE-310": "Corstone-310",
    "FVP_Corstone_SSE-310_Ethos-U65": "Corstone-310",
    "FVP_Corstone_SSE-320": "Corstone-320",
}
RUNNER_NAMES = ("ethos-u-inference_runner.axf", "mlek_inference_runner.axf")
_MODEL_SUBDIRS = ("models/Linux64*_GCC-*",)


@dataclass(frozen=True)
class Found:
    """A located file and how it was found (shown by ``doctor`` and recorded in the manifest)."""

    path: Path
    how: str


# --------------------------------------------------------------------------- folders


def _home() -> Path:
    return Path(os.environ.get("HOME") or Path.home())


def usual_install_dirs() -> list[Path]:
    """Folders Arm's installers, MLEK's Dockerfile and ExecuTorch's set-up script use."""
    home = _home()
    roots: list[Path] = []
    for pattern in (
        str(home / "FVP_Corstone_SSE-3*"),
        str(home / "FVP_install_location"),
        str(home / "FVP-corstone3*"),
        "/opt/fvps/*",
        "/opt/FVP_Corstone_SSE-3*",
    ):
        roots.extend(Path(p) for p in sorted(glob.glob(pattern)))
    roots.append(Path("/opt/fvps"))
    roots.append(Path("/usr/local/bin"))
    return roots


def expand_dir(root: Path) -> list[Path]:
    """``root``, its ``models/Linux64*_GCC-*`` folders, and the same one level down."""
    out = [root]
    for sub in _MODEL_SUBDIRS:
        out.extend(Path(p) for p in sorted(glob.glob(str(root / sub))))
        out.extend(Path(p) for p in sorted(glob.glob(str(root / "*" / sub))))
    return out


def _env_dirs(env: Mapping[str, str]) -> list[Path]:
    value = env.get(ENV_FVP_DIR, "")
    return [Path(p).expanduser() for p in value.split(os.pathsep) if p.strip()]


def _is_executable(path: Path) -> bool:
    return path.is_file() and os.access(path, os.X_OK)


def _search(name: str, dirs: Iterable[Path]) -> Path | None:
    for d in dirs:
        for folder in expand_dir(d):
            candidate = folder / name
            if _is_executable(candidate):
                return candidate
    return None


# --------------------------------------------------------------------------- FVPs


def locate_fvp_binary(
    name: str, explicit: Path | str | None = None, env: Mapping[str, str] | None = None
) -> Found | None:
    """Where the FVP executable ``name`` is, or None. An explicit path must exist."""
    env = os.environ if env is None else env
    if explicit is not None:
        path = Path(explicit).expanduser()
        if path.is_dir():
            hit = _search(name, [path])
            return Found(hit, f"--fvp {path}") if hit else None
        if not path.exists():
            raise ToolMissingError(f"--fvp {path} does not exist", "pass the path of an installed FVP executable")
        if not _is_executable(path):
            raise ToolMissingError(f"--fvp {path} is not an executable file", "pass the FVP executable itself")
        return Found(path, "--fvp")
    dirs = _env_dirs(env)
    if dirs:
        hit = _search(name, dirs)
        if hit:
            return Found(hit, f"${ENV_FVP_DIR}")
    on_path = which(name)
    if on_path:
        return Found(Path(on_path), "PATH")
    hit = _search(name, usual_install_dirs())
    return Found(hit, "install folder") if hit else None


def fvp_missing_error(target: Target) -> ToolMissingError:
    binary = target.fvp.binary if target.fvp else "an FVP"
    package = FVP_PACKAGES.get(binary, "Corstone")
    return ToolMissingError(
        f"the Arm FVP {binary} needed for target {target.name} is not installed",
        f"download the {package} FVP from {FVP_DOWNLOAD_PAGE}, install it, then set "
        f"{ENV_FVP_DIR} to its folder, put it on PATH, or pass --fvp PATH (see fvp/README.md)",
    )


def _check_board(target: Target) -> FvpSettings:
    """The FVP settings of a board target; a :class:`UsageError` for an NPU configuration."""
    if target.kind != "board" or target.fvp is None:
        raise UsageError(
            f"target {target.name} is an NPU configuration, not a board with an FVP",
            "pass a board target such as corstone-300-u55-128 (see `edgedeploy targets list`)",
        )
    return target.fvp


def find_fvp(target: Target, explicit: Path | str | None = None, env: Mapping[str, str] | None = None) -> Found:
    """The FVP executable for a board target, or :class:`ToolMissingError` saying how to get it."""
    found = locate_fvp_binary(_check_board(target).binary, explicit, env)
    if found is None:
        raise fvp_missing_error(target)
    if explicit is not None and found.path.is_file() and not Path(explicit).is_dir():
        _check_explicit_name(found.path, target)
    return found


def _check_explicit_name(path: Path, target: Target) -> None:
    """An explicitly named Corstone FVP must be the target's own (or its AVH twin)."""
    name = path.name
    expected = _check_board(target).binary
    accepted = {expected, expected.replace("FVP_", "VHT_", 1)}
    if (name.startswith("FVP_Corstone") or name.startswith("VHT_Corstone")) and name not in accepted:
        raise UsageError(
            f"--fvp {path} is the FVP of another board; target {target.name} runs on {expected}",
            f"pass the {expected} executable, or choose the target that matches {name}",
        )


def find_any_fvp(env: Mapping[str, str] | None = None) -> Path | None:
    """Any installed Corstone FVP (used to decide whether FVP tests can run)."""
    for name in FVP_PACKAGES:
        found = locate_fvp_binary(name, env=env)
        if found is not None:
            return found.path
    return None


# --------------------------------------------------------------------------- runner


def default_runner_dir(env: Mapping[str, str] | None = None) -> Path:
    env = os.environ if env is None else env
    base = env.get("XDG_DATA_HOME") or str(_home() / ".local" / "share")
    return Path(base) / "edgedeploy" / "runners"


def runner_candidates(folder: Path, target_name: str) -> list[Path]:
    return [folder / f"{target_name}.axf", *(folder / target_name / n for n in RUNNER_NAMES)]


def _runner_in(folder: Path, target_name: str) -> Path | None:
    return next((p for p in runner_candidates(folder, target_name) if p.is_file()), None)


def locate_runner(
    target_name: str, explicit: Path | str | None = None, env: Mapping[str, str] | None = None
) -> Found | None:
    env = os.environ if env is None else env
    if explicit is not None:
        path = Path(explicit).expanduser()
        if path.is_dir():
            hit = _runner_in(path, target_name)
            return Found(hit, f"--runner {path}") if hit else None
        if not path.is_file():
            raise ToolMissingError(
                f"--runner {path} does not exist", "pass the inference_runner .axf built for this board"
            )
        return Found(path, "--runner")
    value = env.get(ENV_RUNNER, "").strip()
    if value:
        path = Path(value).expanduser()
        if path.is_file():
            return Found(path, f"${ENV_RUNNER}")
        if path.is_dir():
            hit = _runner_in(path, target_name)
            if hit:
                return Found(hit, f"${ENV_RUNNER}")
    hit = _runner_in(default_runner_dir(env), target_name)
    return Found(hit, "runner folder") if hit else None


def runner_build_hint(target: Target) -> str:
    from .command import mlek_build_options

    opts = " ".join(mlek_build_options(target))
    return (
        f"build Arm ML Embedded Evaluation Kit's inference_runner with dynamic model loading "
        f"(cmake {opts} -Dinference_runner_DYNAMIC_MEM_LOAD_ENABLED=ON -DUSE_CASE_BUILD=inference_runner), "
        f"then pass --runner APP.axf, set {ENV_RUNNER}, or copy it to "
        f"{default_runner_dir() / (target.name + '.axf')} (see fvp/README.md)"
    )


def find_runner(target: Target, explicit: Path | str | None = None, env: Mapping[str, str] | None = None) -> Found:
    """The runner application for a board target, or :class:`ToolMissingError` saying how to build one."""
    _check_board(target)
    found = locate_runner(target.name, explicit, env)
    if found is None:
        raise ToolMissingError(
            f"no inference runner application for target {target.name} was found", runner_build_hint(target)
        )
    return found
