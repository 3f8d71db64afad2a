"""Hardware-in-the-loop testing against a firmware bundle's golden vectors.

A bundle written by ``edgedeploy export --golden N`` holds N real inputs and the
outputs the TensorFlow Lite Micro reference kernels compute for them. A HIL
test sends each input to the device, reads its answer and compares::

    from edgedeploy.testing import assert_matches_golden

    def test_device(device, golden_bundle, golden_case, golden_tolerance):
        output = device(golden_case.input_bytes())
        assert_matches_golden(output, golden_bundle, golden_case, max_abs_diff=golden_tolerance)

``device`` is any callable ``(input_bytes) -> output_bytes``: the user's
transport. :func:`stream_transport` wraps a serial port (anything with
``write``/``read``, e.g. a ``serial.Serial``), :func:`command_transport` a
program that reads and writes files (semihosting on an FVP or a debugger),
:func:`host_reference_transport` runs the bundle's int8 model in TFLM on the
host, which is what the golden outputs came from, and :func:`qemu_transport` runs
the bundle's firmware on QEMU's emulated Cortex-M55 (see :mod:`edgedeploy.emulate`).

This module is also a pytest plugin (entry point ``edgedeploy``): it adds
``--edgedeploy-bundle FWDIR``, ``--edgedeploy-max-abs-diff`` and
``--edgedeploy-device host|qemu``, the fixtures ``golden_bundle``, ``golden_tolerance``
and ``edgedeploy_device``, and parametrizes any test that asks for ``golden_case``
over the bundle's cases.

Tolerance: differences are counted in steps of the output's quantized type
(or in float units for float outputs). The default is 0, bit-exact. The NPU's
kernels can round differently from the CPU reference on some operators; pass a
tolerance there rather than weakening the comparison everywhere.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

from .errors import InvalidInputError, ToolFailedError

Transport = Callable[[bytes], bytes]

BUNDLE_ENV = "EDGEDEPLOY_BUNDLE"
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
    import numpy as np

    path = Path(path)
    manifest_path = path / "manifest.json"
    try:
        manifest = json.loads(manifest_path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise InvalidInputError(
            f"{path} is not a firmware bundle (no manifest.json)", "pass a folder written by `edgedeploy export`"
        ) from None
    except ValueError as exc:
        raise InvalidInputError(f"{manifest_path} is not valid JSON ({exc})", "export the bundle again") from exc
    if not isinstance(manifest, dict) or manifest.get("schema") != "edgedeploy.firmware":
        raise InvalidInputError(f"{manifest_path} is not an edgedeploy firmware bundle manifest", "export the bundle again")
    golden = manifest.get("golden") or {}
    if verify:
        from .fsutil import sha256_file

        for name, meta in (manifest.get("files") or {}).items():
            if name not in (golden.get("npz"), (golden.get("reference") or {}).get("model")):
                continue
            f = path / name
            if not f.is_file() or sha256_file(f) != meta.get("sha256"):
                raise InvalidInputError(
                    f"{f} is missing or differs from what `edgedeploy export` wrote", "export the bundle again"
                )
    inputs = tuple(TensorSpec.from_dict(t) for t in manifest.get("inputs", []))
    outputs = tuple(TensorSpec.from_dict(t) for t in manifest.get("outputs", []))
    labels = tuple(manifest["labels"]) if manifest.get("labels") else None
    bundle = GoldenBundle(path, manifest, inputs, outputs, labels)
    if not golden.get("count"):
        return bundle
    with np.load(path / golden["npz"], allow_pickle=False) as npz:
        arrays = {k: npz[k] for k in npz.files}
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
        if t.quantized and a.dtype.kind == "f":
            from .export import quantize

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


# --------------------------------------------------------------------------- transports


def host_reference_transport(bundle: GoldenBundle) -> Transport:
    """A "device" that runs the bundle's int8 model in TFLM on the host (the golden vectors' reference)."""
    import numpy as np

    from .export import HOST_ARENA_MIN, _import_tflm

    model_path = bundle.reference_model
    if model_path is None or not model_path.is_file():
        raise InvalidInputError(
            f"{bundle.path} holds no reference int8 model", "export it with golden vectors (--golden N --data DATA.npz)"
        )
    runtime = _import_tflm()
    model = model_path.read_bytes()
    interp = runtime.Interpreter.from_bytes(model, arena_size=max(10 * len(model), HOST_ARENA_MIN))

    def transport(data: bytes) -> bytes:
        want = sum(t.nbytes for t in bundle.inputs)
        if len(data) != want:
            raise ValueError(f"input is {len(data)} bytes; {bundle.name} takes {want}")
        interp.reset()
        pos = 0
        for i, t in enumerate(bundle.inputs):
            arr = np.frombuffer(data[pos : pos + t.nbytes], dtype=t.dtype).reshape(t.shape)
            interp.set_input(arr, i)
            pos += t.nbytes
        interp.invoke()
        return b"".join(np.ascontiguousarray(interp.get_output(j)).tobytes() for j in range(len(bundle.outputs)))

    return transport


class QemuTransport:
    """A "device" that is the bundle's firmware on QEMU's emulated Cortex-M55 (mps3-an547).

    The firmware (the bundle's CPU path with TensorFlow Lite Micro, see :mod:`edgedeploy.emulate`)
    is built once; each call runs it on one input over semihosting and returns its output bytes.
    ``tflm_dir`` defaults to ``$EDGEDEPLOY_TFLM_DIR``. Call :meth:`close` to remove the build.
    """

    def __init__(self, bundle: GoldenBundle, tflm_dir: str | os.PathLike | None = None, timeout: float = 120.0) -> None:
        from .emulate.board import EmulatedBoard

        self.bundle = bundle
        self.board = EmulatedBoard(bundle.path, tflm_dir=tflm_dir, timeout=timeout)

    def __call__(self, data: bytes) -> bytes:
        want = sum(t.nbytes for t in self.bundle.inputs)
        if len(data) != want:
            raise ValueError(f"input is {len(data)} bytes; {self.bundle.name} takes {want}")
        _report, out, _seconds = self.board.run(bytes(data))
        return out

    def close(self) -> None:
        self.board.close()


def qemu_transport(bundle: GoldenBundle, tflm_dir: str | os.PathLike | None = None, timeout: float = 120.0) -> QemuTransport:
    """The bundle's firmware on an emulated Cortex-M55 as a transport; see :class:`QemuTransport`."""
    return QemuTransport(bundle, tflm_dir, timeout)


def stream_transport(stream: Any, bundle: GoldenBundle, *, flush: bool = True) -> Transport:
    """A transport over a byte stream (``serial.Serial``, a socket file ...).

    The firmware reads the input bytes and answers with exactly the output
    bytes (all outputs one after another). A short read (the stream's own
    timeout) raises an ``AssertionError`` saying how much arrived.
    """
    n_out = bundle.output_bytes

    def transport(data: bytes) -> bytes:
        stream.write(data)
        if flush and hasattr(stream, "flush"):
            stream.flush()
        got = b""
        while len(got) < n_out:
            chunk = stream.read(n_out - len(got))
            if not chunk:
                raise AssertionError(f"the device answered {len(got)} of {n_out} output bytes before the stream ended or timed out")
            got += chunk
        return got

    return transport


def command_transport(
    argv: Sequence[str],
    *,
    input_file: str | os.PathLike,
    output_file: str | os.PathLike,
    timeout: float = 120.0,
    cwd: str | os.PathLike | None = None,
) -> Transport:
    """A transport through files: write ``input_file``, run ``argv``, read ``output_file``.

    For semihosting (an FVP or a debug probe that reads and writes host files).
    ``{input}`` and ``{output}`` in ``argv`` are replaced by the file paths.
    """
    from .proc import check, run_command

    in_path, out_path = Path(input_file), Path(output_file)

    def transport(data: bytes) -> bytes:
        in_path.parent.mkdir(parents=True, exist_ok=True)
        in_path.write_bytes(data)
        out_path.unlink(missing_ok=True)
        args = [str(a).replace("{input}", str(in_path)).replace("{output}", str(out_path)) for a in argv]
        check(run_command(args, timeout=timeout, cwd=cwd), f"device command {args[0]}")
        if not out_path.is_file():
            raise ToolFailedError(f"device command {args[0]} wrote no {out_path}", "check that the firmware writes its outputs there")
        return out_path.read_bytes()

    return transport


# --------------------------------------------------------------------------- pytest plugin


@lru_cache(maxsize=8)
def _cached_bundle(path: str) -> GoldenBundle:
    return load_bundle(path)


def _bundle_option(config: Any) -> str | None:
    value = config.getoption("edgedeploy_bundle", default=None) or os.environ.get(BUNDLE_ENV)
    return str(Path(value).resolve()) if value else None


DEVICES = ("host", "qemu")
_NO_BUNDLE = "no firmware bundle given: pass --edgedeploy-bundle FWDIR (a folder written by `edgedeploy export --golden N`)"


def pytest_addoption(parser: Any) -> None:
    group = parser.getgroup("edgedeploy", "edgedeploy hardware-in-the-loop tests")
    group.addoption(
        "--edgedeploy-bundle",
        dest="edgedeploy_bundle",
        metavar="FWDIR",
        default=None,
        help=f"firmware bundle written by `edgedeploy export` (default: ${BUNDLE_ENV})",
    )
    group.addoption(
        "--edgedeploy-device",
        dest="edgedeploy_device",
        choices=DEVICES,
        default=None,
        help="the device the edgedeploy_device fixture gives: host (the TFLM reference on this machine, the default) "
        "or qemu (the bundle's firmware on an emulated Cortex-M55; needs a TFLM tree, see --edgedeploy-tflm-dir)",
    )
    group.addoption(
        "--edgedeploy-tflm-dir",
        dest="edgedeploy_tflm_dir",
        metavar="DIR",
        default=None,
        help="TensorFlow Lite Micro tree for --edgedeploy-device qemu (default: $EDGEDEPLOY_TFLM_DIR)",
    )
    group.addoption(
        "--edgedeploy-max-abs-diff",
        dest="edgedeploy_max_abs_diff",
        type=float,
        default=0.0,
        metavar="N",
        help="largest allowed difference from the golden outputs, in quantized steps (default 0: bit-exact)",
    )


def pytest_generate_tests(metafunc: Any) -> None:
    if "golden_case" not in metafunc.fixturenames:
        return
    import pytest

    path = _bundle_option(metafunc.config)
    if path is None:
        metafunc.parametrize("golden_case", [pytest.param(None, marks=pytest.mark.skip(reason=_NO_BUNDLE))], ids=["no-bundle"])
        return
    bundle = _cached_bundle(path)
    if not bundle.cases:
        reason = f"{path} holds no golden vectors: export it with --golden N --data DATA.npz"
        metafunc.parametrize("golden_case", [pytest.param(None, marks=pytest.mark.skip(reason=reason))], ids=["no-cases"])
        return
    metafunc.parametrize("golden_case", list(bundle.cases), ids=[c.id for c in bundle.cases])


try:
    import pytest as _pytest
except ImportError:  # the plugin part needs pytest; the helpers above do not
    _pytest = None

if _pytest is not None:

    @_pytest.fixture(scope="session")
    def golden_bundle(request: Any) -> GoldenBundle:
        """The bundle named by ``--edgedeploy-bundle`` (the test is skipped when none is given)."""
        path = _bundle_option(request.config)
        if path is None:
            _pytest.skip(_NO_BUNDLE)
        return _cached_bundle(path)

    @_pytest.fixture(scope="session")
    def edgedeploy_device(request: Any, golden_bundle: GoldenBundle) -> Iterator[Transport]:
        """The device ``--edgedeploy-device`` names: ``host`` (default) or ``qemu`` (built once per test run)."""
        kind = request.config.getoption("edgedeploy_device", default=None) or "host"
        if kind == "qemu":
            transport = qemu_transport(golden_bundle, request.config.getoption("edgedeploy_tflm_dir", default=None))
            try:
                yield transport
            finally:
                transport.close()
        else:
            yield host_reference_transport(golden_bundle)

    @_pytest.fixture(scope="session")
    def golden_tolerance(request: Any) -> float:
        """``--edgedeploy-max-abs-diff``: allowed difference in quantized steps (0: bit-exact)."""
        return float(request.config.getoption("edgedeploy_max_abs_diff", default=0.0))
