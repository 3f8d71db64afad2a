"""Read an FVP console transcript: pure functions over text, no processes.

Recognised NPU profile formats (all Ethos-U PMU counters):

* ML Embedded Evaluation Kit 21.11-24.05: ``NPU ACTIVE cycles: N``, ``NPU AXI0_RD_DATA_BEAT_RECEIVED beats: N``;
* ML Embedded Evaluation Kit 26.x: ``NPU ACTIVE: N cycles``, ``NPU ETHOSU_PMU_SRAM_RD_DATA_BEAT_RECEIVED: N beats``;
* ML Embedded Evaluation Kit 21.03: ``Active NPU cycles: N`` / ``Idle NPU cycles: N`` (TAB-indented);
* ExecuTorch ``arm_perf_monitor``: ``Ethos-U PMU report:``, ``ethosu_pmu_cycle_cntr : N``,
  ``ethosu_pmu_cntr0..3 : N`` named by the ``Ethos-U PMU Events:[...]`` line;
* MLIA's generic inference runner: ``<metrics>BASE64-JSON</metrics>``.

Also read: ``arena_used_bytes``, the Kit's ``tensor arena) size used``, ExecuTorch
allocator use, the Ethos-U banner (``MACs/cc``, ``Arch``), driver configuration
lines (``macs_per_cc`` as log2), ``Application exit code``, the reason the
simulation stopped, and the FVP ``--stat`` block.

A run fails on these lines even when the FVP exits 0 (ExecuTorch's ``run_fvp.sh``
scans for ``F``/``E`` log levels, ``[critical]``, ``Hard fault`` and
"CPU time has been exceeded"; the Kit prints ``ERROR - ``, ``Invoke failed``,
``NPU config mismatch``; allocators print ``Memory allocation failed``).
ANSI colour escapes, NUL bytes, TABs, CRLF and bare CR are handled.
"""

from __future__ import annotations

import base64
import binascii
import json
import re
from dataclasses import asdict, dataclass, field
from typing import Any

_ANSI_RE = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]|\x1b[@-Z\\-_]")
_LINE_SPLIT_RE = re.compile(r"\r\n|\r|\n")


def clean_lines(text: str) -> list[str]:
    """Lines without ANSI escapes, NULs (also the ``<NUL>`` markers docs print for them) and trailing space."""
    text = _ANSI_RE.sub("", text).replace("\x00", "").replace("<NUL>", "")
    return [line.rstrip() for line in _LINE_SPLIT_RE.split(text)]


# --------------------------------------------------------------------------- results


@dataclass
class NpuProfile:
    """One inference's Ethos-U PMU counters, as one log block printed them."""

    format: str
    active_cycles: int | None = None
    idle_cycles: int | None = None
    total_cycles: int | None = None
    beats: dict[str, int] = field(default_factory=dict)
    events: dict[str, int] = field(default_factory=dict)
    derived: list[str] = field(default_factory=list)

    @property
    def empty(self) -> bool:
        return self.active_cycles is None and self.idle_cycles is None and self.total_cycles is None and not self.beats


@dataclass
class FvpStats:
    """The block ``--stat`` prints at exit. Times are the simulated system's and the host's."""

    simulated_time_s: float | None = None
    user_time_s: float | None = None
    system_time_s: float | None = None
    wall_time_s: float | None = None
    performance_index: float | None = None
    instructions: int | None = None
    mips: float | None = None
    memory_highwater_bytes: int | None = None
    cpus: dict[str, dict[str, float]] = field(default_factory=dict)


