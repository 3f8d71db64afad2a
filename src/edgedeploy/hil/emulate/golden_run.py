"""``edgedeploy emulate BUNDLE``: every golden vector through the firmware on QEMU, compared bit-exactly.

Facts first (:class:`EmulationResult`: per-vector verdicts, the measured arena and stack), judged by
:meth:`EmulationResult.check`: a differing vector, or a header arena smaller than what the firmware
used, is a :class:`ToolFailedError` (exit 6). The measured CPU-path figures are written back into
the bundle's ``manifest.json`` (atomically) under ``cpu_model.measured``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

from edgedeploy import __version__
from edgedeploy.errors import InvalidInputError, ToolFailedError
from edgedeploy.core.files import atomic_write_text, read_input_text
from edgedeploy.core.npz import read_npz
from edgedeploy.hil.emulate.board import BUNDLE_MANIFEST, EmulatedBoard
from edgedeploy.hil.emulate.firmware import DEFAULT_STACK
from edgedeploy.hil.emulate.qemu import DEFAULT_TIMEOUT

NUMPY_TYPES = {"int8": "int8", "uint8": "uint8", "int16": "int16", "int32": "int32", "float32": "float32", "bool": "bool"}


@dataclass
class VectorVerdict:
    index: int
    row: int | None
    label: int | None
    ok: bool
    first_difference: dict[str, Any] | None = None  # output, element, expected, got
    elements_differing: int = 0

    def line(self) -> str:
        if self.ok:
            return f"vector {self.index}: bit-exact"
        d = self.first_difference or {}
        return (
            f"vector {self.index}: DIFFERS, {self.elements_differing} elements; first at output {d.get('output')} "
            f"element {d.get('element')}: got {d.get('got')}, expected {d.get('expected')}"
        )


@dataclass
class EmulationResult:
    """A bundle emulated on QEMU: each golden vector's verdict, the measured arena and stack (``check()`` raises)."""

    bundle: Path
    name: str
    vectors: list[VectorVerdict]
    arena_used_bytes: int
    header_arena_bytes: int
    npu_arena_bytes: int | None
    stack_used_bytes: int | None
    stack_size_bytes: int
    board: dict[str, Any]
    run_seconds: float
    manifest_updated: bool = False
    warnings: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return all(v.ok for v in self.vectors) and self.arena_used_bytes <= self.header_arena_bytes

    def to_dict(self) -> dict[str, Any]:
        return {
            "schema": "edgedeploy.emulate",
            "schema_version": 1,
            "edgedeploy_version": __version__,
            "bundle": str(self.bundle.resolve()),
            "name": self.name,
            "ok": self.ok,
            "vectors": [
                {"index": v.index, "row": v.row, "label": v.label, "bit_exact": v.ok,
                 "elements_differing": v.elements_differing, "first_difference": v.first_difference}
                for v in self.vectors
            ],  # fmt: skip
            "arena": {
                "used_bytes": self.arena_used_bytes,
                "header_bytes": self.header_arena_bytes,
                "header_define": f"{self.name.upper()}_CPU_TENSOR_ARENA_SIZE",
                "npu_path_bytes": self.npu_arena_bytes,
                "mode": "measured",
                "source": "MicroInterpreter::arena_used_bytes() on the emulated Cortex-M55",
            },
            "stack": {"used_bytes": self.stack_used_bytes, "size_bytes": self.stack_size_bytes, "mode": "measured",
                      "source": "painted stack, highest mark"},  # fmt: skip
            "board": self.board,
            "run_seconds": round(self.run_seconds, 3),
            "manifest_updated": self.manifest_updated,
            "warnings": self.warnings,
        }

    def check(self) -> None:
        """Raise :class:`ToolFailedError` (exit 6) on the first problem."""
        bad = [v for v in self.vectors if not v.ok]
        if bad:
            v, d = bad[0], bad[0].first_difference or {}
            raise ToolFailedError(
                f"golden vector {v.index} differs on the emulated Cortex-M55: output {d.get('output')} element "
                f"{d.get('element')} is {d.get('got')}, expected {d.get('expected')}"
                + (f" ({len(bad)} of {len(self.vectors)} vectors differ)" if len(bad) > 1 else ""),
                "the firmware's kernels compute differently from the TFLM reference; check the TFLM tree and its CMSIS-NN",
            )
        if self.arena_used_bytes > self.header_arena_bytes:
            raise ToolFailedError(
                f"the firmware used {self.arena_used_bytes} bytes of tensor arena, more than the header's "
                f"{self.name.upper()}_CPU_TENSOR_ARENA_SIZE ({self.header_arena_bytes}): it would fail on the device",
                "export again with a larger runtime margin (the target's memory.runtime_margin_bytes)",
            )


