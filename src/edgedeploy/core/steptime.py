"""Where a stage's time goes: wall and processor seconds per named step.

A stage opens a :func:`step_clock`; code anywhere below it marks its steps with ``with timed("name"):`` (or
``@timed("name")`` on a function), and a step outside any clock costs nothing. A step that runs inside another
is named by both (``trials/fine_tune``: the fine-tuning of the trials, apart from the final ``fine_tune``).
Steps are exclusive: while a step runs inside another, the outer one's clock stops, so no second is counted
twice and the steps sum to at most the clock's total; what no step claims is the clock's ``other`` time.

Processor time is :func:`time.process_time` of this process (all of its threads, so it can exceed the wall
time); work done in other processes (Vela's workers) shows in the wall time only.
"""

from __future__ import annotations

import time
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any, Iterator

_CLOCK: ContextVar["StepClock | None"] = ContextVar("edgedeploy_step_clock", default=None)


def _now() -> tuple[float, float]:
    return time.perf_counter(), time.process_time()


class StepClock:
    """Wall and processor seconds, and calls, per step, each counted once (see the module)."""

    def __init__(self) -> None:
        self.wall: dict[str, float] = {}
        self.cpu: dict[str, float] = {}
        self.calls: dict[str, int] = {}
        self._stack: list[str] = []
        self._start = self._last = _now()
        self._end: tuple[float, float] | None = None

    def _charge(self) -> None:
        """The time since the last mark, to the step running now (none: the clock's other time)."""
        now = _now()
        if self._stack:
            name = self._stack[-1]
            self.wall[name] = self.wall.get(name, 0.0) + now[0] - self._last[0]
            self.cpu[name] = self.cpu.get(name, 0.0) + now[1] - self._last[1]
        self._last = now

    @contextmanager
    def step(self, name: str) -> Iterator[None]:
        self._charge()
        name = f"{self._stack[-1]}/{name}" if self._stack else name
        self._stack.append(name)
        self.calls[name] = self.calls.get(name, 0) + 1
        self.wall.setdefault(name, 0.0)
        self.cpu.setdefault(name, 0.0)
        try:
            yield
        finally:
            self._charge()
            self._stack.pop()

    def stop(self) -> None:
        self._charge()
        self._end = self._last

    def record(self) -> dict[str, Any]:
        """The steps in the order they first ran, then ``other`` and ``total``: each a fact in seconds
        (``{"value", "unit": "s", "mode": "measured"}``) of wall and processor time; steps add their calls."""
        end = self._end or _now()
        total = (end[0] - self._start[0], end[1] - self._start[1])

        def fact(seconds: float) -> dict[str, Any]:
            return {"value": round(max(seconds, 0.0), 3), "unit": "s", "mode": "measured"}

        steps = {n: {"wall": fact(self.wall[n]), "processor": fact(self.cpu[n]), "calls": self.calls[n]}
                 for n in self.wall}
        other = (total[0] - sum(self.wall.values()), total[1] - sum(self.cpu.values()))
        return {"steps": steps, "other": {"wall": fact(other[0]), "processor": fact(other[1])},
                "total": {"wall": fact(total[0]), "processor": fact(total[1])}}


@contextmanager
def step_clock() -> Iterator[StepClock]:
    """A clock for the steps marked with :func:`timed` inside this block (in this thread or task)."""
    clock = StepClock()
    token = _CLOCK.set(clock)
    try:
        yield clock
    finally:
        clock.stop()
        _CLOCK.reset(token)


@contextmanager
def timed(name: str) -> Iterator[None]:
    """Count the block (or, as a decorator, each call) as step ``name`` of the open clock; no clock, no cost."""
    clock = _CLOCK.get()
    if clock is None:
        yield
        return
    with clock.step(name):
        yield
