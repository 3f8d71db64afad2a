"""Golden vectors of a firmware bundle: its tensors, its cases, and the comparison of a device's outputs with
them (counted in quantized steps; 0 is bit-exact). :mod:`edgedeploy.hil.testing` is the plugin that uses them."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator


Transport = Callable[[bytes], bytes]

_REPORT_ROWS = 20


@dataclass(frozen=True)
class TensorSpec:
    """One input or output tensor of the bundle's model."""

    name: str
    shape: tuple[int, ...]
    dtype: str
    scale: float | None
    zero_point: int

    @property
    def elements(self) -> int:
        n = 1
        for d in self.shape:
            n *= max(int(d), 1)
        return n

    @property
    def case_shape(self) -> tuple[int, ...]:
        """The shape of one case (the batch dimension dropped)."""
        return self.shape[1:] if len(self.shape) > 1 and self.shape[0] == 1 else self.shape

    @property
    def nbytes(self) -> int:
        import numpy as np

        return self.elements * np.dtype(self.dtype).itemsize

    @property
    def quantized(self) -> bool:
        return self.scale is not None and self.dtype != "float32"

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "TensorSpec":
        scale = d.get("scale") or []
        zp = d.get("zero_point") or [0]
        return cls(
            str(d["name"]), tuple(int(x) for x in d["shape"]), str(d["dtype"]),
            float(scale[0]) if len(scale) == 1 else None, int(zp[0]) if zp else 0,
        )  # fmt: skip


@dataclass(frozen=True)
class GoldenCase:
    """One golden input and the outputs the reference computed for it."""

    index: int
    inputs: tuple[Any, ...]  # numpy arrays, one case each, in the model's input types
    expected: tuple[Any, ...]  # numpy arrays, one case each, in the model's output types
    argmax: int
    label: int | None  # the class the data file gives (None: unknown)
    label_name: str | None
    row: int  # row in the data file

    def __repr__(self) -> str:
        return f"GoldenCase({self.id}, row={self.row}, argmax={self.argmax})"

    @property
    def id(self) -> str:
        suffix = f"-{self.label_name}" if self.label_name else (f"-class{self.label}" if self.label is not None else "")
        return f"case{self.index}{suffix}"

    def input_bytes(self) -> bytes:
        """The inputs as the device takes them: each tensor's bytes in C order, one after another."""
        import numpy as np

        return b"".join(np.ascontiguousarray(a).tobytes() for a in self.inputs)


@dataclass
class GoldenBundle:
    """A firmware bundle folder and its golden cases."""

    path: Path
    manifest: dict[str, Any]
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    labels: tuple[str, ...] | None
    cases: tuple[GoldenCase, ...] = field(default_factory=tuple)

    def __repr__(self) -> str:
        return f"GoldenBundle({str(self.path)!r}, name={self.name!r}, cases={len(self.cases)})"

    @property
    def name(self) -> str:
        return str(self.manifest["name"])

    @property
    def reference(self) -> str:
        ref = (self.manifest.get("golden") or {}).get("reference") or {}
        return str(ref.get("description", "unknown reference"))

    @property
    def reference_model(self) -> Path | None:
        ref = (self.manifest.get("golden") or {}).get("reference") or {}
        return self.path / ref["model"] if ref.get("model") else None

    @property
    def output_bytes(self) -> int:
        return sum(t.nbytes for t in self.outputs)

    def __iter__(self) -> Iterator[GoldenCase]:
        return iter(self.cases)

    def __len__(self) -> int:
        return len(self.cases)

    def __getitem__(self, i: int) -> GoldenCase:
        return self.cases[i]

    def decode_outputs(self, data: bytes | bytearray | memoryview) -> tuple[Any, ...]:
        """Device output bytes (all outputs one after another) as one array per output."""
        import numpy as np

        data = bytes(data)
        if len(data) != self.output_bytes:
            raise AssertionError(
                f"the device answered {len(data)} bytes; {self.name} outputs are {self.output_bytes} bytes "
                f"({', '.join(f'{t.name}: {t.nbytes}' for t in self.outputs)})"
            )
        out, pos = [], 0
        for t in self.outputs:
            out.append(np.frombuffer(data[pos : pos + t.nbytes], dtype=t.dtype).reshape(t.case_shape).copy())
            pos += t.nbytes
        return tuple(out)

    def run(self, transport: Transport, case: GoldenCase) -> tuple[Any, ...]:
        """Send ``case`` through ``transport`` and decode the answer."""
        return self.decode_outputs(transport(case.input_bytes()))


