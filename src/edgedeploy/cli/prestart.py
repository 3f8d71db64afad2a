"""Starting what a command needs (Vela workers) before typer converts its options.

Converting option values and importing what a command runs take
about as long as Vela's own start-up, so a command that compiles starts its Vela workers first, from
the values click's parser splits from the command line with the command's own option declarations.
Nothing here parses the command line by hand.

The ``edgedeploy`` console script forks one Vela worker before it imports typer
(:class:`edgedeploy.vela.worker.WarmWorker`) and hands it to the root context as its ``obj``: the hook of
the invoked command gets it and may adopt it; otherwise it is ended here, before the command runs.
"""

from __future__ import annotations

from typing import Any, Callable

from typer.core import TyperGroup

from edgedeploy.api import WarmWorker

# Key of what a command's prestart hook started, in the root context's ``meta``.
PRESTARTED = "edgedeploy.prestarted"
# Command name -> its module's ``prestart(values, warm)``; filled in by :mod:`.app` as it registers commands.
PRESTART: dict[str, Callable[..., Any]] = {}


class PrestartGroup(TyperGroup):
    """The root command group; it runs the invoked command's ``prestart`` hook first.

    Converting option values and importing what a command runs take as long as Vela's own start-up.
    A command that needs Vela workers therefore gets, in its ``prestart(values, warm)``, the values of
    its options as click's parser splits them from the command line (strings, before conversion;
    defaults for the options not given) and the worker forked at start-up (or None), and may start its
    workers there, adopting ``warm``; what it returns is kept in the root context's
    ``meta[PRESTARTED]`` for the command and closed with the context. A warm worker that the result
    does not hold (``holds(warm)``) is ended before the command runs. A command line that does not
    parse starts nothing: the normal parse then reports the error.
    """

    def parse_args(self, ctx, args: list[str]) -> list[str]:
        warm = ctx.obj if isinstance(ctx.obj, WarmWorker) else None  # the worker the console script forked
        ctx.obj = None
        started = None if ctx.resilient_parsing else _prestart(self, ctx, list(args), warm)
        if warm is not None and not (started is not None and started.holds(warm)):
            warm.close(now=True)  # no command took it
        if started is not None:
            ctx.meta[PRESTARTED] = started
            ctx.call_on_close(lambda: started.close(now=True))
        return super().parse_args(ctx, args)


def _prestart(group: TyperGroup, ctx, args: list[str], warm: WarmWorker | None) -> Any:
    try:
        _, rest, _ = group.make_parser(ctx).parse_args(args=args)
        hook = PRESTART.get(rest[0]) if rest else None
        cmd = group.commands.get(rest[0]) if hook else None
        if hook is None or cmd is None:
            return None
        opts, _, _ = cmd.make_parser(type(ctx)(cmd, parent=ctx, info_name=rest[0])).parse_args(args=rest[1:])
    except Exception:  # the normal parse reports it
        return None
    if opts.get("help"):
        return None
    try:
        return hook({p.name: opts.get(p.name, p.default) for p in cmd.params if p.name}, warm)
    except OSError:  # a path that cannot be looked at (a name too long, no permission): the command says so
        return None
