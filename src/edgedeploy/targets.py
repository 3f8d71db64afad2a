"""Ethos-U targets as data.

One TOML file per NPU configuration or board, loaded into frozen objects and
validated on load. A target says what the hardware *is*; what the user asks
the tools to *do* (``--optimise``, sparsity, clusters ...) lives elsewhere.
"""

from __future__ import annotations

import configparser
import difflib
import tomllib
from dataclasses import dataclass, field
from functools import lru_cache
from importlib import resources
from pathlib import Path
from typing import Any, Mapping

from .errors import TargetError
from .fsutil import sha256_file, sha256_json

SCHEMA_VERSION = 1

ACCELERATOR_CONFIGS = (
    "ethos-u55-32",
    "ethos-u55-64",
    "ethos-u55-128",
    "ethos-u55-256",
    "ethos-u65-256",
    "ethos-u65-512",
    "ethos-u85-128",
    "ethos-u85-256",
    "ethos-u85-512",
    "ethos-u85-1024",
    "ethos-u85-2048",
)
KINDS = ("npu", "board")


@dataclass(frozen=True)
class VelaSettings:
    config: str
    system_config: str
    memory_mode: str


@dataclass(frozen=True)
class BoardMemory:
    sram_bytes: int
    flash_bytes: int
    runtime_margin_bytes: int
    model_section: str


@dataclass(frozen=True)
class FvpSettings:
    binary: str
    num_macs_param: str
    model_address: int
    input_address: int
    output_address: int
    params: tuple[tuple[str, str], ...]


@dataclass(frozen=True)
class Target:
    name: str
    kind: str
    description: str
    accelerator_config: str
    vela: VelaSettings
    npu_hz: int
    source: Path
    cpu_core: str | None = None
    memory: BoardMemory | None = None
    fvp: FvpSettings | None = None
    raw: Mapping[str, Any] = field(default_factory=dict, compare=False, repr=False)

    @property
    def npu_family(self) -> str:
        return self.accelerator_config.rsplit("-", 1)[0]

    @property
    def macs_per_cycle(self) -> int:
        """MACs per cycle of the configuration (the number in its name)."""
        return int(self.accelerator_config.rsplit("-", 1)[1])

    def vela_ini_path(self) -> Path:
        return resolve_vela_config(self.vela.config, self.source)

    def vela_ini_sha256(self) -> str:
        return sha256_file(self.vela_ini_path())

    def fingerprint(self) -> str:
        """A hash of everything about the target that can change a compile."""
        return sha256_json({"target": dict(self.raw), "vela_ini": self.vela_ini_sha256()})

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "kind": self.kind,
            "description": self.description,
            "source": str(self.source),
            "accelerator_config": self.accelerator_config,
            "npu_family": self.npu_family,
            "macs_per_cycle": self.macs_per_cycle,
            "npu_hz": self.npu_hz,
            "vela": {
                "config": self.vela.config,
                "config_path": str(self.vela_ini_path()),
                "config_sha256": self.vela_ini_sha256(),
                "system_config": self.vela.system_config,
                "memory_mode": self.vela.memory_mode,
            },
            "cpu_core": self.cpu_core,
            "memory": None if self.memory is None else self.memory.__dict__.copy(),
            "fvp": None
            if self.fvp is None
            else {**{k: v for k, v in self.fvp.__dict__.items() if k != "params"}, "params": dict(self.fvp.params)},
        }


# --------------------------------------------------------------------------- loading


def builtin_targets_dir() -> Path:
    """The folder holding the shipped target files (inside the wheel, or the repo's ``targets/``)."""
    packaged = resources.files("edgedeploy") / "targets"
    if packaged.is_dir():
        return Path(str(packaged))
    repo = Path(__file__).resolve().parents[2] / "targets"
    if repo.is_dir():
        return repo
    raise TargetError("the built-in target files are missing from this installation", "reinstall edgedeploy")


