"""Where stage work runs: in this process or a process pool (:mod:`.local`) or on Ray (:mod:`.ray`).

Every runner is a :class:`StageRunner`, made and closed in one place, :func:`open_runner`: once per command (by the
driver, :mod:`edgedeploy.pipeline.driver`, or once per sweep) and passed to whatever runs stages: the tree, each
level of a walk, each model of a sweep. Compiles run on the runner's Vela executor
(:class:`edgedeploy.vela.VelaExecutor`).
"""

from __future__ import annotations

from concurrent.futures import Future
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Iterator, Protocol

from edgedeploy.vela import VelaExecutor


class StageRunner(Protocol):
    """The one protocol of a stage runner."""

    def submit(self, fn: Callable[..., Any], name: str, inputs: dict[str, Path], out: Path, *args: Any,
               after: Future | None = None) -> Future:
        """Start ``fn(env, name, inputs, out, *args)``, the work of one node or leaf writing into ``out``; the
        future gives ``(StageResult, started, seconds)``. ``after``: the future of the node stage whose model this
        leaf converts (a runner may run the leaf where that model still is)."""

    def start_queued(self) -> None:
        """Start submitted work the runner holds back until its driver waits (nothing, for most runners)."""

    def collect(self, future: Future, out: Path) -> tuple[Any, str | None, float | None]:
        """The stage's result with its files in ``out``, or its error raised."""

    def vela(self, options: Any, n_tasks: int) -> VelaExecutor:
        """The Vela executor of this command's compiles, started on first use."""

    def close(self) -> None:
        """Stop the runner's workers and its Vela executor."""


@contextmanager
def open_runner(executor: str = "local", ray_address: str | None = None, jobs: int = 1) -> Iterator[StageRunner]:
    """Where the stages' work runs, for the ``with`` block: this process or ``jobs`` local workers
    (:mod:`.local`), or Ray tasks (:mod:`.ray`, at ``ray_address``); closed (its workers and Vela executor
    stopped) when the block ends, however it ends."""
    runner: StageRunner
    if executor == "ray":
        from edgedeploy.pipeline.runners.ray import RayStages

        runner = RayStages(ray_address)
    else:
        from edgedeploy.pipeline.runners.local import LocalStages

        runner = LocalStages(jobs)
    try:
        yield runner
    finally:
        runner.close()
