"""What the command line needs of the process it runs in, beside the API's own functions: a warm Vela worker and
Vela pool started early, a private temporary folder, atomic text output, the discarding of half-written stages on
an interrupt, error lines shortened to fit, a full disk told apart from other errors, and the rows and columns of
the tables it prints.

A script or a notebook does not need these; they live here so that the face, :mod:`edgedeploy.api`, holds only
what such a caller uses.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterable, Mapping, Sequence

if TYPE_CHECKING:
    from rich.table import Table

    from edgedeploy.core.manifest import Manifest, StageRecord
    from edgedeploy.errors import DiskFullError
    from edgedeploy.vela.pool import VelaPool
    from edgedeploy.vela.worker import WarmWorker

__all__ = ["compile_columns", "compile_rows", "discard_scratch", "fork_warm_worker", "leaves_table", "no_space_error",
           "prestart_pool", "shorten", "sweep_columns", "use_private_tmp", "write_text"]


def prestart_pool(jobs: str, n_tasks: int, warm: WarmWorker | None) -> VelaPool | None:
    """The pool of Vela worker processes a compile of ``n_tasks`` models will use, started now (None where one
    process is enough); ``warm`` is a worker already importing Vela."""
    from edgedeploy.vela.pool import prestart_pool as start

    return start(jobs, n_tasks, warm)


def fork_warm_worker() -> WarmWorker | None:
    """One worker process that starts importing Vela now, for a command that may compile (None where it cannot
    help: a single core, no ``fork``)."""
    from edgedeploy.vela.worker import fork_warm_worker as fork

    return fork()


def use_private_tmp() -> str:
    """Send this process's temporary files to a private folder removed when it ends; returns the folder."""
    from edgedeploy.core.files import use_private_tmp as private

    return private()


def write_text(path: Path, text: str) -> None:
    """``text`` into the file ``path``, written under a temporary name and renamed when complete."""
    from edgedeploy.core.files import atomic_write_text

    atomic_write_text(path, text)


def discard_scratch() -> None:
    """Empty the staging folders of the stages in progress (an interrupted command leaves nothing half-written)."""
    from edgedeploy.core.files import discard_scratch as discard

    discard()


def shorten(text: str, limit: int | None = None) -> str:
    """``text`` shortened in the middle to at most ``limit`` characters (default: what an error line shows of
    one path or value)."""
    from edgedeploy.core.files import short

    return short(text) if limit is None else short(text, limit)


def no_space_error(exc: BaseException) -> DiskFullError | None:
    """``exc`` as the one-line :class:`~edgedeploy.errors.DiskFullError` when it says a disk or quota is full (naming
    the file the system named, else standard output when that is what is full), else None."""
    from edgedeploy.core.nospace import full_stream, no_space_error as full

    return full(exc, "standard output" if full_stream(1) else None)


def leaves_table(doc: Mapping[str, Any]) -> Table:
    """The document of :func:`edgedeploy.api.leaves_json` as the rich table ``edgedeploy optimize`` prints."""
    from edgedeploy.report.render.leaf_table import leaves_table as table

    return table(dict(doc))


def compile_rows(manifest: Manifest, records: Iterable[StageRecord], cached_ids: set[str]) -> list[dict[str, str]]:
    """The rows of the table ``edgedeploy compile`` prints for ``records`` of the run ``manifest``: one a compile,
    its int8 accuracy (or task metric) from the variant's convert stage when there is one."""
    from edgedeploy.report.render.tables import compile_rows as rows

    return rows(manifest, records, cached_ids)


def compile_columns(rows: Sequence[dict[str, str]]) -> tuple[tuple[str, str], ...]:
    """The columns of the compile table of ``rows``: the int8 quality column only when a row has one."""
    from edgedeploy.report.render.tables import compile_columns as columns

    return columns(rows)


def sweep_columns(rows: Sequence[dict[str, str]]) -> tuple[tuple[str, str], ...]:
    """The columns of a sweep's compile table: the model first, the int8 accuracy only when a row has one."""
    from edgedeploy.report.render.tables import sweep_columns as columns

    return columns(rows)
