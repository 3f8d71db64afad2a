"""The run manifest: one JSON file per run folder, saved after every stage.

Every stage records a :class:`StageRecord` (what ran, with which tool and
arguments, on which inputs, what it wrote, what it measured). ``report`` and
``export`` read only this file and the artifacts it names.
"""

from __future__ import annotations

import functools
import json
import math
import os
import platform
import stat
import time
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any, Iterable, Literal, Mapping

from edgedeploy import __version__
from edgedeploy.errors import InvalidInputError
from edgedeploy.core.files import atomic_write_text, read_input_text, sha256_file

SCHEMA = "edgedeploy.manifest"
SCHEMA_VERSION = 1
MANIFEST_NAME = "manifest.json"

Mode = Literal["estimated", "simulated", "measured", "computed"]


@dataclass
class Metric:
    """A value with a unit and how it was obtained; ``value`` is None when unavailable."""

    value: float | int | str | None
    unit: str
    mode: Mode
    unavailable: str | None = None

    @classmethod
    def missing(cls, unit: str, mode: Mode, reason: str) -> "Metric":
        return cls(None, unit, mode, reason)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"value": self.value, "unit": self.unit, "mode": self.mode}
        if self.value is None:
            out["unavailable"] = self.unavailable or "not measured"
        return out


@dataclass
class Artifact:
    role: str
    path: str  # relative to the run folder when inside it, else absolute
    sha256: str
    bytes: int

    @classmethod
    def of(cls, role: str, path: Path, run_dir: Path) -> "Artifact":
        path = Path(path).resolve()
        try:
            shown = str(path.relative_to(run_dir.resolve()))
        except ValueError:
            shown = str(path)
        return cls(role, shown, sha256_file(path), path.stat().st_size)


@dataclass
class ToolInfo:
    name: str
    version: str
    argv: list[str] = field(default_factory=list)


@dataclass
class StageRecord:
    """One stage of a run as its manifest records it: status, tool, inputs and outputs (sha256), metrics, warnings."""

    id: str
    stage: str
    status: Literal["ok", "failed", "cached"]
    variant: str | None = None
    target: str | None = None
    parent: str | None = None
    tool: ToolInfo | None = None
    inputs: list[Artifact] = field(default_factory=list)
    outputs: list[Artifact] = field(default_factory=list)
    params: dict[str, Any] = field(default_factory=dict)
    metrics: dict[str, Metric] = field(default_factory=dict)
    details: dict[str, Any] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)
    error: str | None = None
    cache_key: str | None = None
    started: str = ""
    seconds: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        # Field by field rather than dataclasses.asdict, which deep-copies every detail (per-layer tables):
        # the manifest is written after every stage, and a sweep's grows to hundreds of records.
        out: dict[str, Any] = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name in ("inputs", "outputs"):
                value = [asdict(a) for a in value]
            elif f.name == "tool":
                value = None if value is None else asdict(value)
            elif f.name == "metrics":
                value = {k: m.to_dict() for k, m in value.items()}
            out[f.name] = value
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "StageRecord":
        data = dict(data)
        tool = data.pop("tool", None)
        inputs = [Artifact(**a) for a in data.pop("inputs", [])]
        outputs = [Artifact(**a) for a in data.pop("outputs", [])]
        metrics = {
            k: Metric(m.get("value"), m.get("unit", ""), m.get("mode", "computed"), m.get("unavailable"))
            for k, m in data.pop("metrics", {}).items()
        }
        for k, m in metrics.items():  # every metric edgedeploy records is a finite number; else a damaged file
            if m.value is not None and (isinstance(m.value, bool) or not isinstance(m.value, (int, float))
                                        or abs(m.value) > 2**63 or not math.isfinite(m.value)):
                raise TypeError(f"metric {k!r} of {data.get('id')!r} is {m.value!r:.40}, not a number")
        for name, kind in (("id", str), ("stage", str), ("params", dict), ("details", dict), ("warnings", list)):
            if name in data and not isinstance(data[name], kind):
                raise TypeError(f"{name!r} of stage {data.get('id')!r} is {type(data[name]).__name__}")
        _check_names(data)
        if data.get("status") not in ("ok", "failed", "cached"):
            raise ValueError(f"stage {data.get('id')!r} has status {data.get('status')!r}")
        _check_details(data.get("id"), data.get("details") or {})
        return cls(
            tool=ToolInfo(**tool) if tool else None, inputs=inputs, outputs=outputs, metrics=metrics, **data
        )

    def metric(self, name: str) -> float | int | str | None:
        m = self.metrics.get(name)
        return None if m is None else m.value

    def output(self, role: str) -> Artifact | None:
        return next((a for a in self.outputs if a.role == role), None)