def load_bundle(path: str | os.PathLike, verify: bool = True) -> GoldenBundle:
    """Read a bundle folder written by ``edgedeploy export``; with ``verify``, check the files' hashes."""
    from ..export.bundle import check_bundle_files, read_bundle_manifest

    path = Path(path)

    manifest = read_bundle_manifest(path)  # every name and file in it checked as input
    golden = manifest.get("golden") or {}
    if verify:  # the golden vectors and the reference model as export wrote them (the shared check)
        listed = manifest.get("files") or {}
        check_bundle_files(path, manifest, [name for name in (golden.get("npz"), (golden.get("reference") or {})
                                                              .get("model")) if name in listed], "golden file")
    inputs = tuple(TensorSpec.from_dict(t) for t in manifest.get("inputs", []))
    outputs = tuple(TensorSpec.from_dict(t) for t in manifest.get("outputs", []))
    labels = tuple(manifest["labels"]) if manifest.get("labels") else None
    bundle = GoldenBundle(path, manifest, inputs, outputs, labels)
    if not golden.get("count"):
        return bundle
    from edgedeploy.core.npz import read_npz

    arrays = read_npz(path / golden["npz"], "golden vectors", "data")  # regular, bounded, arrays only
    n = int(arrays["argmax"].shape[0])
    cases = []
    for c in range(n):
        label = int(arrays["label"][c])
        cases.append(
            GoldenCase(
                index=c,
                inputs=tuple(arrays[f"input_{i}"][c] for i in range(len(inputs))),
                expected=tuple(arrays[f"output_{i}"][c] for i in range(len(outputs))),
                argmax=int(arrays["argmax"][c]),
                label=None if label < 0 else label,
                label_name=labels[label] if labels and 0 <= label < len(labels) else None,
                row=int(arrays["row"][c]),
            )
        )
    bundle.cases = tuple(cases)
    return bundle


# --------------------------------------------------------------------------- comparing


@dataclass
class Mismatch:
    output: int
    index: tuple[int, ...]
    expected: Any
    got: Any
    diff: float


@dataclass
class Comparison:
    """Device outputs against one golden case."""

    case: GoldenCase
    max_abs_diff: float
    tolerance: float
    elements: int
    mismatches: list[Mismatch]
    argmax: int | None
    bundle_name: str
    labels: tuple[str, ...] | None = None

    @property
    def ok(self) -> bool:
        return not self.mismatches

    def report(self) -> str:
        c = self.case
        where = f"{self.bundle_name} golden {c.id} (data row {c.row})"
        if self.ok:
            return f"{where}: all {self.elements} output elements within {self.tolerance:g} (max |diff| {self.max_abs_diff:g})"

        def name(i: int | None) -> str:
            if i is None:
                return "?"
            return f"{i} ({self.labels[i]})" if self.labels and 0 <= i < len(self.labels) else str(i)

        lines = [
            f"{where}: {len(self.mismatches)} of {self.elements} output elements differ by more than "
            f"{self.tolerance:g} (max |diff| {self.max_abs_diff:g}); top-1 expected {name(c.argmax)}, "
            f"got {name(self.argmax)}",
            f"  {'output':>6}  {'index':<14} {'expected':>10} {'got':>10} {'diff':>8}",
        ]
        for m in self.mismatches[:_REPORT_ROWS]:
            idx = ",".join(str(i) for i in m.index)
            lines.append(f"  {m.output:>6}  [{idx}]{'':<{max(0, 12 - len(idx))}} {m.expected!s:>10} {m.got!s:>10} {m.diff:>8g}")
        if len(self.mismatches) > _REPORT_ROWS:
            lines.append(f"  ... and {len(self.mismatches) - _REPORT_ROWS} more")
        return "\n".join(lines)


