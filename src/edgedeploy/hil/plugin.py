"""The pytest side of ``--edgedeploy-device serial:PORT[@BAUD]``: one-line failures and inference times.

:func:`serial_device` opens the device for the ``edgedeploy_device`` fixture; any failure (no
answer, a wrong model hash, a CRC error) ends the test as one line naming the option, with no
traceback; what the device sent is shown without control characters and cut short
(:func:`~edgedeploy.hil.frame.printable`). Each inference's timing (device cycle counter or clock, and the host's round trip) is
kept in the running test's ``user_properties`` (``edgedeploy_inference``, also in JUnit XML) and
listed per test at the end of the run (:func:`pytest_terminal_summary`).
"""

from __future__ import annotations

from typing import Any, Callable

from ..errors import EdgeDeployError
from edgedeploy.core.units import fmt_count
from .frame import LINE_LIMIT, printable
from .serial_device import DEFAULT_TIMEOUT, SerialDevice, bundle_device

PROPERTY = "edgedeploy_inference"
_CURRENT: dict[str, Any] = {}


def failure_line(spec: str, exc: EdgeDeployError) -> str:
    """``--edgedeploy-device SPEC: what. hint`` on one printable line of at most ``LINE_LIMIT`` characters."""
    what = printable(exc.message, LINE_LIMIT).rstrip(". ")
    return printable(f"--edgedeploy-device {spec}: {what}" + (f". {exc.hint}" if exc.hint else ""), LINE_LIMIT)


def _fail(spec: str, exc: EdgeDeployError) -> None:
    import pytest

    pytest.fail(failure_line(spec, exc), pytrace=False)


def serial_device(bundle: Any, spec: str, timeout: float = DEFAULT_TIMEOUT) -> tuple[Callable[[bytes], bytes], SerialDevice | None]:
    """(transport, device) for the fixture; the transport records each inference's timing on the running test."""
    failure: EdgeDeployError | None
    try:
        device = bundle_device(bundle, spec, timeout)
    except EdgeDeployError as exc:
        failure = exc
    else:
        failure = None
    if failure is not None:  # outside the except block: pytest shows the one line, not the chained traceback
        _fail(spec, failure)

    def transport(data: bytes) -> bytes:
        failure: EdgeDeployError | None
        try:
            out = device(data)
        except EdgeDeployError as exc:
            failure = exc
        else:
            failure = None
        if failure is not None:
            _fail(spec, failure)
        item = _CURRENT.get("item")
        if item is not None and device.last is not None:
            t = device.last
            item.user_properties.append((PROPERTY, {
                "round_trip_ms": round(t.round_trip_s * 1000, 3), "cpu_cycles": t.cycles, "device_ms": t.device_ms,
                "npu_cycles": t.npu_cycles, "pmu": list(t.pmu), "text": t.describe(),
            }))  # fmt: skip
        return out

    return transport, device


def pytest_runtest_call(item: Any) -> None:
    _CURRENT["item"] = item


def pytest_runtest_teardown(item: Any) -> None:
    _CURRENT.pop("item", None)


def pytest_terminal_summary(terminalreporter: Any) -> None:
    """Per test, the inferences it ran on the device and what they took."""
    rows = []
    for key in ("passed", "failed"):
        for rep in terminalreporter.stats.get(key, []):
            if getattr(rep, "when", "") != "call":
                continue
            timings = [v for k, v in getattr(rep, "user_properties", []) if k == PROPERTY]
            if timings:
                rows.append((rep.nodeid, timings))
    if not rows:
        return
    terminalreporter.section("edgedeploy device inference times")
    for nodeid, timings in rows:
        name = nodeid.split("::")[-1]
        if len(timings) == 1:
            terminalreporter.write_line(f"{name}: {timings[0]['text']}")
        else:
            mean = sum(t["round_trip_ms"] for t in timings) / len(timings)
            cycles = [t["cpu_cycles"] for t in timings if t["cpu_cycles"] is not None]
            extra = f", mean {fmt_count(sum(cycles) / len(cycles), 'CPU cycles')}" if cycles else ""
            terminalreporter.write_line(f"{name}: {len(timings)} inferences, mean round trip {mean:.1f} ms{extra}")
