"""Ethos-U targets as data.

One TOML file per NPU configuration or board, loaded into frozen objects and
validated on load. A target says what the hardware *is*; what the user asks
the tools to *do* (``--optimise``, sparsity, clusters ...) lives elsewhere.
"""

from __future__ import annotations

import configparser
import difflib
import re
from dataclasses import dataclass, field
from functools import lru_cache
from importlib import resources
from pathlib import Path
from typing import Any, Mapping

from edgedeploy.errors import InvalidInputError, TargetError
from edgedeploy.core.names import check_name, is_valid
from edgedeploy.config.keys import Key, read_toml, validate
from edgedeploy.core.files import check_input_file, read_input_bytes, sha256_file, sha256_json

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
    """One NPU configuration or board, loaded from its TOML file and validated: what the hardware is."""

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
    repo = Path(__file__).resolve().parents[3] / "targets"
    if repo.is_dir():
        return repo
    raise TargetError("the built-in target files are missing from this installation", "reinstall edgedeploy")


def builtin_target_names() -> list[str]:
    return sorted(p.stem for p in builtin_targets_dir().glob("*.toml"))


def list_targets() -> list[Target]:
    """Every built-in target (the TOML files in ``targets/``), loaded and validated, in file-name order."""
    return [load_target_file(p) for p in sorted(builtin_targets_dir().glob("*.toml"))]


def get_target(name_or_path: str) -> Target:
    """A built-in target by name, or a user's TOML file by path."""
    if not isinstance(name_or_path, str) or not name_or_path or "\0" in name_or_path:
        raise TargetError(f"target {name_or_path!r} is not a name or a path", "give a target name or a .toml file")
    candidate = Path(name_or_path)
    if candidate.suffix == ".toml" or candidate.exists():
        return load_target_file(candidate)
    path = builtin_targets_dir() / f"{name_or_path}.toml"
    if not is_valid("target", name_or_path) or not path.is_file():
        names = builtin_target_names()
        close = difflib.get_close_matches(name_or_path, names, n=1)
        guess = f"did you mean {close[0]}? " if close else ""
        raise TargetError(
            f"unknown target {name_or_path!r}",
            f"{guess}valid targets: {', '.join(names)} (or a path to your own .toml)",
        )
    return load_target_file(path)


@lru_cache(maxsize=None)
def _load_cached(path: Path, mtime_ns: int) -> Target:
    return _parse(path, read_toml(path, "target file", TargetError))


def load_target_file(path: Path) -> Target:
    try:
        check_input_file(path, "target file", "settings")  # a regular file of bounded size, named as given
    except InvalidInputError as exc:
        raise TargetError(exc.message, exc.hint) from None
    path = Path(path).resolve()
    return _load_cached(path, path.stat().st_mtime_ns)