@dataclass
class FvpLog:
    """Everything read from one transcript. Counters are None when the log does not print them."""

    profiles: list[NpuProfile] = field(default_factory=list)
    inferences: int | None = None
    arena_used_bytes: int | None = None
    memory: dict[str, int] = field(default_factory=dict)
    npu_macs_per_cc: int | None = None
    optimizer_macs_per_cc: int | None = None
    npu_arch: str | None = None
    npu_driver: str | None = None
    platform: str | None = None
    app_exit_code: int | None = None
    stop_reason: str | None = None
    stats: FvpStats | None = None
    failures: list[str] = field(default_factory=list)
    formats: list[str] = field(default_factory=list)

    # The last complete profile is the one reported (a runner that repeats
    # inferences prints one block each; the last is past any warm-up).
    @property
    def profile(self) -> NpuProfile | None:
        return self.profiles[-1] if self.profiles else None

    @property
    def npu_active_cycles(self) -> int | None:
        return self.profile.active_cycles if self.profile else None

    @property
    def npu_idle_cycles(self) -> int | None:
        return self.profile.idle_cycles if self.profile else None

    @property
    def npu_total_cycles(self) -> int | None:
        return self.profile.total_cycles if self.profile else None

    @property
    def beats(self) -> dict[str, int]:
        return dict(self.profile.beats) if self.profile else {}

    @property
    def read_beats(self) -> int | None:
        values = [v for k, v in self.beats.items() if "_RD_" in k]
        return sum(values) if values else None

    @property
    def write_beats(self) -> int | None:
        values = [v for k, v in self.beats.items() if "_WR_" in k]
        return sum(values) if values else None

    @property
    def ok(self) -> bool:
        return not self.failures

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out.update(
            npu_active_cycles=self.npu_active_cycles,
            npu_idle_cycles=self.npu_idle_cycles,
            npu_total_cycles=self.npu_total_cycles,
            beats=self.beats,
            read_beats=self.read_beats,
            write_beats=self.write_beats,
        )
        return out


# --------------------------------------------------------------------------- counters

_NAME = r"[A-Za-z][A-Za-z0-9_]*(?: [A-Za-z][A-Za-z0-9_]*)*?"
# "NPU AXI0_RD_DATA_BEAT_RECEIVED beats: 2468259", "NPU ACTIVE cycles: 7345741"
_MLEK_OLD_RE = re.compile(rf"\bNPU (?P<name>{_NAME}) (?P<unit>cycles|beats)\s*:\s*(?P<value>\d+)\b")
# "NPU ACTIVE: 206205334 cycles", "NPU ETHOSU_PMU_SRAM_RD_DATA_BEAT_RECEIVED: 13858306 beats"
_MLEK_NEW_RE = re.compile(rf"\bNPU (?P<name>{_NAME})\s*:\s*(?P<value>\d+)\s+(?P<unit>cycles|beats)\b")
# "\tActive NPU cycles: 7622641"
_MLEK_LEGACY_RE = re.compile(r"\b(?P<kind>Active|Idle|Total) NPU cycles\s*:\s*(?P<value>\d+)\b")
_PROFILE_HEAD_RE = re.compile(r"Profile for Inference\s*:|Ethos-U PMU report\s*:")
_ET_CYCLES_RE = re.compile(r"\bethosu_pmu_cycle_cntr\s*:\s*(?P<value>\d+)")
_ET_CNTR_RE = re.compile(r"\bethosu_pmu_cntr(?P<index>\d+)\s*:\s*(?P<value>\d+)")
_ET_EVENTS_RE = re.compile(r"Ethos-U PMU Events\s*:\s*\[(?P<names>[^\]]*)\]")
_MLIA_RE = re.compile(r"<metrics>(?P<data>.*?)</metrics>")

_ACTIVE = {"ACTIVE", "NPU_ACTIVE"}
_IDLE = {"IDLE", "NPU_IDLE"}
_TOTAL = {"TOTAL", "NPU_TOTAL", "CYCLE", "CYCLES"}


def _counter_name(raw: str) -> str:
    name = raw.strip().upper().replace(" ", "_")
    return name.removeprefix("ETHOSU_PMU_")