def builtin_target_names() -> list[str]:
    return sorted(p.stem for p in builtin_targets_dir().glob("*.toml"))


def list_targets() -> list[Target]:
    return [load_target_file(p) for p in sorted(builtin_targets_dir().glob("*.toml"))]


def get_target(name_or_path: str) -> Target:
    """A built-in target by name, or a user's TOML file by path."""
    candidate = Path(name_or_path)
    if candidate.suffix == ".toml" or candidate.exists():
        if not candidate.is_file():
            raise TargetError(f"target file {candidate} does not exist", "check the path")
        return load_target_file(candidate)
    path = builtin_targets_dir() / f"{name_or_path}.toml"
    if not path.is_file():
        names = builtin_target_names()
        close = difflib.get_close_matches(name_or_path, names, n=1)
        guess = f"did you mean {close[0]}? " if close else ""
        raise TargetError(
            f"unknown target '{name_or_path}'",
            f"{guess}valid targets: {', '.join(names)} (or a path to your own .toml)",
        )
    return load_target_file(path)


@lru_cache(maxsize=None)
def _load_cached(path: Path, mtime_ns: int) -> Target:
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except tomllib.TOMLDecodeError as exc:
        raise TargetError(f"{path}: not valid TOML ({exc})", "fix the syntax") from exc
    except OSError as exc:
        raise TargetError(f"{path}: cannot be read ({exc.strerror})", "check the path and permissions") from exc
    return _parse(path, data)


def load_target_file(path: Path) -> Target:
    path = Path(path).resolve()
    try:
        mtime = path.stat().st_mtime_ns
    except OSError as exc:
        raise TargetError(f"target file {path} does not exist", "check the path") from exc
    return _load_cached(path, mtime)


class _Reader:
    """Typed access to a TOML table that names the file and key path on error."""

    def __init__(self, path: Path, data: Mapping[str, Any], prefix: str = "") -> None:
        self.path, self.data, self.prefix = path, data, prefix

    def _fail(self, key: str, what: str) -> TargetError:
        return TargetError(f"{self.path}: key `{self.prefix}{key}` {what}", "fix the target file")

    def table(self, key: str, required: bool = True) -> "_Reader | None":
        value = self.data.get(key)
        if value is None:
            if required:
                raise self._fail(key, "is missing (a table is required)")
            return None
        if not isinstance(value, dict):
            raise self._fail(key, "must be a table")
        return _Reader(self.path, value, f"{self.prefix}{key}.")

    def string(self, key: str, allowed: tuple[str, ...] | None = None, required: bool = True) -> str | None:
        value = self.data.get(key)
        if value is None:
            if required:
                raise self._fail(key, "is missing" + (f"; allowed values: {', '.join(allowed)}" if allowed else ""))
            return None
        if not isinstance(value, str) or not value:
            raise self._fail(key, "must be a non-empty string")
        if allowed is not None and value not in allowed:
            raise self._fail(key, f"is '{value}'; allowed values: {', '.join(allowed)}")
        return value

    def integer(self, key: str, minimum: int = 0, required: bool = True) -> int | None:
        value = self.data.get(key)
        if value is None:
            if required:
                raise self._fail(key, f"is missing (an integer >= {minimum})")
            return None
        if isinstance(value, float) and value.is_integer():
            value = int(value)
        if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
            raise self._fail(key, f"is {value!r}; it must be an integer >= {minimum}")
        return value


