"""Wall time of the bundled example project per stage-jobs count (recipe key ``jobs`` / ``optimize --jobs``).

Runs ``edgedeploy compile examples/kws_tree/edgedeploy.toml`` (the whole tree: train, convert, compile for the
project's targets) into a fresh run folder once per jobs count, each as its own command, and prints the wall
time, the seconds of training and converting summed over the stages, and how much of the compiling overlapped
the training (compiles that started before the last node finished). It checks that every jobs count gave the
same int8 accuracies. ``--executor ray`` runs the stages as Ray tasks instead (a local Ray head).

Run: python bench/bench_jobs.py [--jobs 1,2] [--project examples/kws_tree/edgedeploy.toml] [--executor local]
                                [--markdown]
"""

from __future__ import annotations

import argparse
import calendar
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def _epoch(iso: str) -> float:
    return calendar.timegm(time.strptime(iso, "%Y-%m-%dT%H:%M:%SZ"))


def project_copy(project: Path, work: Path, jobs: int) -> Path:
    """The project file with absolute model and data paths, its run folder in ``work`` and ``[recipe] jobs``."""
    import tomllib

    doc = tomllib.loads(project.read_text(encoding="utf-8"))
    lines = [f"model = {json.dumps(str((project.parent / doc['model']).resolve()))}",
             f"data = {json.dumps(str((project.parent / doc['data']).resolve()))}",
             f"out = {json.dumps(str(work / f'jobs{jobs}'))}",
             f"targets = {json.dumps(doc.get('targets', []))}", "", "[recipe]", f"jobs = {jobs}"]
    lines += [f"{k} = {json.dumps(v)}" for k, v in doc.get("recipe", {}).items() if not isinstance(v, dict)]
    lines += ["", "[compile]"] + [f"{k} = {json.dumps(v)}" for k, v in doc.get("compile", {}).items()]
    path = work / f"jobs{jobs}.toml"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def measure(project: Path, work: Path, jobs: int, executor: str, env: dict) -> dict:
    copy = project_copy(project, work, jobs)
    cmd = [sys.executable, "-m", "edgedeploy", "-q", "compile", str(copy), "--executor", executor]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise SystemExit(f"jobs={jobs}: {' '.join(cmd)} exited {proc.returncode}: {proc.stderr.strip()[-400:]}")
    stages = json.loads((work / f"jobs{jobs}" / "manifest.json").read_text())["stages"]
    nodes = [s for s in stages if s["stage"] == "optimize"]
    last_node_end = max(_epoch(s["started"]) + s["seconds"] for s in nodes)
    compiles = [s for s in stages if s["stage"] == "compile"]
    return {
        "jobs": jobs,
        "wall_s": wall,
        "train_convert_s": sum(s["seconds"] for s in stages if s["stage"] in ("optimize", "convert")),
        "compiles": len(compiles),
        "compiles_during_training": sum(1 for s in compiles if _epoch(s["started"]) < last_node_end),
        "int8": {s["variant"]: s["metrics"]["int8_accuracy"]["value"] for s in stages if s["stage"] == "convert"},
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--jobs", default="1,2", help="jobs counts to run, comma-separated (default 1,2)")
    ap.add_argument("--project", type=Path, default=REPO / "examples" / "kws_tree" / "edgedeploy.toml")
    ap.add_argument("--executor", default="local", choices=("local", "ray"))
    ap.add_argument("--markdown", action="store_true", help="print a Markdown table")
    args = ap.parse_args()
    counts = [int(j) for j in args.jobs.split(",") if j.strip()]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO / "src"), os.environ.get("PYTHONPATH", "")])}
    work = Path(tempfile.mkdtemp(prefix="edgedeploy-jobs-"))
    try:
        rows = [measure(args.project.resolve(), work, j, args.executor, env) for j in counts]
    finally:
        shutil.rmtree(work, ignore_errors=True)
    same = all(r["int8"] == rows[0]["int8"] for r in rows)
    head = ["jobs", "wall time (s)", "train + convert, summed (s)", "compiles started while training"]
    table = [[str(r["jobs"]), f"{r['wall_s']:.1f}", f"{r['train_convert_s']:.1f}",
              f"{r['compiles_during_training']} of {r['compiles']}"] for r in rows]
    project = args.project.resolve()
    shown = project.relative_to(REPO) if project.is_relative_to(REPO) else project
    if args.markdown:
        sys.path.insert(0, str(Path(__file__).resolve().parent))
        from markdown_page import header

        print(header(f"Results: {shown} per jobs count ({args.executor})"))
        print("| " + " | ".join(head) + " |")
        print("|" + "---|" * len(head))
        for row in table:
            print("| " + " | ".join(row) + " |")
        print(f"\nint8 accuracies {'identical' if same else 'DIFFERENT'} across jobs counts: "
              + ", ".join(f"{k} {v:.2f}%" for k, v in rows[0]["int8"].items()))
        return
    print(f"{shown} ({args.executor}); {os.cpu_count()} CPU cores, load average {os.getloadavg()[0]:.1f} at the end")
    for row in table:
        print("  ".join(f"{h}: {v}" for h, v in zip(head, row)))
    print(f"int8 accuracies {'identical' if same else 'DIFFERENT'} across jobs counts: {rows[0]['int8']}")


if __name__ == "__main__":
    main()
