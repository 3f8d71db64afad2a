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
from typer.exceptions import TyperException

from ..errors import EdgeDeployError, InvalidInputError


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
        _error_line(exc.one_line())
        raise typer.Exit(exc.exit_code) from None
    except (typer.Exit, typer.Abort, TyperException):
        raise  # the command line's own exits and usage errors
    except OSError as exc:  # a file that cannot be read or written (permissions, a full disk, a path too long)
        from edgedeploy.api import process

        full = process.no_space_error(exc)
        if full is not None:  # one the library did not name itself: the file the system named, when it did
            _error_line(full.one_line())
            raise typer.Exit(full.exit_code) from None
        where = f"{exc.filename}: " if getattr(exc, "filename", None) else ""
        _error_line(f"{where}{exc.strerror or exc}. check the path, its permissions and the free space")
        raise typer.Exit(InvalidInputError.exit_code) from None
    except Exception as exc:  # a defect: one line for the user, the traceback with -v
        from edgedeploy.api import process

        full = process.no_space_error(exc)  # a library's own error that says a disk is full (h5py, TensorFlow)
        if full is not None:
            _error_line(full.one_line())
            raise typer.Exit(full.exit_code) from None
        log.debug("internal error", exc_info=True)
        _error_line(f"internal error ({type(exc).__name__}: {exc}). run again with -v for the traceback and "
                    "report it")
        raise typer.Exit(1) from None
    except KeyboardInterrupt:
        from edgedeploy.api import process

        process.discard_scratch()  # the staging folders of the stages in progress
        err_console.print("interrupted; finished stages are kept, the one in progress left nothing behind")
        raise typer.Exit(128 + TERMINATED[0] if TERMINATED else 130) from None


TERMINATED: list[int] = []  # the signal that stopped the command, when it was not Ctrl-C


def on_terminate(signum: int, frame: object) -> None:
    """SIGTERM or SIGHUP: stop the command as Ctrl-C does, so what it was writing is cleaned up and its exit handlers
    run (TensorFlow removes its generated files there)."""
    TERMINATED.append(signum)
    raise KeyboardInterrupt


def _error_line(text: str) -> None:
    """One line on stderr, whatever the message holds (a path with a newline, a multi-line tool message)."""
    line = bounded_line(" ".join(str(text).split("\n")).replace("\r", " "))
    err_console.print(f"[bold red]error:[/] {escape(line)}", highlight=False, soft_wrap=True)


ERROR_LINE_LIMIT = 1000  # characters of one error line; a word (a path, a value) keeps at most fsutil.SHORT_LIMIT


def bounded_line(line: str) -> str:
    """``line`` with each over-long word (a path, a value) shortened in the middle, and the whole line kept under
    :data:`ERROR_LINE_LIMIT` characters: a 10 MB path gives a short line that still shows its start and end."""
    from edgedeploy.api import process

    line = " ".join(process.shorten(word) for word in line.split(" "))  # a word within the limit is kept as it is
    return process.shorten(line, ERROR_LINE_LIMIT)


def table(title: str, columns: tuple[tuple[str, str], ...], rows: list[dict[str, str]]) -> Table:
    out = Table(title=title, title_justify="left")
    for key, header in columns:
        out.add_column(header, justify="left" if key in ("model", "variant", "target", "name", "kind") else "right")
    for row in rows:
        out.add_row(*(row[key] for key, _ in columns))
    return out


def complete_target(incomplete: str) -> list[str]:
    """Shell completion of ``--target``: the built-in target names."""
    from edgedeploy import api

    return [t.name for t in api.list_targets() if t.name.startswith(incomplete)]
