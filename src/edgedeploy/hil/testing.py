"""Hardware-in-the-loop testing against a firmware bundle's golden vectors.

A bundle written by ``edgedeploy export --golden N`` holds N real inputs and the
outputs the TensorFlow Lite Micro reference kernels compute for them. A HIL
test sends each input to the device, reads its answer and compares::

    from edgedeploy.hil.testing import assert_matches_golden

    def test_device(device, golden_bundle, golden_case, golden_tolerance):
        output = device(golden_case.input_bytes())
        assert_matches_golden(output, golden_bundle, golden_case, max_abs_diff=golden_tolerance)

``device`` is any callable ``(input_bytes) -> output_bytes``: the user's
transport. :func:`stream_transport` wraps a serial port (anything with
``write``/``read``, e.g. a ``serial.Serial``), :func:`command_transport` a
program that reads and writes files (semihosting on an FVP or a debugger),
:func:`host_reference_transport` runs the bundle's int8 model in TFLM on the
host, which is what the golden outputs came from, :func:`qemu_transport` runs
the bundle's firmware on QEMU's emulated Cortex-M55 (see :mod:`edgedeploy.hil.emulate`), and
:func:`npu_bundle_transport` runs the bundle's compiled model on the functional model of the Ethos-U55/U65.

This module is also a pytest plugin (entry point ``edgedeploy``): it adds
``--edgedeploy-bundle FWDIR``, ``--edgedeploy-max-abs-diff`` and
``--edgedeploy-device host|qemu|npu|serial:PORT[@BAUD]`` (``npu``: the bundle's compiled model on the functional
model of the Ethos-U55/U65, see :mod:`edgedeploy.hil.npu_device`; ``serial:``: firmware with the bundle's device
runner, see :mod:`edgedeploy.hil.serial_device`), the fixtures ``golden_bundle``, ``golden_tolerance``
and ``edgedeploy_device``, and parametrizes any test that asks for ``golden_case``
over the bundle's cases.

Tolerance: differences are counted in steps of the output's quantized type
(or in float units for float outputs). The default is 0, bit-exact. The NPU's
kernels can round differently from the CPU reference on some operators; pass a
tolerance there rather than weakening the comparison everywhere.
"""

from __future__ import annotations

import os
from functools import lru_cache
from pathlib import Path
from typing import Any, Iterator

from edgedeploy.errors import ToolMissingError
from edgedeploy.hil.frame import LINE_LIMIT, printable
from edgedeploy.hil.golden_compare import (
    Comparison,
    GoldenBundle,
    GoldenCase,
    GoldenMismatch,
    Mismatch,
    TensorSpec,
    Transport,
    assert_matches_golden,
    check_device,
    compare_to_golden,
    load_bundle,
)
from edgedeploy.hil.npu_device import npu_bundle_transport
from edgedeploy.hil.transports import (
    QemuTransport,
    command_transport,
    host_reference_transport,
    qemu_transport,
    stream_transport,
)

BUNDLE_ENV = "EDGEDEPLOY_BUNDLE"


# --------------------------------------------------------------------------- pytest plugin


@lru_cache(maxsize=8)
def _cached_bundle(path: str) -> GoldenBundle:
    return load_bundle(path)


def _bundle_option(config: Any) -> str | None:
    value = config.getoption("edgedeploy_bundle", default=None) or os.environ.get(BUNDLE_ENV)
    return str(Path(value).resolve()) if value else None


DEVICES = ("host", "qemu", "npu", "serial:PORT[@BAUD]")


def _device_option(value: str) -> str:
    """``--edgedeploy-device``: host, qemu, npu or serial:PORT[@BAUD] (checked by argparse: a bad value is a usage
    error)."""
    import argparse

    if value in ("host", "qemu", "npu") or (value.startswith("serial:") and len(value) > len("serial:")):
        return value
    raise argparse.ArgumentTypeError(f"invalid choice: {value!r} (choose from {', '.join(DEVICES)})")