# The detail sections that report, export and fvp compute with, and the kind each must be (a hand-edited
# manifest is read like user input: a wrong kind is one "damaged" error, never an internal one).
DETAIL_KINDS: dict[str, type] = {"data": dict, "metric": dict, "npu_compute": dict, "npu_weights": dict,
                                 "sweep": dict}
DATA_DETAIL_KINDS: dict[str, tuple[type, ...]] = {
    "path": (str,), "sha256": (str,), "layout": (str,), "task": (str,), "labels": (list,), "input_shape": (list,),
}


def _check_names(data: Mapping[str, Any]) -> None:
    """A record's id, variant, target and parent become folder names, C text and report cells: read back, each part
    must be a checked name (as when it was written), never ``..``, a ``/``-path out of the run or markup."""
    from edgedeploy.core.names import is_valid

    rid = data.get("id")
    if not isinstance(rid, str) or not all(is_valid("target", part) for part in rid.split("/")):
        raise ValueError(f"stage id {str(rid)[:80]!r} is not made of checked names")
    for key in ("variant", "target", "parent"):
        value = data.get(key)
        parts: list[Any] = [value]
        if isinstance(value, str) and key == "parent":
            parts = value.split("/")
        if value is not None and not all(isinstance(p, str) and is_valid("target", p) for p in parts):
            raise ValueError(f"{key} of stage {rid[:80]!r} is {str(value)[:80]!r}, not a checked name")


def _check_details(record_id: Any, details: dict[str, Any]) -> None:
    for name, kind in DETAIL_KINDS.items():
        if details.get(name) is not None and not isinstance(details[name], kind):
            raise TypeError(f"details.{name} of stage {str(record_id)[:80]!r} is {type(details[name]).__name__}, "
                            f"not a {'table' if kind is dict else kind.__name__}")
    for key, kinds in DATA_DETAIL_KINDS.items():
        value = (details.get("data") or {}).get(key)
        if value is not None and not isinstance(value, kinds):
            raise TypeError(f"details.data.{key} of stage {str(record_id)[:80]!r} is {type(value).__name__}")
    labels = (details.get("data") or {}).get("labels")
    if labels is not None and not all(isinstance(v, str) for v in labels):
        raise TypeError(f"details.data.labels of stage {str(record_id)[:80]!r} holds values that are not text")


def now_iso() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())



@functools.cache
def host_platform() -> str:
    """``platform.platform()``'s text on Linux (system-release-machine-with-libc) without the ``uname -p``
    process it starts to learn a processor name it then leaves out."""
    lib, version = platform.libc_ver()
    text = f"{platform.system()}-{platform.release()}-{platform.machine()}"
    return f"{text}-with-{lib}{version}" if lib else text