def _parse(path: Path, data: Mapping[str, Any]) -> Target:
    r = _Reader(path, data)
    version = r.integer("schema_version", minimum=1)
    if version != SCHEMA_VERSION:
        raise TargetError(
            f"{path}: key `schema_version` is {version}; allowed values: {SCHEMA_VERSION}", "fix the target file"
        )
    name = r.string("name")
    kind = r.string("kind", KINDS)
    description = r.string("description", required=False) or ""
    npu = r.table("npu")
    accel = npu.string("accelerator_config", ACCELERATOR_CONFIGS)
    vela = r.table("vela")
    settings = VelaSettings(
        config=vela.string("config"),
        system_config=vela.string("system_config"),
        memory_mode=vela.string("memory_mode"),
    )
    _check_vela_sections(path, settings)
    clocks = r.table("clocks")
    npu_hz = clocks.integer("npu_hz", minimum=1)
    cpu = r.table("cpu", required=(kind == "board"))
    memory = None
    fvp = None
    if kind == "board":
        mem = r.table("memory")
        memory = BoardMemory(
            sram_bytes=mem.integer("sram_bytes", minimum=1),
            flash_bytes=mem.integer("flash_bytes", minimum=1),
            runtime_margin_bytes=mem.integer("runtime_margin_bytes", minimum=0),
            model_section=mem.string("model_section"),
        )
        f = r.table("fvp")
        params = f.table("params", required=False)
        pairs: list[tuple[str, str]] = []
        for key, value in (params.data if params else {}).items():
            if not isinstance(value, (str, int, float)) or isinstance(value, bool):
                raise TargetError(f"{path}: key `fvp.params.{key}` must be a string or number", "fix the target file")
            pairs.append((key, str(value)))
        fvp = FvpSettings(
            binary=f.string("binary"),
            num_macs_param=f.string("num_macs_param"),
            model_address=f.integer("model_address"),
            input_address=f.integer("input_address"),
            output_address=f.integer("output_address"),
            params=tuple(pairs),
        )
    return Target(
        name=name,
        kind=kind,
        description=description,
        accelerator_config=accel,
        vela=settings,
        npu_hz=npu_hz,
        source=path,
        cpu_core=cpu.string("core") if cpu else None,
        memory=memory,
        fvp=fvp,
        raw=data,
    )


# --------------------------------------------------------------------------- vela.ini


def vela_config_files_dir() -> Path | None:
    """Vela's bundled ``config_files`` folder, found without importing Vela."""
    try:
        root = resources.files("ethosu") / "config_files"
    except ModuleNotFoundError:
        return None
    return Path(str(root)) if root.is_dir() else None


def resolve_vela_config(config: str, target_file: Path) -> Path:
    """A ``vela.ini`` named relative to the target file, or one of Vela's bundled files."""
    local = (target_file.parent / config).resolve()
    if local.is_file():
        return local
    bundled = vela_config_files_dir()
    if bundled is not None and (bundled / config).is_file():
        return bundled / config
    raise TargetError(
        f"{target_file}: key `vela.config` names '{config}', which is neither a file beside the target "
        "nor one of Vela's bundled configuration files",
        "use 'Arm/vela.ini' or a path relative to the target file",
    )


@lru_cache(maxsize=None)
def _ini_sections(path: Path) -> tuple[frozenset[str], frozenset[str]]:
    parser = configparser.ConfigParser()
    parser.read(path, encoding="utf-8")
    systems = frozenset(s.split(".", 1)[1] for s in parser.sections() if s.startswith("System_Config."))
    modes = frozenset(s.split(".", 1)[1] for s in parser.sections() if s.startswith("Memory_Mode."))
    return systems, modes


def _check_vela_sections(path: Path, settings: VelaSettings) -> None:
    ini = resolve_vela_config(settings.config, path)
    systems, modes = _ini_sections(ini)
    if settings.system_config not in systems:
        raise TargetError(
            f"{path}: key `vela.system_config` is '{settings.system_config}'; "
            f"allowed values in {ini.name}: {', '.join(sorted(systems))}",
            "fix the target file",
        )
    if settings.memory_mode not in modes:
        raise TargetError(
            f"{path}: key `vela.memory_mode` is '{settings.memory_mode}'; "
            f"allowed values in {ini.name}: {', '.join(sorted(modes))}",
            "fix the target file",
        )