def _timeout_option(value: str) -> float:
    """``--edgedeploy-timeout``: seconds in (0, 3600] (argparse makes a bad value a usage error)."""
    import argparse
    import math

    try:
        seconds = float(value)
    except ValueError:
        seconds = math.nan
    if not 0 < seconds <= 3600:
        raise argparse.ArgumentTypeError(f"{value[:40]!r} is not a number of seconds in (0, 3600]")
    return seconds


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
        type=_device_option,
        default=None,
        help="the device the edgedeploy_device fixture gives: host (the TFLM reference on this machine, the default), "
        "qemu (the bundle's firmware on an emulated Cortex-M55; needs a TFLM tree, see --edgedeploy-tflm-dir), "
        "npu (the bundle's Vela command stream on the functional model of the Ethos-U55/U65: results, not timing) "
        "or serial:PORT[@BAUD] (firmware with the bundle's device runner on a serial port or any pyserial URL, "
        "e.g. serial:/dev/ttyACM0@115200 or serial:socket://127.0.0.1:4000 for `edgedeploy emulate FW --serve tcp:4000`)",
    )
    group.addoption(
        "--edgedeploy-timeout",
        dest="edgedeploy_timeout",
        type=_timeout_option,
        default=10.0,
        metavar="SECONDS",
        help="how long a serial: device may take to answer one request, in (0, 3600] seconds (default 10)",
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
    _with_pytest = False
else:
    _with_pytest = True

if _with_pytest:
    from edgedeploy.hil.plugin import pytest_runtest_call, pytest_runtest_teardown, pytest_terminal_summary  # noqa: F401 (hooks)

    @_pytest.fixture(scope="session")
    def golden_bundle(request: Any) -> GoldenBundle:
        """The bundle named by ``--edgedeploy-bundle`` (the test is skipped when none is given)."""
        path = _bundle_option(request.config)
        if path is None:
            _pytest.skip(_NO_BUNDLE)
        return _cached_bundle(path)

    @_pytest.fixture(scope="session")
    def edgedeploy_device(request: Any, golden_bundle: GoldenBundle) -> Iterator[Transport]:
        """The device ``--edgedeploy-device`` names: ``host`` (default), ``qemu`` (built once per test run), ``npu``
        (the NPU functional model of the bundle's compiled model) or ``serial:PORT[@BAUD]`` (the bundle's device
        runner, its model hash checked once per test run)."""
        kind = request.config.getoption("edgedeploy_device", default=None) or "host"
        if kind.startswith("serial:"):
            from edgedeploy.hil.plugin import serial_device

            transport, device = serial_device(golden_bundle, kind, request.config.getoption("edgedeploy_timeout", default=10.0))
            try:
                yield transport
            finally:
                if device is not None:
                    device.close()
        elif kind == "qemu":
            try:
                transport = qemu_transport(golden_bundle, request.config.getoption("edgedeploy_tflm_dir", default=None))
            except ToolMissingError as exc:  # one line that names this plugin's option, not a traceback
                hint = (exc.hint or "").replace("--tflm-dir", "--edgedeploy-tflm-dir")
                _pytest.fail(printable(f"--edgedeploy-device qemu: {exc.message}. {hint}", LINE_LIMIT), pytrace=False)
            from edgedeploy.hil.npu_device import failing_in_one_line

            try:
                yield failing_in_one_line(transport, "qemu")  # a firmware fault or hang: one line, no traceback
            finally:
                transport.close()
        elif kind == "npu":
            from edgedeploy.hil.npu_device import npu_device

            yield npu_device(golden_bundle)
        else:
            yield host_reference_transport(golden_bundle)

    @_pytest.fixture(scope="session")
    def golden_tolerance(request: Any) -> float:
        """``--edgedeploy-max-abs-diff``: allowed difference in quantized steps (0: bit-exact)."""
        return float(request.config.getoption("edgedeploy_max_abs_diff", default=0.0))
