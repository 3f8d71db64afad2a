"""Command-line interface: a thin typer layer over :mod:`edgedeploy.api`.

Library code raises :class:`~edgedeploy.errors.EdgeDeployError`; this module
alone turns errors into one-line messages and exit codes.
"""

from __future__ import annotations

import os
import sys

_PREWARMED = None


def _prewarm_vela_pool(argv: list[str]) -> None:
    """Start Vela workers before anything else for `compile`, so their import overlaps ours."""
    global _PREWARMED
    if len(argv) < 2 or argv[1] != "compile" or any(a in ("-h", "--help") for a in argv):
        return
    if not any(a.endswith(".tflite") for a in argv[2:]) or "ray" in argv:
        return  # project files run TensorFlow first; workers are started later
    jobs, out = None, "edgedeploy-out"
    for i, a in enumerate(argv):
        value = argv[i + 1] if i + 1 < len(argv) else ""
        if a in ("--jobs", "-j") and value.isdigit():
            jobs = int(value)
        elif a.startswith("--jobs=") and a[7:].isdigit():
            jobs = int(a[7:])
        elif a in ("--out", "-o"):
            out = value
        elif a.startswith("--out="):
            out = a[6:]
    if os.path.exists(os.path.join(out, "manifest.json")):
        return  # a re-run: most results are likely reused, so workers start only if something needs compiling
    n_targets = sum(1 for a in argv if a in ("--target", "-t") or a.startswith("--target="))
    n_models = sum(1 for a in argv[2:] if a.endswith(".tflite"))
    from .vela_pool import VelaPool, default_jobs

    _PREWARMED = VelaPool(jobs or default_jobs(max(1, n_targets) * max(1, n_models))).start()


def main() -> None:
    _prewarm_vela_pool(sys.argv)
    from .commands import app

    try:
        app()
    finally:
        if _PREWARMED is not None:
            _PREWARMED.close(now=True)