_T = "fix the target file"
_ADDRESS: dict[str, Any] = dict(minimum=0, maximum=2**32 - 1)
TARGET_KEYS: tuple[Key, ...] = (
    Key("schema_version", int, SCHEMA_VERSION, "version of the target file format", choices=(SCHEMA_VERSION,),
        required=True),
    Key("name", str, None, "the target's name (a folder name in run folders)", required=True),
    Key("kind", str, None, "an NPU configuration or a board", choices=KINDS, required=True),
    Key("description", str, "", "one line about the target"),
    Key("npu.accelerator_config", str, None, "Vela's --accelerator-config", choices=ACCELERATOR_CONFIGS,
        required=True),
    Key("vela.config", str, None, "vela.ini: beside the target file, or one of Vela's bundled files",
        required=True),
    Key("vela.system_config", str, None, "a System_Config section of that vela.ini", required=True),
    Key("vela.memory_mode", str, None, "a Memory_Mode section of that vela.ini", required=True),
    Key("clocks.npu_hz", int, None, "NPU clock in Hz (latency = cycles / npu_hz)", minimum=1, required=True),
    Key("cpu.core", str, None, "the board's CPU core (boards only)", required_when="boards"),
    Key("memory.sram_bytes", int, None, "SRAM for the tensor arena (boards only)", required_when="boards", minimum=1),
    Key("memory.flash_bytes", int, None, "flash or DRAM the model is read from (boards only)", required_when="boards", minimum=1),
    Key("memory.runtime_margin_bytes", int, None, "bytes kept for the runtime's own buffers (boards only)", required_when="boards",
        minimum=0),
    Key("memory.model_section", str, None, "linker section of the compiled model (boards only)", required_when="boards"),
    Key("fvp.binary", str, None, "the Corstone FVP executable (boards only)", required_when="boards"),
    Key("fvp.num_macs_param", str, None, "the FVP parameter that sets the NPU's MACs (boards only)", required_when="boards"),
    Key("fvp.model_address", int, None, "where the FVP loads the compiled model (boards only)", required_when="boards", **_ADDRESS),
    Key("fvp.input_address", int, None, "where the FVP loads the input (boards only)", required_when="boards", **_ADDRESS),
    Key("fvp.output_address", int, None, "where the FVP's output is read (boards only)", required_when="boards", **_ADDRESS),
    Key("fvp.params.*", str, None, "one -C parameter of the FVP (a string or a number)", numbers_ok=True),
)
_BOARD_ONLY = [k.path for k in TARGET_KEYS if k.required_when == "boards"]
_FVP_PARAM = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.\-\[\]]*")


def _parse(path: Path, data: Mapping[str, Any]) -> Target:
    v = validate(data, TARGET_KEYS, str(path), TargetError, _T)
    for key in ("name", "vela.config", "vela.system_config", "vela.memory_mode"):
        if not v[key]:
            raise TargetError(f"{path}: `{key}` is ''; it must be a non-empty string", _T)
    name = check_name("target", v["name"], f"{path}: key `name`", TargetError)
    kind = v["kind"]
    if kind == "board":
        for key in _BOARD_ONLY:
            if key not in v:
                raise TargetError(f"{path}: `{key}` is missing; a board needs it", _T)
        check_name("section", v["memory.model_section"], f"{path}: key `memory.model_section`", TargetError)
    settings = VelaSettings(config=v["vela.config"], system_config=v["vela.system_config"],
                            memory_mode=v["vela.memory_mode"])
    _check_vela_sections(path, settings)
    memory = fvp = None
    if kind == "board":
        memory = BoardMemory(sram_bytes=v["memory.sram_bytes"], flash_bytes=v["memory.flash_bytes"],
                             runtime_margin_bytes=v["memory.runtime_margin_bytes"],
                             model_section=v["memory.model_section"])
        pairs = []
        for dotted, value in v.items():
            if dotted.startswith("fvp.params."):
                param = dotted.removeprefix("fvp.params.")
                if not _FVP_PARAM.fullmatch(param) or any(c in value for c in "\0\n\r"):
                    raise TargetError(f"{path}: key `fvp.params.{param}` is not an FVP parameter name and value",
                                      "use names like mps3_board.uart0.out_file and one-line values")
                pairs.append((param, value))
        fvp = FvpSettings(binary=v["fvp.binary"], num_macs_param=v["fvp.num_macs_param"],
                          model_address=v["fvp.model_address"], input_address=v["fvp.input_address"],
                          output_address=v["fvp.output_address"], params=tuple(pairs))
    return Target(
        name=name,
        kind=kind,
        description=v.get("description", ""),
        accelerator_config=v["npu.accelerator_config"],
        vela=settings,
        npu_hz=v["clocks.npu_hz"],
        source=path,
        cpu_core=v.get("cpu.core"),
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
    try:
        parser.read_string(read_input_bytes(path, "Vela configuration file", "settings").decode("utf-8"), str(path))
    except InvalidInputError as exc:
        raise TargetError(exc.message, "point vela.config at a vela.ini such as 'Arm/vela.ini'") from None
    except (configparser.Error, UnicodeDecodeError, OSError) as exc:
        detail = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise TargetError(f"{path} is not a readable Vela configuration file ({detail[:120]})",
                          "point vela.config at a vela.ini such as 'Arm/vela.ini'") from exc
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
