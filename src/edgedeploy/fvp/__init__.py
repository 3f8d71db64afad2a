"""Arm Corstone FVP runs: an optional stage after compile.

An FVP (Fixed Virtual Platform) simulates a Corstone board with an Ethos-U
NPU. Arm distributes them under a EULA, so edgedeploy never ships or
downloads one: it finds one the user installed (:mod:`.discovery`), builds the
command line from the board target (:mod:`.command`), runs it through
:func:`edgedeploy.core.proc.run_command` and reads the console output
(:mod:`.parse`) into a ``fvp/<variant>/<target>`` stage (:mod:`.inference`), fed with the
input :mod:`.stimulus` chooses and measured by :mod:`.counters`.

Importing this package is cheap; nothing here imports TensorFlow.
"""

from __future__ import annotations

__all__ = ["build_fvp_command", "find_any_fvp", "fvp_run", "parse_fvp_log"]


def __getattr__(name: str):
    if name == "find_any_fvp":
        from .discovery import find_any_fvp

        return find_any_fvp
    if name == "build_fvp_command":
        from .command import build_fvp_command

        return build_fvp_command
    if name == "parse_fvp_log":
        from .parse import parse_fvp_log

        return parse_fvp_log
    if name == "fvp_run":
        from .inference import fvp_run

        return fvp_run
    raise AttributeError(name)
