"""The step clock of a stage: wall and processor seconds per step, nested steps named by both and counted once."""

from __future__ import annotations

import time

import pytest

from edgedeploy.core.steptime import step_clock, timed


def _busy(seconds: float) -> None:
    end = time.process_time() + seconds
    while time.process_time() < end:
        pass


@timed("compile")
def _compile(seconds: float) -> None:
    time.sleep(seconds)


def _wall(record, step):
    return record["steps"][step]["wall"]["value"]


def test_nested_steps_are_named_by_both_and_each_second_is_counted_once():
    with step_clock() as clock:
        with timed("search"):
            _busy(0.02)
            _compile(0.2)
            _compile(0.2)
        _compile(0.05)
        time.sleep(0.05)  # in no step: the clock's other time
    record = clock.record()
    assert list(record["steps"]) == ["search", "search/compile", "compile"]
    assert record["steps"]["search/compile"]["calls"] == 2 and record["steps"]["compile"]["calls"] == 1
    assert _wall(record, "search/compile") >= 0.4 and _wall(record, "compile") >= 0.05
    assert _wall(record, "search") < 0.3  # its own time, without the compiles inside it
    assert record["other"]["wall"]["value"] >= 0.05
    steps = sum(_wall(record, s) for s in record["steps"]) + record["other"]["wall"]["value"]
    assert steps == pytest.approx(record["total"]["wall"]["value"], abs=0.005)
    # processor time: the busy loop, not the sleeps
    assert record["steps"]["search"]["processor"]["value"] >= 0.015
    assert record["steps"]["search/compile"]["processor"]["value"] < 0.2
    for fact in [f for s in record["steps"].values() for f in (s["wall"], s["processor"])]:
        assert fact["unit"] == "s" and fact["mode"] == "measured" and fact["value"] >= 0


def test_a_step_that_raises_is_counted_and_the_clock_closes():
    with pytest.raises(ValueError):
        with step_clock() as clock:
            with timed("sensitivity"):
                time.sleep(0.02)
                raise ValueError("stop")
    record = clock.record()
    assert _wall(record, "sensitivity") >= 0.015
    total = record["total"]["wall"]["value"]
    time.sleep(0.02)
    assert clock.record()["total"]["wall"]["value"] == total  # closed: no time added after the block
    with timed("outside"):  # no clock open: nothing recorded anywhere
        pass
    assert "outside" not in clock.record()["steps"]


def test_clocks_nest_without_mixing_their_steps():
    with step_clock() as outer:
        with timed("a"):
            with step_clock() as inner:
                with timed("b"):
                    pass
        with timed("c"):
            pass
    assert list(outer.record()["steps"]) == ["a", "c"] and list(inner.record()["steps"]) == ["b"]