class Manifest:
    """The manifest of one run folder. Only the main process writes it."""

    def __init__(self, run_dir: Path, data: dict[str, Any] | None = None) -> None:
        self.run_dir = Path(run_dir)
        data = data or {}
        self.created: str = data.get("created") or now_iso()
        self.tools: dict[str, str] = dict(data.get("tools", {}))
        self.targets: dict[str, Any] = dict(data.get("targets", {}))
        for name, target in self.targets.items():  # what report and export compute with
            if not isinstance(target, dict):
                raise TypeError(f"target {name!r} is {type(target).__name__}, not a table")
            for key in ("npu_hz", "macs_per_cycle"):
                value = target.get(key)
                if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value <= 0):
                    raise ValueError(f"target {name!r}: {key} is {value!r}, not a positive integer")
        self.info: dict[str, Any] = dict(data.get("info", {}))
        self.records: dict[str, StageRecord] = {
            r["id"]: StageRecord.from_dict(r) for r in data.get("stages", [])
        }
        self._texts: dict[str, tuple[StageRecord, str]] = {}  # record id -> (record, its JSON text in the file)

    @property
    def path(self) -> Path:
        return self.run_dir / MANIFEST_NAME

    @classmethod
    def load(cls, run_dir: Path) -> "Manifest":
        path = Path(run_dir) / MANIFEST_NAME
        try:
            if not os.path.lexists(path):
                raise FileNotFoundError(path)
            # a regular file of bounded size: a FIFO or /dev/zero in its place never blocks or fills memory
            data = json.loads(read_input_text(path, "run manifest", "manifest"))
        except FileNotFoundError as exc:
            raise InvalidInputError(
                f"{run_dir} has no {MANIFEST_NAME}", "point at a folder written by `edgedeploy compile` or `optimize`"
            ) from exc
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise InvalidInputError(f"{path} is not valid JSON ({exc})", "re-run the command that wrote it") from exc
        except OSError as exc:
            raise InvalidInputError(f"{path} cannot be read ({exc.strerror})", "check the path and permissions") from exc
        except RecursionError as exc:
            raise InvalidInputError(f"{path} is nested too deeply to be a manifest", "point at a run folder") from exc
        if not isinstance(data, dict) or data.get("schema") != SCHEMA:
            raise InvalidInputError(f"{path} is not an edgedeploy manifest", "point at a run folder")
        version = data.get("schema_version", 0)
        if not isinstance(version, int) or isinstance(version, bool):
            raise InvalidInputError(f"{path} has schema version {version!r}", "re-run the command that wrote it")
        if version > SCHEMA_VERSION:
            raise InvalidInputError(
                f"{path} has schema version {data.get('schema_version')}, newer than this edgedeploy "
                f"understands ({SCHEMA_VERSION})",
                "upgrade edgedeploy",
            )
        try:
            return cls(path.parent, data)
        except (TypeError, ValueError, KeyError, AttributeError) as exc:
            raise InvalidInputError(f"{path} is damaged ({type(exc).__name__}: {exc})",
                                    "re-run the command that wrote it into a new folder") from exc

    @classmethod
    def open(cls, run_dir: Path) -> "Manifest":
        """Load the manifest of ``run_dir`` if there is one, else start an empty one."""
        if (Path(run_dir) / MANIFEST_NAME).exists():
            return cls.load(run_dir)
        return cls(run_dir)

    def record(self, rec: StageRecord) -> None:
        self.records[rec.id] = rec
        self.save()

    def find(self, stage: str | None = None, variant: str | None = None, target: str | None = None) -> list[StageRecord]:
        return [
            r
            for r in self.records.values()
            if (stage is None or r.stage == stage)
            and (variant is None or r.variant == variant)
            and (target is None or r.target == target)
        ]

    def variants(self) -> list[str]:
        seen: dict[str, None] = {}
        for r in self.records.values():
            if r.variant:
                seen.setdefault(r.variant)
        return list(seen)

    def resolve(self, artifact: Artifact) -> Path:
        """Where a stage's output lies: read back from the manifest, it is checked as input and must resolve
        inside the run folder (a hand-edited absolute path, a ``..`` or a link out of the folder is refused)."""
        return self.inside(artifact.path, f"artifact '{artifact.role}'")

    def inside(self, recorded: object, what: str) -> Path:
        """The path ``recorded`` in this manifest, which must lie inside the run folder (links resolved)."""
        from edgedeploy.core.files import short

        path = Path(recorded) if isinstance(recorded, str) and recorded and "\x00" not in recorded else None
        link = ""
        if path is not None and not path.is_absolute():
            root = os.path.realpath(self.run_dir)
            real = os.path.realpath(self.run_dir / path)
            if real == root or real.startswith(root.rstrip(os.sep) + os.sep):
                return self.run_dir / path
            if ".." not in path.parts:  # a path inside the folder that a link leads out of
                link = f" (a link there leads to {short(real, 120)})"
        raise InvalidInputError(
            f"{short(str(self.path))} records {what} at {short(repr(recorded), 120)}, outside the run folder{link}",
            "edgedeploy reads only files inside a run folder; put the file itself there, or re-run the command "
            "that wrote it")

    def to_dict(self, stages: bool = True) -> dict[str, Any]:
        out = {
            "schema": SCHEMA,
            "schema_version": SCHEMA_VERSION,
            "edgedeploy_version": __version__,
            "created": self.created,
            "updated": now_iso(),
            "host": {"python": platform.python_version(), "platform": host_platform()},
            "tools": self.tools,
            "targets": self.targets,
            "info": self.info,
        }
        if stages:
            out["stages"] = [r.to_dict() for r in self.records.values()]
        return out

    def save(self) -> None:
        """Write ``manifest.json``; each record's JSON text is made once, so saving after every stage stays cheap."""
        head = self.to_dict(stages=False)
        texts = []
        for rec in self.records.values():
            cached = self._texts.get(rec.id)
            if cached is None or cached[0] is not rec:  # records are replaced, never changed in place
                body = json.dumps(rec.to_dict(), indent=2, default=str)
                cached = (rec, "\n".join("    " + line for line in body.splitlines()))
                self._texts[rec.id] = cached
            texts.append(cached[1])
        stages = "[\n" + ",\n".join(texts) + "\n  ]" if texts else "[]"
        text = json.dumps(head, indent=2, default=str)[:-2]  # the header without its closing "\n}"
        text += f',\n  "stages": {stages}\n}}\n'
        atomic_write_text(self.path, text)