def _put(profile: NpuProfile, raw_name: str, value: int, unit: str | None = None) -> bool:
    """Store one counter by name; False when the name is not an Ethos-U counter."""
    name = _counter_name(raw_name)
    if name in _ACTIVE:
        profile.active_cycles = value
    elif name in _IDLE:
        profile.idle_cycles = value
    elif name in _TOTAL:
        profile.total_cycles = value
    elif "BEAT" in name or unit == "beats":
        profile.beats[name] = value
    elif unit is None:
        profile.events[name] = value
    else:
        return False
    return True


class _ProfileReader:
    def __init__(self) -> None:
        self.done: list[NpuProfile] = []
        self.current: NpuProfile | None = None
        self.et_counters: dict[int, int] = {}

    def start(self, fmt: str) -> NpuProfile:
        self.flush()
        self.current = NpuProfile(fmt)
        return self.current

    def get(self, fmt: str) -> NpuProfile:
        if self.current is None:
            return self.start(fmt)
        if self.current.format == "unknown":
            self.current.format = fmt
        return self.current

    def flush(self) -> None:
        p = self.current
        if p is not None:
            if self.et_counters:  # counters never named by an events line
                for index, value in sorted(self.et_counters.items()):
                    p.events[f"CNTR{index}"] = value
                self.et_counters = {}
            _derive(p)
            if not p.empty or p.events:
                self.done.append(p)
        self.current = None

    def line(self, line: str) -> None:
        if _PROFILE_HEAD_RE.search(line):
            self.start("executorch" if "PMU report" in line else "unknown")
            return
        m = _MLEK_OLD_RE.search(line)
        if m and _put(self.get("mlek"), m["name"], int(m["value"]), m["unit"]):
            return
        m = _MLEK_NEW_RE.search(line)
        if m and _put(self.get("mlek-26"), m["name"], int(m["value"]), m["unit"]):
            return
        m = _MLEK_LEGACY_RE.search(line)
        if m:
            _put(self.get("mlek-21.03"), m["kind"], int(m["value"]), "cycles")
            return
        m = _ET_CYCLES_RE.search(line)
        if m:
            self.get("executorch").total_cycles = int(m["value"])
            return
        m = _ET_CNTR_RE.search(line)
        if m:
            self.get("executorch")
            self.et_counters[int(m["index"])] = int(m["value"])
            return
        m = _ET_EVENTS_RE.search(line)
        if m and self.current is not None:
            names = [n.strip() for n in m["names"].split(",") if n.strip()]
            for index, name in enumerate(names):
                if index in self.et_counters:
                    _put(self.current, name, self.et_counters.pop(index))
            return
        m = _MLIA_RE.search(line)
        if m:
            self._mlia(m["data"])

    def _mlia(self, data: str) -> None:
        try:
            groups = json.loads(base64.b64decode(data, validate=True))
        except (binascii.Error, ValueError):
            return
        profile = self.start("mlia")
        for group in groups if isinstance(groups, list) else []:
            for sample in group.get("samples", []) if isinstance(group, dict) else []:
                try:
                    name, value = str(sample["name"]), int(sample["value"][0])
                except (KeyError, IndexError, TypeError, ValueError):
                    continue
                _put(profile, name.removeprefix("NPU "), value, "beats" if "BEAT" in name.upper() else "cycles")
        self.flush()


def _derive(p: NpuProfile) -> None:
    """Fill one of active/idle/total from the other two (the Kit's logs show active + idle = total)."""
    a, i, t = p.active_cycles, p.idle_cycles, p.total_cycles
    if a is None and i is not None and t is not None and t >= i:
        p.active_cycles = t - i
        p.derived.append("active_cycles = total_cycles - idle_cycles")
    elif t is None and a is not None and i is not None:
        p.total_cycles = a + i
        p.derived.append("total_cycles = active_cycles + idle_cycles")
    elif i is None and a is not None and t is not None and t >= a:
        p.idle_cycles = t - a
        p.derived.append("idle_cycles = total_cycles - active_cycles")


# --------------------------------------------------------------------------- failures