class GoldenMismatch(AssertionError):
    """Device outputs differ from a golden case beyond the tolerance."""

    def __init__(self, comparison: Comparison) -> None:
        super().__init__(comparison.report())
        self.comparison = comparison


def _as_outputs(outputs: Any, bundle: GoldenBundle) -> tuple[Any, ...]:
    """Bytes, one array, or a sequence of arrays/bytes -> one numpy array per output (case shape)."""
    import numpy as np

    if isinstance(outputs, (bytes, bytearray, memoryview)):
        return bundle.decode_outputs(outputs)
    if isinstance(outputs, np.ndarray) or not isinstance(outputs, (list, tuple)):
        outputs = [outputs]
    if len(outputs) != len(bundle.outputs):
        raise AssertionError(f"got {len(outputs)} outputs; {bundle.name} has {len(bundle.outputs)}")
    result = []
    for o, t in zip(outputs, bundle.outputs):
        if isinstance(o, (bytes, bytearray, memoryview)):
            if len(o) != t.nbytes:
                raise AssertionError(f"output '{t.name}' is {len(o)} bytes; expected {t.nbytes}")
            o = np.frombuffer(bytes(o), dtype=t.dtype)
        a = np.asarray(o)
        if a.size != t.elements:
            raise AssertionError(f"output '{t.name}' has {a.size} values; expected {t.elements} {tuple(t.case_shape)}")
        if t.quantized and t.scale is not None and a.dtype.kind == "f":
            from ..export import quantize

            a = quantize(a, t.scale, t.zero_point, t.dtype)  # dequantized by the device: back to its steps
        result.append(a.reshape(t.case_shape))
    return tuple(result)


def compare_to_golden(outputs: Any, bundle: GoldenBundle, case: GoldenCase, max_abs_diff: float = 0) -> Comparison:
    """Compare device ``outputs`` (bytes, integer arrays or dequantized floats) with ``case``."""
    import numpy as np

    got = _as_outputs(outputs, bundle)
    mismatches: list[Mismatch] = []
    worst, total = 0.0, 0
    for o, (g, e) in enumerate(zip(got, case.expected)):
        diff = np.abs(g.astype(np.float64) - np.asarray(e, dtype=np.float64).reshape(g.shape))
        total += diff.size
        if diff.size:
            worst = max(worst, float(diff.max()))
        for idx in zip(*np.nonzero(diff > max_abs_diff)):
            idx = tuple(int(i) for i in idx)
            mismatches.append(Mismatch(o, idx, np.asarray(e).reshape(g.shape)[idx].item(), g[idx].item(), float(diff[idx])))
    argmax = int(np.asarray(got[0]).reshape(-1).argmax()) if got and got[0].size else None
    return Comparison(case, worst, max_abs_diff, total, mismatches, argmax, bundle.name, bundle.labels)


def assert_matches_golden(outputs: Any, bundle: GoldenBundle, case: GoldenCase, max_abs_diff: float = 0) -> Comparison:
    """Raise :class:`GoldenMismatch` (an ``AssertionError``) with a per-element report unless ``outputs`` match."""
    __tracebackhide__ = True  # pytest: show the failing test line, not this helper
    comparison = compare_to_golden(outputs, bundle, case, max_abs_diff)
    if not comparison.ok:
        raise GoldenMismatch(comparison)
    return comparison


def check_device(transport: Transport, bundle: GoldenBundle, max_abs_diff: float = 0) -> list[Comparison]:
    """Run every golden case through ``transport``; the comparisons, failing or not."""
    return [compare_to_golden(transport(c.input_bytes()), bundle, c, max_abs_diff) for c in bundle.cases]