def file_mismatch(path: Path, sha256: str | None, size: int | None = None, *, links: bool = True,
                  writer: str = "it was written") -> str | None:
    """Why ``path`` is not the file a manifest records (``sha256``, and ``size`` when known), or None when it is
    (``writer``: who wrote it, for the words "was changed after ...").

    The size is compared first, so a file that grew is never hashed, and a FIFO, device or folder in its place is
    never opened. ``links``: a link to a regular file is followed (run folders); False refuses a link (bundles)."""
    if isinstance(size, bool) or not isinstance(size, int):  # a hand-edited size that is not a count: not used
        size = None
    try:
        if not links and os.path.islink(path):
            return "is a link, not the file that was written"
        st = os.stat(path)
    except FileNotFoundError:
        return "is missing"
    except OSError as exc:
        return f"cannot be read ({exc.strerror})"
    if not stat.S_ISREG(st.st_mode):
        return "is not a regular file"
    if size is not None and st.st_size != size:
        return f"was changed after {writer} ({st.st_size:,} bytes, recorded {size:,})"
    try:
        got = sha256_file(path)
    except OSError as exc:
        return f"cannot be read ({exc.strerror})"
    if got != sha256:
        return f"was changed after {writer} (sha256 {got[:16]})"
    return None


def check_recorded_file(path: Path, sha256: str | None, what: str, recorded_in: str, fix: str, size: int | None = None, *,
                        links: bool = True, writer: str = "it was written") -> Path:
    """``path`` once it holds what ``recorded_in`` records for it (:func:`file_mismatch`); else one
    :class:`InvalidInputError` naming the file, the recorded sha256 and ``fix``. Every command that reads back an
    artifact a manifest records (compile, report, export, verify, emulate) checks it here first."""
    from edgedeploy.core.files import short

    why = file_mismatch(path, sha256, size, links=links, writer=writer)
    if why is not None:
        shown = short(str(path))
        recorded = sha256[:16] if isinstance(sha256, str) and sha256 else "none"
        raise InvalidInputError(f"{what} {shown} {why}; {recorded_in} records sha256 {recorded}", fix)
    return path


def remake_hint(manifest: Manifest, record: StageRecord) -> str:
    """The command that writes the outputs of ``record`` again (re-running a stage whose output changed)."""
    run = manifest.run_dir
    source = _import_source(manifest, record)
    if record.stage == "compile":
        if source:
            return f"run `edgedeploy compile {source} -t {record.target} -o {run}` again, which compiles it anew"
        return f"run `edgedeploy compile {run} -t {record.target}` again, which compiles it anew"
    if record.stage == "import":
        targets = sorted({r.target for r in manifest.find(stage="compile", variant=record.variant) if r.target})
        flags = "".join(f" -t {t}" for t in targets) or " -t TARGET"
        return f"run `edgedeploy compile {source or 'MODEL.tflite'}{flags} -o {run}` again, which copies it anew"
    return (f"run the `edgedeploy optimize` command that wrote {run} again (same model, data and options): it makes "
            f"{record.id} anew")


def _import_source(manifest: Manifest, record: StageRecord) -> str | None:
    """The .tflite the user gave for an imported variant (``import/V``'s ``source``), if it was one."""
    rec = record if record.stage == "import" else manifest.records.get(record.parent or "")
    if rec is None or rec.stage != "import":
        return None
    from edgedeploy.core.files import short

    source = rec.params.get("source")
    if not isinstance(source, str) or not source:
        return None
    return short(repr(source) if any(c < " " for c in source) else source, 120)  # read back: shown, never run


def checked_artifact(manifest: Manifest, record: StageRecord, artifact: Artifact, what: str) -> Path:
    """Where ``artifact`` (an output of ``record``) lies, once its bytes are what the manifest records: else one
    line naming the file, the recorded sha256 and the command that writes it again (:func:`remake_hint`)."""
    return check_recorded_file(manifest.resolve(artifact), artifact.sha256, what, f"{manifest.path} ({record.id})",
                               remake_hint(manifest, record), artifact.bytes, writer=f"{record.id} wrote it")


def artifacts_intact(manifest: Manifest, artifacts: Iterable[Artifact]) -> bool:
    """True when every artifact still exists with the recorded size and hash (:func:`file_mismatch`)."""
    return all(file_mismatch(manifest.resolve(a), a.sha256, a.bytes) is None for a in artifacts)
