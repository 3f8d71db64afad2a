"""Transports: callables from a golden input's bytes to the device's output bytes (the host reference, QEMU,
a byte stream, a program that reads and writes files)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Sequence

from ..errors import InvalidInputError, ToolFailedError
from .golden_compare import GoldenBundle, Transport


def host_reference_transport(bundle: GoldenBundle) -> Transport:
    """A "device" that runs the bundle's int8 model in TFLM on the host (the golden vectors' reference)."""
    import numpy as np

    from ..export import HOST_ARENA_MIN, _import_tflm

    model_path = bundle.reference_model
    if model_path is None or not model_path.is_file():
        raise InvalidInputError(
            f"{bundle.path} holds no reference int8 model", "export it with golden vectors (--golden N --data DATA.npz)"
        )
    runtime = _import_tflm()
    from edgedeploy.core.files import read_input_bytes

    model = read_input_bytes(model_path, "model", "model")
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

    The firmware (the bundle's CPU path with TensorFlow Lite Micro, see :mod:`edgedeploy.hil.emulate`)
    is built once; each call runs it on one input over semihosting and returns its output bytes.
    ``tflm_dir`` defaults to ``$EDGEDEPLOY_TFLM_DIR``. Call :meth:`close` to remove the build.
    """

    def __init__(self, bundle: GoldenBundle, tflm_dir: Path | str | None = None, timeout: float = 120.0) -> None:
        from edgedeploy.hil.emulate.board import EmulatedBoard

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


def qemu_transport(bundle: GoldenBundle, tflm_dir: Path | str | None = None, timeout: float = 120.0) -> QemuTransport:
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
    from edgedeploy.core.proc import check, run_command

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
