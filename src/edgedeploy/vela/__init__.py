"""Vela: argument lists and output parsers, the runner every caller goes through (:mod:`edgedeploy.vela.runner`),
the worker process, its pools and the compute analysis.

Vela runs on an executor: the local process pool (:class:`edgedeploy.vela.pool.VelaPool`) or Ray tasks
(:class:`edgedeploy.vela.ray_pool.RayExecutor`), both :class:`VelaExecutor`.
"""

from __future__ import annotations

from concurrent.futures import Future
from pathlib import Path
from typing import Any, Callable, Protocol


class VelaExecutor(Protocol):
    """The one protocol of where Vela runs."""

    def submit(self, args: list[str], log_path: Path) -> Future:
        """Run Vela with ``args``, its console output into ``log_path``; the future gives a ``VelaJobResult``."""

    def call(self, fn: Callable[..., Any], *args: Any) -> Future:
        """Run ``fn(*args)`` where Vela runs (reading a model there keeps its imports out of this process)."""

    def restart(self) -> None:
        """Replace workers that died (a pool); nothing where the executor restarts its own."""

    def close(self, now: bool = False) -> None:
        """Stop the workers (``now``: without waiting for queued work)."""
