"""Command-line interface: a thin typer layer over :mod:`edgedeploy.api`, one module per command.

:mod:`.app` holds the typer application and the command list; :mod:`.common` the consoles and the
error guard that turns library errors into one-line messages and exit codes. Commands import what
they run only when they run, so ``edgedeploy --help`` imports neither TensorFlow nor Vela.
"""

from __future__ import annotations


def main() -> None:
    """The ``edgedeploy`` console script."""
    import os
    import sys

    from edgedeploy.api import process

    # For a command that compiles, one Vela worker starts importing Vela now, while typer loads and converts the
    # options; the command adopts it or ends it (see .prestart). Not for shell completion, which only lists words.
    warm = process.fork_warm_worker() if may_compile(sys.argv[1:]) and not os.environ.get("_EDGEDEPLOY_COMPLETE") else None

    import signal

    import typer
    from typer.exceptions import TyperException

    from .app import app
    from .common import on_terminate

    process.use_private_tmp()
    for signum in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, on_terminate)
    os.register_at_fork(after_in_child=_default_signals)

    try:
        code = app(standalone_mode=False, obj=warm)
    except TyperException as exc:  # a bad option or value: one line, not the framed usage block
        ctx = getattr(exc, "ctx", None)
        if type(exc).__name__ == "NoArgsIsHelpError" and ctx is not None:  # a group given no command: its help
            print(ctx.get_help())
            _usage_line(f"`{ctx.command_path}` needs a command", ctx)
        else:
            _usage_line(exc.format_message(), ctx)
        code = exc.exit_code
    except typer.Abort:
        _usage_line("aborted", None)
        code = 1
    finally:
        if warm is not None:
            warm.close(now=True)  # when no command took it (ended already if one did)
    sys.exit(code if isinstance(code, int) else 0)


# The commands with a ``prestart`` hook (the only ones that adopt the worker forked at start); a test keeps this
# equal to :data:`.prestart.PRESTART`, which is filled only as the commands load.
PRESTART_COMMANDS = ("compile",)


def may_compile(args: list[str]) -> bool:
    """Whether the command line names a command that may adopt a Vela worker (the root options are all flags, so
    the first word that is not an option is the command), and asks for more than its help or the version."""
    if any(a in ("-h", "--help", "--version") for a in args):
        return False
    command = next((a for a in args if not a.startswith("-")), None)
    return command in PRESTART_COMMANDS


def _default_signals() -> None:
    """A forked worker (Vela's) ends on SIGTERM as a process does, not through the command's handler."""
    import signal

    for signum in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, signal.SIG_DFL)


def run() -> None:
    """The ``edgedeploy`` console script (and ``python -m edgedeploy``): :func:`main`, then the process ends
    without tearing the interpreter down (see :func:`_exit`). :func:`main` itself exits as Python does, for
    callers in a process that goes on."""
    import sys

    try:
        code: int | str | None = _closed_streams()
        if code is None:
            main()
            code = 0
    except SystemExit as exc:
        code = exc.code
    if not isinstance(code, int):
        if code is not None:
            print(code, file=sys.stderr)
        code = 0 if code is None else 1
    _exit(code)


def _closed_streams() -> int | None:
    """A standard stream the caller closed (``edgedeploy ... >&-``): its descriptor is pointed at the null device,
    so no file the command opens can take its number and receive what is printed. A closed stdin or stderr is
    then no matter; a closed stdout is one line on stderr and exit 2 (what the command prints would be lost)."""
    import os
    import sys

    closed = []
    for fd, name in ((0, "stdin"), (1, "stdout"), (2, "stderr")):
        try:
            os.fstat(fd)
            if getattr(sys, name) is not None:
                continue
        except OSError:
            pass
        null = os.open(os.devnull, os.O_RDONLY if fd == 0 else os.O_WRONLY)
        if null != fd:
            os.dup2(null, fd)
            os.close(null)
        setattr(sys, name, open(fd, "r" if fd == 0 else "w", encoding="utf-8", closefd=False))
        closed.append(name)
    if "stdout" not in closed:
        return None
    from .common import _error_line

    _error_line("standard output is closed. run the command with stdout open; redirect it to /dev/null "
                "(>/dev/null) to discard what it prints")
    return 2


def _exit(code: int) -> None:
    """End the process once the command is done, without tearing the interpreter down.

    Freeing every module a command loaded takes longer than many commands' own work (docs/commands/compile.md).
    Everything the command wrote is complete by now (outputs are renamed into place); the exit
    handlers registered with ``atexit`` still run and the console streams are flushed. With a thread of the
    command still running, the normal exit waits for it instead."""
    import atexit
    import os
    import sys
    import threading

    if any(t.is_alive() and not t.daemon for t in threading.enumerate() if t is not threading.main_thread()):
        sys.exit(code)
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a closed pipe: nothing more can reach it
            pass
    os._exit(code)


def _usage_line(message: str, ctx: object) -> None:
    from .common import _error_line

    path = getattr(ctx, "command_path", "") or "edgedeploy"
    text = " ".join(str(message).split()).rstrip(".")
    _error_line(f"{text}. see `{path} -h` for the options")