def compare_vectors(
    expected: Sequence[Any], got: Sequence[Any], rows: Sequence[int] | None = None, labels: Sequence[int] | None = None
) -> list[VectorVerdict]:
    """Bit-exact comparison per case; ``expected``/``got``: per output an array [cases, ...]."""
    import numpy as np

    n = int(np.asarray(expected[0]).shape[0])
    verdicts = []
    for c in range(n):
        first, differing = None, 0
        for o, (e, g) in enumerate(zip(expected, got)):
            ec, gc = np.asarray(e[c]).reshape(-1), np.asarray(g[c]).reshape(-1)
            diff = np.flatnonzero(ec != gc)
            differing += int(diff.size)
            if diff.size and first is None:
                i = int(diff[0])
                first = {"output": o, "element": i, "expected": ec[i].item(), "got": gc[i].item()}
        verdicts.append(
            VectorVerdict(c, int(rows[c]) if rows is not None else None, int(labels[c]) if labels is not None else None,
                          first is None, first, differing)  # fmt: skip
        )
    return verdicts


def decode_outputs(data: bytes, outputs: Sequence[dict[str, Any]], cases: int) -> list[Any]:
    """``output.bin`` (each case's outputs one after another) as per-output arrays [cases, ...]."""
    import numpy as np

    per_case = sum(int(t["bytes"]) for t in outputs)
    if len(data) != per_case * cases:
        raise ToolFailedError(
            f"the firmware wrote {len(data)} output bytes; {cases} cases of {per_case} bytes were expected",
            "check the firmware's output tensors against the header",
        )
    arrays: list[list[np.ndarray]] = [[] for _ in outputs]
    pos = 0
    for _ in range(cases):
        for j, t in enumerate(outputs):
            n = int(t["bytes"])
            arrays[j].append(np.frombuffer(data[pos : pos + n], dtype=NUMPY_TYPES[t["dtype"]]).reshape(t["shape"][1:] or (1,)))
            pos += n
    return [np.stack(a) for a in arrays]


def emulate_bundle(
    bundle: Path, tflm_dir: Path | str | None = None, build_dir: Path | None = None, timeout: float = DEFAULT_TIMEOUT,
    update_manifest: bool = True, stack_bytes: int = DEFAULT_STACK,
) -> EmulationResult:  # fmt: skip
    """Build the bundle's CPU path into firmware, run its golden vectors on QEMU and compare them."""
    import numpy as np

    bundle = Path(bundle)
    with EmulatedBoard(bundle, tflm_dir, build_dir, timeout, stack_bytes) as board:
        m = board.manifest
        golden = m.get("golden") or {}
        if not golden.get("count"):
            raise InvalidInputError(f"{bundle} holds no golden vectors", "export it with --golden N --data DATA.npz")
        npz = bundle / golden["npz"]  # a plain file name the manifest lists, its sha256 checked when it was read
        g = read_npz(npz, "golden vectors")
        missing = [k for k in ["input_0", *(f"output_{j}" for j in range(len(m["outputs"])))] if k not in g]
        if missing:
            raise InvalidInputError(f"{npz} has no {', '.join(missing)}", "export the bundle again")
        inputs = np.ascontiguousarray(g["input_0"])
        expected = [g[f"output_{j}"] for j in range(len(m["outputs"]))]
        rows = g.get("row")
        labels = g.get("label")
        cases = int(inputs.shape[0])
        report, data, seconds = board.run(inputs.tobytes())
        if report.cases != cases:
            raise ToolFailedError(f"the firmware ran {report.cases} of {cases} golden vectors", "check input.bin against the header")
        got = decode_outputs(data, m["outputs"], cases)
        verdicts = compare_vectors(expected, got, rows, labels)
        described = board.describe()
    if report.arena_used_bytes is None:
        raise ToolFailedError("the firmware did not report arena_used_bytes", "check the firmware output")
    result = EmulationResult(
        bundle=bundle, name=str(m["name"]), vectors=verdicts, arena_used_bytes=report.arena_used_bytes,
        header_arena_bytes=int(m["cpu_model"]["tensor_arena_bytes"]),
        npu_arena_bytes=(m.get("memory") or {}).get("tensor_arena_bytes"), stack_used_bytes=report.stack_used_bytes,
        stack_size_bytes=stack_bytes, board=described, run_seconds=seconds,
    )  # fmt: skip
    if update_manifest:
        record_measurement(bundle, result)
        result.manifest_updated = True
    return result


def record_measurement(bundle: Path, result: EmulationResult) -> None:
    """Write the measured CPU-path figures into the bundle's manifest.json (temp file + rename)."""
    path = Path(bundle) / BUNDLE_MANIFEST
    manifest = json.loads(read_input_text(path, "bundle manifest", "manifest"))  # checked when the board read it
    manifest["cpu_model"]["measured"] = {
        "arena_used_bytes": result.arena_used_bytes,
        "stack_used_bytes": result.stack_used_bytes,
        "mode": "measured",
        "on": result.board["machine"],
        "qemu": result.board["qemu"],
        "compiler": result.board["compiler"],
        "golden_bit_exact": f"{sum(v.ok for v in result.vectors)}/{len(result.vectors)}",
        "by": f"edgedeploy {__version__} emulate",
    }
    atomic_write_text(path, json.dumps(manifest, indent=2, sort_keys=False) + "\n")