_FAILURE_RES = [
    re.compile(r"^[EF] \[?[A-Za-z_][\w.+-]*:"),  # ExecuTorch ERROR / FATAL log levels
    re.compile(r"^[EF]: "),  # Ethos-U core driver error lines
    re.compile(r"^\[critical\]"),
    re.compile(r"Hard ?[Ff]ault"),
    re.compile(r"Simulation is stopping\. Reason: (?:CPU|Simulated) time has been exceeded"),
    re.compile(r"\bERROR\s+-\s"),  # the Kit's error log level
    re.compile(r"\[ERROR\]"),
    re.compile(r"\bInvoke failed\b"),
    re.compile(r"\bInference failed\b"),
    re.compile(r"\bNPU config mismatch\b"),
    re.compile(r"[Mm]emory allocation failed"),
    re.compile(r"\b[Ff]ailed to allocate\b"),
    re.compile(r"\bAllocateTensors\(\) failed"),
    re.compile(r"\bArena size is too small"),
    re.compile(r"Didn't find op for builtin opcode"),
    re.compile(r"Failed to get registration from op code"),
    re.compile(r"\bassert(?:ion)? failed\b", re.IGNORECASE),
]
_EXIT_RE = re.compile(r"Application exit code:\s*(-?\d+)")
_JOB_STATUS_RE = re.compile(r"inference job response\.\s*status=(-?\d+)")


def failure_lines(lines: list[str]) -> list[str]:
    """Lines that mean the run failed, whatever the exit status."""
    out = []
    for line in lines:
        text = line.strip()
        if not text:
            continue
        if any(r.search(text) for r in _FAILURE_RES):
            out.append(text)
            continue
        m = _EXIT_RE.search(text) or _JOB_STATUS_RE.search(text)
        if m and int(m.group(1)) != 0:
            out.append(text)
    return out


# --------------------------------------------------------------------------- other facts

_ARENA_RES = [
    re.compile(r"\barena_used_bytes\s*:\s*(\d+)"),
    re.compile(r"tensor arena\)? size used\s*:\s*(\d+)", re.IGNORECASE),
]
_ET_ALLOC_RE = re.compile(r"\b(?P<name>(?:method|temp)_allocator_used)\s*:\s*(?P<used>\d+)\s*/\s*(?P<pool>\d+)")
_ET_BYTES_RE = re.compile(
    r"\b(?P<name>method_allocator_(?:planned|loaded|input|executor)|model_pte_loaded_size)\s*:\s*(?P<value>\d+)\s*bytes"
)
_INFERENCES_RE = re.compile(r"(?:Total number of inferences|NPU Inferences)\s*:\s*(\d+)")
_BANNER_MACS_RE = re.compile(r"\bMACs/cc\s*:\s*(\d+)")
_FVP_CONFIG_RE = re.compile(r"Creating Ethos-U\d+ with config [A-Z](\d+)")
_ARCH_RE = re.compile(r"\bArch\s*:\s*v?([\d.]+)")
_DRIVER_RE = re.compile(r"\bDriver\s*:\s*v?([\d.]+)")
_DESIGN_RE = re.compile(r"Target system design\s*:\s*(.+)$")
_LOG2_MACS_RE = re.compile(r"\bmacs_per_cc\s*[:=]\s*(\d+)")
_MISMATCH_MACS_RE = re.compile(r"\bnpu\.macs_per_cc=(\d+)\s+optimizer\.macs_per_cc=(\d+)")
_STOP_RE = re.compile(r"Simulation is stopping\. Reason: (.+?)\.?$")

_STAT_HEAD_RE = re.compile(r"^-+ .* statistics: -+$")
_STAT_TIME_RE = re.compile(r"^(Simulated|User|System|Wall) time\s*:\s*([\d.]+)\s*s\b")
_STAT_PERF_RE = re.compile(r"^Performance index\s*:\s*([\d.]+)")
_STAT_CPU_RE = re.compile(r"^(?P<cpu>\S+)\s*:\s*(?P<mips>[\d.]+)\s*MIPS\s*\(\s*(?P<inst>\d+)\s*Inst\)")
_STAT_HIGHWATER_RE = re.compile(r"^Memory highwater mark\s*:\s*(0x[0-9A-Fa-f]+|\d+)\s*bytes")


