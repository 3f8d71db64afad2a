"""``--edgedeploy-device npu``: the bundle's compiled model on the functional model of the Ethos-U55/U65/U85.

Each golden case runs through the command stream and weights Vela wrote (the bundle's ``NAME_vela.tflite``, the
same bytes as the C array the firmware links), executed by :mod:`edgedeploy.npu` on this machine: the HIL tests
written for a board check what ships to the NPU without a board or an FVP. It computes results, not time.

:func:`npu_bundle_transport` builds the transport and raises :class:`~edgedeploy.errors.EdgeDeployError` on a
bundle it cannot run (exported before the file was shipped, a changed file, a target of another NPU, operators Vela
left on the CPU, a command the model does not implement); :func:`npu_device` is the pytest side, where each of
those ends the test in one line naming the option.
"""

from __future__ import annotations

from pathlib import Path
from typing import NoReturn

from ..errors import EdgeDeployError, InvalidInputError, NpuModelError
from edgedeploy.core.files import short
from edgedeploy.core.manifest import check_recorded_file
from .golden_compare import GoldenBundle, Transport

SPEC = "npu"
_REEXPORT = "export the bundle again with `edgedeploy export`"


def bundle_target(bundle: GoldenBundle) -> tuple[str, str]:
    """(target name, NPU family) the bundle was compiled for, as its manifest records them."""
    target = bundle.manifest.get("target")
    target = target if isinstance(target, dict) else {}
    name = target.get("name")
    name = name if isinstance(name, str) else "an unrecorded target"
    family = target.get("npu_family")
    if not isinstance(family, str) or not family:
        config = target.get("accelerator_config")
        family = config.rsplit("-", 1)[0] if isinstance(config, str) and "-" in config else "unknown"
    return short(name, 80), short(family, 40)


def bundle_vela_model(bundle: GoldenBundle) -> Path:
    """The bundle's compiled model file, checked as input: listed in the manifest, a regular file within the model
    size limit, with the sha256 both the ``files`` table and the model's C array record."""
    from ..export.bundle import read_bundle_file

    model = bundle.manifest.get("model") or {}
    name = model.get("tflite")
    if not name:
        raise InvalidInputError(
            f"{short(str(bundle.path))} holds no compiled model file ({bundle.name}_vela.tflite): it was exported "
            "before bundles carried one", f"{_REEXPORT} (it then writes {bundle.name}_vela.tflite)")
    read_bundle_file(bundle.path, bundle.manifest, name, "compiled model")  # as the files table records it
    # and the model the C array holds (model.sha256): the same shared check, one message shape
    check_recorded_file(bundle.path / name, model.get("sha256"), "compiled model",
                        f"{short(str(bundle.path / 'manifest.json'))} (model.sha256, the C array's model)", _REEXPORT,
                        links=False, writer="the C array was made from it")
    return bundle.path / name


def npu_bundle_transport(bundle: GoldenBundle) -> Transport:
    """A transport running each input through the NPU functional model of the bundle's compiled model."""
    from ..npu.transport import npu_transport
    from ..npu.verify import MODELLED_FAMILIES

    target, family = bundle_target(bundle)
    if family not in MODELLED_FAMILIES:
        raise NpuModelError(
            f"{short(str(bundle.path))} is compiled for {target} ({family}); the NPU functional model covers the "
            "Ethos-U55, Ethos-U65 and Ethos-U85",
            "test it with --edgedeploy-device host, qemu or serial:PORT, or export a leaf compiled for an "
            "ethos-u55-*, ethos-u65-* or ethos-u85-* target")
    path = bundle_vela_model(bundle)
    transport = npu_transport(path)
    want = sum(t.nbytes for t in bundle.inputs)

    def run(data: bytes) -> bytes:
        if len(data) != want:
            raise ValueError(f"input is {len(data)} bytes; {bundle.name} takes {want}")
        return transport(data)

    return run


def _fail(exc: EdgeDeployError, spec: str = SPEC) -> NoReturn:
    import pytest

    from .plugin import failure_line

    pytest.fail(failure_line(spec, exc), pytrace=False)


def npu_device(bundle: GoldenBundle) -> Transport:
    """The transport for the ``edgedeploy_device`` fixture: a bundle the model cannot run, or a command it does not
    implement, ends the test in one line (no traceback)."""
    failure: EdgeDeployError | None = None
    try:
        transport = npu_bundle_transport(bundle)
    except EdgeDeployError as exc:
        failure = exc
    if failure is not None:  # outside the except block: pytest shows the one line, not the chained traceback
        _fail(failure)
    return failing_in_one_line(transport)


def failing_in_one_line(transport: Transport, spec: str = SPEC) -> Transport:
    """``transport``, with an :class:`~edgedeploy.errors.EdgeDeployError` it raises (a command or register setting
    the NPU model does not implement; for ``qemu``, firmware that faults or hangs) ending the running test in one
    line naming ``--edgedeploy-device SPEC``, its text stripped of control characters and cut short."""

    def device(data: bytes) -> bytes:
        try:
            return transport(data)
        except EdgeDeployError as exc:
            failed = exc
        _fail(failed, spec)

    return device
