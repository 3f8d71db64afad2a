"""Command-line interface: a thin typer layer over :mod:`edgedeploy.api`, one module per command.

:mod:`.app` holds the typer application and the command list; :mod:`.common` the consoles and the
error guard that turns library errors into one-line messages and exit codes. Commands import what
they run only when they run, so ``edgedeploy --help`` imports neither TensorFlow nor Vela.
"""

from __future__ import annotations


def main() -> None:
    """The ``edgedeploy`` console script."""
    from .app import app

    app()