def _log2_macs(value: str) -> int | None:
    n = int(value)
    return 1 << n if 0 <= n <= 16 else None


def _read_stats(lines: list[str]) -> FvpStats | None:
    start = next((i for i, line in enumerate(lines) if _STAT_HEAD_RE.match(line.strip())), None)
    if start is None:
        return None
    stats = FvpStats()
    for line in lines[start + 1 :]:
        text = line.strip()
        if text.startswith("---"):
            break
        m = _STAT_TIME_RE.match(text)
        if m:
            setattr(stats, f"{m.group(1).lower()}_time_s", float(m.group(2)))
            continue
        m = _STAT_PERF_RE.match(text)
        if m:
            stats.performance_index = float(m.group(1))
            continue
        m = _STAT_HIGHWATER_RE.match(text)
        if m:
            stats.memory_highwater_bytes = int(m.group(1), 0)
            continue
        m = _STAT_CPU_RE.match(text)
        if m:
            stats.cpus[m["cpu"]] = {"mips": float(m["mips"]), "instructions": int(m["inst"])}
    if stats.cpus:
        stats.instructions = sum(int(c["instructions"]) for c in stats.cpus.values())
        stats.mips = sum(c["mips"] for c in stats.cpus.values())
    return stats


def parse_fvp_log(text: str) -> FvpLog:
    """Read a whole FVP console transcript (stdout and stderr together)."""
    lines = clean_lines(text)
    log = FvpLog()
    reader = _ProfileReader()
    arenas: list[int] = []
    for raw in lines:
        line = raw.strip()
        if not line:
            continue
        reader.line(line)
        for r in _ARENA_RES:
            m = r.search(line)
            if m:
                arenas.append(int(m.group(1)))
        m = _ET_ALLOC_RE.search(line)
        if m:
            log.memory[f"{m['name']}_bytes"] = int(m["used"])
            log.memory[f"{m['name'].removesuffix('_used')}_pool_bytes"] = int(m["pool"])
        m = _ET_BYTES_RE.search(line)
        if m:
            log.memory[f"{m['name'].removesuffix('_size')}_bytes"] = int(m["value"])
        m = _INFERENCES_RE.search(line)
        if m:
            log.inferences = int(m.group(1))
        m = _BANNER_MACS_RE.search(line) or _FVP_CONFIG_RE.search(line)
        if m:
            log.npu_macs_per_cc = int(m.group(1))
        m = _ARCH_RE.search(line)
        if m and log.npu_arch is None:
            log.npu_arch = m.group(1)
        m = _DRIVER_RE.search(line)
        if m and log.npu_driver is None:
            log.npu_driver = m.group(1)
        m = _DESIGN_RE.search(line)
        if m:
            log.platform = m.group(1).strip()
        m = _MISMATCH_MACS_RE.search(line)
        if m:
            log.npu_macs_per_cc = _log2_macs(m.group(1))
            log.optimizer_macs_per_cc = _log2_macs(m.group(2))
        else:
            m = _LOG2_MACS_RE.search(line)
            if m and "Optimizer config" in line:
                log.optimizer_macs_per_cc = _log2_macs(m.group(1))
            elif m and line.startswith("Ethos-U config"):
                log.npu_macs_per_cc = _log2_macs(m.group(1))
        m = _EXIT_RE.search(line)
        if m:
            log.app_exit_code = int(m.group(1))
        m = _STOP_RE.search(line)
        if m:
            log.stop_reason = m.group(1)
    reader.flush()
    log.profiles = reader.done
    log.arena_used_bytes = max(arenas) if arenas else None
    log.stats = _read_stats(lines)
    log.failures = failure_lines(lines)
    formats = [p.format for p in log.profiles]
    if log.stats is not None:
        formats.append("fvp-stat")
    log.formats = list(dict.fromkeys(formats))
    return log
