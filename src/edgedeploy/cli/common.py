"""What every command shares: the consoles, the error guard, markup escaping and the table helper.

Library code raises :class:`~edgedeploy.errors.EdgeDeployError`; :func:`guard` alone turns
errors into one-line messages and exit codes.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
from typing import Iterator

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from ..errors import EdgeDeployError


def _console(stderr: bool = False) -> Console:
    stream = sys.stderr if stderr else sys.stdout
    width = None if stream.isatty() else int(os.environ.get("COLUMNS", "200"))
    return Console(stderr=stderr, width=width)


out_console = _console()
err_console = _console(stderr=True)
log = logging.getLogger("edgedeploy")


@contextlib.contextmanager
def guard() -> Iterator[None]:
    """Turn library errors into one line on stderr and the error's exit code."""
    try:
        yield
    except EdgeDeployError as exc:
        err_console.print(f"[bold red]error:[/] {escape(exc.one_line())}", highlight=False, soft_wrap=True)
        raise typer.Exit(exc.exit_code) from None
    except KeyboardInterrupt:
        err_console.print("interrupted; finished stages are kept, the one in progress left nothing behind")
        raise typer.Exit(130) from None


def table(title: str, columns: tuple[tuple[str, str], ...], rows: list[dict[str, str]]) -> Table:
    out = Table(title=title, title_justify="left")
    for key, header in columns:
        out.add_column(header, justify="left" if key in ("variant", "target", "name", "kind") else "right")
    for row in rows:
        out.add_row(*(row[key] for key, _ in columns))
    return out


def complete_target(incomplete: str) -> list[str]:
    """Shell completion of ``--target``: the built-in target names."""
    from ..targets import list_targets

    return [t.name for t in list_targets() if t.name.startswith(incomplete)]
