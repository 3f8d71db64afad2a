"""core/units: one way to write each kind of number, used by every table, message and report format."""

from __future__ import annotations

import pytest

from edgedeploy.core.units import fmt_bytes, fmt_count, fmt_in_unit, fmt_number, fmt_pct, fmt_seconds


@pytest.mark.parametrize("call, expected", [
    (lambda: fmt_bytes(22192), "22,192 B"),
    (lambda: fmt_bytes(22192.4, unit=False), "22,192"),
    (lambda: fmt_bytes(None), "n/a"),
    (lambda: fmt_count(1234567), "1,234,567"),
    (lambda: fmt_count(12.6, "cycles"), "13 cycles"),
    (lambda: fmt_number(1234.56, 1), "1,234.6"),
    (lambda: fmt_number(0.12345, 3), "0.123"),
    (lambda: fmt_pct(75.733), "75.73"),
    (lambda: fmt_pct(-0.5, sign=True, unit="pts"), "-0.50 pts"),
    (lambda: fmt_pct(0.0, sign=True), "+0.00"),
    (lambda: fmt_pct(75.733, unit="%"), "75.73%"),
    (lambda: fmt_pct(12.34, 1), "12.3"),
    (lambda: fmt_seconds(12.4), "12 s"),
    (lambda: fmt_seconds(3.256, 2), "3.26 s"),
    (lambda: fmt_in_unit(22192, "B"), "22,192 B"),
    (lambda: fmt_in_unit(8788, "cycles"), "8,788 cycles"),
    (lambda: fmt_in_unit(75.7, "%"), "75.70%"),
    (lambda: fmt_in_unit(0.5, "pts"), "0.50 pts"),
    (lambda: fmt_in_unit(1.23456, "ms"), "1.235 ms"),
    (lambda: fmt_in_unit(0.0123456, ""), "0.01235"),
    (lambda: fmt_in_unit(31.5, "dB"), "31.5 dB"),
    (lambda: fmt_in_unit(None, "B"), "n/a"),
], ids=lambda v: v if isinstance(v, str) else None)
def test_each_kind_of_number_is_written_one_way(call, expected):
    assert call() == expected

