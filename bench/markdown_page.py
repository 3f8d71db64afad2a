"""The head of a results page that a bench script prints with ``--markdown``.

The page names the exact command that wrote it, so a figure on the docs site can always be reproduced:
``python bench/bench_compile.py --markdown > docs/results/compile.md``.
"""

from __future__ import annotations

import os
import platform
import shlex
import sys
import time


def header(title: str, argv: list[str] | None = None) -> str:
    """A level-1 title, the command that produced the page, and the machine it ran on."""
    args = [a for a in (sys.argv[1:] if argv is None else argv)]
    command = shlex.join(["python", f"bench/{os.path.basename(sys.argv[0])}", *args])
    try:
        from edgedeploy import __version__ as version
    except ImportError:  # pragma: no cover - the bench scripts run inside an edgedeploy install
        version = "unknown"
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    return (f"# {title}\n\n"
            f"Written by `{command}` on {time.strftime('%Y-%m-%d', time.gmtime())} (edgedeploy {version}, "
            f"{platform.machine()}, {os.cpu_count()} CPU cores, load average {load:.2f} at start). "
            "Timings on a shared machine are noisy; re-run the command to measure yours.\n")


def table(header: list[str], rows: list[list[str]], markdown: bool) -> list[str]:
    """A table's lines: Markdown (for a results page) or right-aligned plain columns (for the terminal), then a
    blank line."""
    if markdown:
        lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
        lines += ["| " + " | ".join(r) + " |" for r in rows]
    else:
        widths = [max(len(str(x)) for x in col) for col in zip(header, *rows)]
        lines = ["  ".join(str(x).rjust(w) for x, w in zip(r, widths)) for r in [header, *rows]]
    return lines + [""]
