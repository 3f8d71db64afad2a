"""The one protocol every stage runner implements (in this process or a process pool, or on Ray), apart from the
runners themselves so that each imports it without importing the others."""

from __future__ import annotations

from concurrent.futures import Future
from pathlib import Path
from typing import Any, Callable, Protocol

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
