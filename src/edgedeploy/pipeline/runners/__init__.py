"""Where stage work runs: in this process or a process pool (:mod:`.local`) or on Ray (:mod:`.ray`).

Every runner is a :class:`StageRunner`, made and closed in one place, :func:`open_runner`: once per command (by the
driver, :mod:`edgedeploy.pipeline.driver`, or once per sweep) and passed to whatever runs stages: the tree, each
level of a walk, each model of a sweep. Compiles run on the runner's Vela executor
(:class:`edgedeploy.vela.VelaExecutor`).
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator

from edgedeploy.pipeline.runners.protocol import StageRunner

__all__ = ["StageRunner", "open_runner"]


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
