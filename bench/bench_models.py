"""The support matrix: each model of the zoo (tests/zoo.py) through every stage, as a user runs the commands.

Per architecture and file format (tf_keras ``.h5``; Keras 3 ``.keras``, written by Keras 3 in a process of its own),
the bench runs ``edgedeploy optimize`` once per leaf (--leaves; the pruned leaves again with ``--sparsity-pattern
2:4``, --pattern-leaves) with a tiny recipe (one epoch, no minimum of steps: these check structure, not accuracy),
``edgedeploy compile`` of the run for each target (--targets, with ``--allow-cpu-ops`` so that operators left on the
CPU are named rather than refused), ``edgedeploy verify`` of each leaf on every target and ``edgedeploy
export`` of each leaf for the first target. Every command runs in this process through the CLI (typer's runner: the
same code as the console script, without importing TensorFlow again for each command).

Each cell is ``ok``, the operators Vela left on the CPU, or the one-line reason the command gave, with the command's
time and a reference to the command (listed under the model's table).

Without ``--models`` the run is :data:`PLAN`: every zoo architecture as tf_keras ``.h5`` (flat; the transfer-learning
MobileNetV2 nested), a few as Keras 3 ``.keras`` (the nested one among them), each with its own leaves: the thinned
leaves (a width search that compiles dozens of candidates) where the search is cheap and on MobileNet-v2 and the
EfficientNet-like net. ``--leaves``/``--pattern-leaves`` replace a plan's leaves; a model not in the plan gets every
leaf. ``--plan page`` is :data:`PAGE_PLAN`, the support-matrix page's run; ``--only`` runs some of a plan's parts and
``--reuse`` keeps those the ``--json`` file holds, so that a long run can be done in pieces. The run's time is
estimated from :data:`COSTS` and printed before it starts.

Run: python bench/bench_models.py [--plan full|page] [--only NAME@FORMAT,...] [--reuse]
     [--models mobilenet_v2,efficientnet_like@h5] [--formats h5,keras]
     [--leaves ptq,qat,...] [--pattern-leaves pruned,pqat] [--targets ethos-u55-128,ethos-u65-256,ethos-u85-256]
     [--out DIR] [--markdown] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "bench"))
sys.path.insert(0, str(REPO / "tests"))
import zoo  # noqa: E402  (the zoo's builders and data)

VERIFY_FAMILIES = ("ethos-u55", "ethos-u65", "ethos-u85")  # verify's functional NPU model runs these
TINY_RECIPE = zoo.TINY_RECIPE
THINNED = "thinned,thinned_qat,thinned_pruned,thinned_pqat,thinned_pcqat"
NOT_THINNED = ("ptq,qat,pruned,pqat,clustered,cqat,pruned_clustered,pcqat,clustered_palette,cqat_palette,"
               "pruned_clustered_palette,pcqat_palette,ptq_16x8")
DEFAULT_LEAVES = f"{NOT_THINNED},{THINNED}"
DEFAULT_PATTERN_LEAVES = "pruned,pqat,thinned_pruned"
KERAS3_LEAVES = "ptq,qat,pcqat,ptq_16x8"  # a Keras 3 file: loading is what differs from .h5, the tree is the same

# The default run: model@format -> (leaves, leaves again with --sparsity-pattern 2:4). Every architecture as .h5
# with every leaf, but for the thinned ones where their width search is long (it compiles dozens of candidate
# models, and again under 2:4): MobileNet-v2 and the EfficientNet-like net keep theirs, without 2:4.
PLAN: dict[str, tuple[str, str]] = {
    "mobilenet_v1@h5": (NOT_THINNED, "pruned,pqat"),
    "mobilenet_v2@h5": (DEFAULT_LEAVES, "pruned,pqat"),
    "mobilenet_v2_transfer@h5": ("ptq,qat,pruned,pcqat", "pruned"),
    "mobilenet_v3_small@h5": (NOT_THINNED, "pruned,pqat"),
    "mobilenet_v3_small_minimalistic@h5": (NOT_THINNED, "pruned,pqat"),
    "efficientnet_like@h5": (DEFAULT_LEAVES, "pruned,pqat"),
    "resnet_like@h5": (DEFAULT_LEAVES, DEFAULT_PATTERN_LEAVES),
    "densenet_like@h5": (NOT_THINNED, "pruned,pqat"),
    "conv1d_kws@h5": (DEFAULT_LEAVES, DEFAULT_PATTERN_LEAVES),
    "dense_autoencoder@h5": (DEFAULT_LEAVES, DEFAULT_PATTERN_LEAVES),
    "two_outputs@h5": (DEFAULT_LEAVES, DEFAULT_PATTERN_LEAVES),
    "mobilenet_v2_transfer@keras": ("ptq,qat,pruned,pcqat,ptq_16x8", "pruned"),
    "mobilenet_v3_small@keras": (KERAS3_LEAVES, "pruned"),
    "efficientnet_like@keras": (KERAS3_LEAVES, "pruned"),
    "conv1d_kws@keras": (KERAS3_LEAVES + ",thinned", "pruned"),
    "dense_autoencoder@keras": (KERAS3_LEAVES, "pruned"),
    "two_outputs@keras": (KERAS3_LEAVES, "pruned"),
}
# The support-matrix page's run (--plan page): every architecture and both formats, each with ptq, a QAT leaf and
# most with one leaf that chains pruning, clustering and QAT (pcqat) or its parts, 2:4, and the thinned leaf on
# MobileNet-v2, the EfficientNet-like net and the nets whose width search is cheap; the Conv1D keyword spotter takes
# every other leaf (palette and 16x8 included), so that each leaf of the tree is on the page at least once. About an
# hour on 2 cores, against PLAN's four.
PAGE_PLAN: dict[str, tuple[str, str]] = {
    "mobilenet_v1@h5": ("ptq,qat,pcqat", "pruned"),
    "mobilenet_v2@h5": ("ptq,qat,pcqat,thinned", "pruned"),
    "mobilenet_v2_transfer@keras": ("ptq,qat", ""),
    "mobilenet_v3_small@h5": ("ptq,qat", "pruned"),
    "mobilenet_v3_small@keras": ("ptq,qat", ""),
    "mobilenet_v3_small_minimalistic@h5": ("ptq,qat", ""),
    "efficientnet_like@h5": ("ptq,qat,pcqat,thinned", "pruned"),
    "efficientnet_like@keras": ("ptq,qat", ""),
    "resnet_like@h5": ("ptq,qat,pcqat,thinned,thinned_qat", "pruned,thinned_pruned"),
    "densenet_like@h5": ("ptq,qat,pcqat", "pruned"),
    "conv1d_kws@h5": (f"{NOT_THINNED},thinned,thinned_pcqat", "pruned,pqat"),
    "conv1d_kws@keras": ("ptq,qat,thinned", ""),
    "dense_autoencoder@h5": ("ptq,qat,pruned,clustered,thinned", "pruned"),
    "two_outputs@h5": ("ptq,qat,pcqat,thinned", "pruned"),
    "two_outputs@keras": ("ptq,qat", ""),
}
PLANS = {"full": PLAN, "page": PAGE_PLAN}
# The run time estimate, in seconds on 2 cores shared with other work, per architecture: (an optimize command of
# one leaf, the thinned width search with its fine-tuning); each leaf's compile, verify and export add
# STAGES_SECONDS.
COSTS: dict[str, tuple[float, float]] = {
    "mobilenet_v1": (60, 700), "mobilenet_v2": (90, 800), "mobilenet_v2_transfer": (90, 1000),
    "mobilenet_v3_small": (80, 900), "mobilenet_v3_small_minimalistic": (60, 700), "efficientnet_like": (60, 620),
    "resnet_like": (20, 140), "densenet_like": (40, 400), "conv1d_kws": (10, 90), "dense_autoencoder": (5, 60),
    "two_outputs": (5, 60),
}
STAGES_SECONDS = 15


def cli(*args) -> dict:
    """``edgedeploy ARGS`` in this process: exit code, stdout, the error line (if any) and the seconds taken."""
    from typer.testing import CliRunner

    from edgedeploy.cli.app import app
    from edgedeploy.core.files import release_run_dirs

    argv = [str(a) for a in args]
    start = time.perf_counter()
    result = CliRunner().invoke(app, argv)
    seconds = time.perf_counter() - start
    release_run_dirs()  # a command holds its run folder's lock until the process ends
    errors = [line for line in (result.stderr or "").splitlines() if line.startswith("error:")]
    if result.exit_code and not errors:
        errors = [f"error: exit {result.exit_code} ({type(result.exception).__name__}: {result.exception})"
                  if result.exception else f"error: exit {result.exit_code}"]
    return {"rc": result.exit_code, "stdout": result.stdout, "error": errors[0][len("error: "):] if errors else "",
            "seconds": round(seconds, 1), "command": shlex.join(["edgedeploy", *argv])}


def _cell(res: dict, status: str | None = None, text: str | None = None) -> dict:
    status = status or ("ok" if res["rc"] == 0 else "failed")
    return {"status": status, "text": text if text is not None else (res["error"] if status == "failed" else "ok"),
            "seconds": res["seconds"], "command": res["command"]}


def write_models(out: Path, parts: list[tuple[str, str, tuple[str, str]]]) -> dict[tuple[str, str], Path | str]:
    """Each zoo model of ``parts`` saved in its format; a format that cannot be written is the reason (a string)."""
    from edgedeploy.keras import tfenv

    paths: dict[tuple[str, str], Path | str] = {}
    by_format = {fmt: list(dict.fromkeys(n for n, f, _ in parts if f == fmt)) for _, fmt, _ in parts}
    if "h5" in by_format:
        for name, path in zoo.write_zoo(tfenv.load().keras, out / "h5", by_format["h5"], ".h5").items():
            paths[(name, "h5")] = path
    if "keras" in by_format:
        names = by_format["keras"]
        env = {k: v for k, v in os.environ.items() if k != "TF_USE_LEGACY_KERAS"}
        proc = subprocess.run([sys.executable, str(REPO / "tests" / "zoo.py"), str(out / "keras"), "--keras3", *names],
                              capture_output=True, text=True, env=env)
        for name in names:
            path = out / "keras" / f"{name}.keras"
            paths[(name, "keras")] = path if path.is_file() else f"Keras 3 could not build it: {proc.stderr[-300:]}"
    return paths


def model_part(name: str, fmt: str, model: Path, leaves: tuple[str, str], args) -> dict:
    """Every stage of one model in one format, for ``leaves`` (the leaves, those again with 2:4): {leaf: {stage:
    cell}}, and the stage times."""
    data = model.parent / f"{name}.npz"
    run = args.out / "runs" / f"{name}-{fmt}"
    recipe = args.out / "tiny.toml"
    rows: dict[str, dict] = {}
    runs: dict[str, list[str]] = {}  # run folder -> leaves converted in it
    plan = [(leaf, leaf, run, ()) for leaf in leaves[0].split(",") if leaf]
    plan += [(f"{leaf} (2:4)", leaf, run.with_name(run.name + "-2of4"), ("--sparsity-pattern", "2:4"))
             for leaf in leaves[1].split(",") if leaf]
    searched: set[str] = set()  # run folders whose thinned node (its width search) is shown in a row already
    for row, leaf, folder, extra in plan:
        res = cli("optimize", model, "--data", data, "-o", folder, "--recipe", recipe, "--leaves", leaf, *extra,
                  "--json")
        rows[row] = {"optimize": _cell(res)}
        if res["rc"] == 0:
            runs.setdefault(str(folder), []).append(row)
            detail = "" if str(folder) in searched else _not_thinned(folder, leaf)
            if detail:
                searched.add(str(folder))
                rows[row]["optimize"]["text"] = "ok; " + detail
        print(f"{name} {fmt} {row}: optimize {rows[row]['optimize']['text']} ({res['seconds']} s)", file=sys.stderr,
              flush=True)
    targets = args.targets.split(",")
    for folder, leaves in runs.items():
        for target in targets:
            res = cli("compile", folder, "-t", target, "--allow-cpu-ops", "--json")
            results = {}
            if res["rc"] == 0:
                results = {r["variant"]: r for r in json.loads(res["stdout"])["results"]}
            for row in leaves:
                leaf = row.split(" ")[0]
                r = results.get(leaf)
                if r is None:
                    rows[row][target] = _cell(res, "failed", res["error"] or "not compiled")
                elif r.get("status") != "ok":
                    rows[row][target] = _cell(res, "failed", r.get("error") or r.get("status"))
                elif r.get("cpu_operators"):
                    rows[row][target] = _cell(res, "cpu", cpu_text(r["cpu_operators"]))
                else:
                    npu = r["metrics"]["npu_cycles"]["value"]
                    rows[row][target] = _cell(res, "ok", f"ok, {npu:,} NPU cycles")
        for row in leaves:
            leaf = row.split(" ")[0]
            for target in targets:
                if not target.startswith(VERIFY_FAMILIES) or rows[row][target]["status"] == "failed":
                    continue
                res = cli("verify", folder, "--leaf", leaf, "-t", target, "--data", data, "--count", "2", "--json")
                rows[row][f"verify {target}"] = _cell(res)
            if rows[row][targets[0]]["status"] != "failed":
                res = cli("export", folder, "--leaf", leaf, "-t", targets[0], "-o",
                          args.out / "export" / f"{name}-{fmt}" / row.replace(" ", "").replace(":", "of"),
                          "--data", data, "--golden", "2", "--json")
                rows[row]["export"] = _cell(res)
    return {"name": name, "format": fmt, "what": zoo.ZOO[name][1], "rows": rows}


def cpu_text(ops: list) -> str:
    """"CPU: OP xN (Vela's reason), ..." for the operators Vela left on the CPU."""
    counts: dict[str, list] = {}
    for op in ops:
        op = op if isinstance(op, dict) else {"op": str(op), "reason": ""}
        counts.setdefault(op["op"], [0, op.get("reason") or ""])[0] += 1
    return "CPU: " + ", ".join(f"{name} x{n}" + (f" ({why[:120]})" if why else "")
                               for name, (n, why) in sorted(counts.items()))


def _not_thinned(folder: Path, leaf: str) -> str:
    """The thinned node's widths, NPU cycles against the budget, the layers it left whole with the reason and
    where its time went, from the run's manifest (shown on the first thinned leaf of a run folder)."""
    from edgedeploy.config.tree import LEAVES, THINNED_NODES

    if LEAVES.get(leaf) not in THINNED_NODES:
        return ""
    doc = json.loads((folder / "manifest.json").read_text())
    rec = next((r for r in doc.get("stages") or [] if r.get("id") == "optimize/thinned"), {})
    thinning = (rec.get("details") or {}).get("thinning") or {}
    npu = thinning.get("npu") or {}
    left = thinning.get("not_thinned") or {}
    full, widths = thinning.get("full_widths") or {}, thinning.get("widths") or {}
    thinned = sum(1 for g, w in widths.items() if w < full.get(g, w))
    reasons = sorted({f"{r}" for r in left.values()})
    ratio = ", ".join(f"{v}x" for v in (npu.get("cycles_vs_ptq") or {}).values())
    split = ", ".join(f"{k.replace('_', ' ')} {v:.0f} s" for k, v in (thinning.get("seconds") or {}).items())
    return (f"{thinned} of {len(full)} groups thinned, {ratio} NPU cycles, budget "
            f"{'met' if npu.get('met') else 'not met'} on {npu.get('held_on')}; left whole: {len(left)} "
            f"({'; '.join(reasons)[:160]}); node time: {split}")


def failed_part(name: str, fmt: str, reason: str) -> dict:
    return {"name": name, "format": fmt, "what": zoo.ZOO[name][1],
            "rows": {"(all)": {"optimize": {"status": "failed", "text": reason, "seconds": 0.0, "command": ""}}}}


def render(doc: dict, markdown: bool) -> str:
    from markdown_page import table

    stages = ["optimize", *doc["targets"], *[f"verify {t}" for t in doc["targets"] if t.startswith(VERIFY_FAMILIES)],
              "export"]
    lines = ["## Overview", "",
             "Per architecture and format, the leaves whose every stage is ok, those with operators left on the "
             "CPU, and those that failed (with the first reason).", ""]
    overview = []
    for part in doc["models"]:
        ok, cpu, failed = [], [], []
        for row, cells in part["rows"].items():
            bad = [c for c in (cells.get(s) for s in stages) if c and c["status"] == "failed"]
            if bad:
                failed.append(f"{row}: {bad[0]['text']}")
            elif any(c["status"] == "cpu" for c in cells.values()):
                cpu.append(row)
            else:
                ok.append(row)
        overview.append([part["name"], part["format"], ", ".join(ok) or "none", ", ".join(cpu) or "none",
                         "<br>".join(_esc(f) for f in failed) or "none"])
    lines += table(["architecture", "format", "all stages ok", "CPU operators", "failed: reason"], overview, markdown)
    for part in doc["models"]:
        lines += [f"## {part['name']} ({part['format']})", "", part["what"], ""]
        commands: list[str] = []
        rows = []
        for row, cells in part["rows"].items():
            line = [row]
            for stage in stages:
                c = cells.get(stage)
                if c is None:
                    line.append("")
                    continue
                if c["command"] not in commands:
                    commands.append(c["command"])
                ref = commands.index(c["command"]) + 1 if c["command"] else ""
                mark = {"ok": "", "cpu": "", "failed": "**failed**: "}[c["status"]]
                line.append(f"{mark}{_esc(c['text'])} ({c['seconds']:.0f} s{f', [{ref}]' if ref else ''})")
            rows.append(line)
        lines += table(["leaf", *stages], rows, markdown)
        lines += [f"{i}. `{c}`" for i, c in enumerate(commands, 1)] + [""]
    return "\n".join(lines)


def _esc(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def wanted_parts(args) -> list[tuple[str, str, tuple[str, str]]]:
    """(architecture, format, (leaves, 2:4 leaves)) of each part of the run, in order: :data:`PLAN` without
    ``--models``; a model of ``--models`` in every ``--formats``, or as NAME@h5, NAME@keras, NAME@h5+keras."""
    plan = PLANS[args.plan]
    if args.models is None:
        specs = [spec for spec in plan if not args.only or spec in args.only.split(",")]
    else:
        formats = [f for f in args.formats.split(",") if f]
        specs = [m if "@" in m else f"{m}@{'+'.join(formats)}" for m in args.models.split(",") if m]
    parts = []
    for spec in specs:
        name, fmts = spec.split("@")
        if name not in zoo.ZOO:
            raise SystemExit(f"bench_models: no zoo model {name!r}; the zoo has {', '.join(zoo.ZOO)}")
        for fmt in fmts.split("+"):
            leaves, pattern = plan.get(f"{name}@{fmt}", (DEFAULT_LEAVES, DEFAULT_PATTERN_LEAVES))
            parts.append((name, fmt, (args.leaves if args.leaves is not None else leaves,
                                      args.pattern_leaves if args.pattern_leaves is not None else pattern)))
    return parts


def estimate(parts: list[tuple[str, str, tuple[str, str]]]) -> float:
    """Seconds the run is expected to take (:data:`COSTS`): one optimize command per leaf, plus the thinned width
    search once per run folder that has a thinned leaf (the 2:4 folder searches again)."""
    from edgedeploy.config.tree import LEAVES, THINNED_NODES

    total = 0.0
    for name, _, folders in parts:
        leaf_s, thin_s = COSTS.get(name, (60, 700))
        for leaves in folders:
            names = [leaf for leaf in leaves.split(",") if leaf]
            total += len(names) * (leaf_s + STAGES_SECONDS)
            total += thin_s if any(LEAVES.get(leaf) in THINNED_NODES for leaf in names) else 0
    return total


def reusable(args) -> dict[tuple[str, str, tuple[str, str]], dict]:
    """With ``--reuse``: the parts the ``--json`` file holds, run for the same targets, by (name, format, leaves)."""
    if not (args.reuse and args.json and args.json.is_file()):
        return {}
    doc = json.loads(args.json.read_text())
    if doc.get("targets") != args.targets.split(","):
        return {}
    return {(p["name"], p["format"], tuple(p["leaves"])): p for p in doc["models"] if "leaves" in p}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", default=None,
                    help="zoo models, each in every --formats or as NAME@h5, NAME@keras or NAME@h5+keras "
                         "(default: the plan, every architecture)")
    ap.add_argument("--formats", default="h5,keras")
    ap.add_argument("--leaves", default=None, help="the leaves of every model (default: the plan's, else all)")
    ap.add_argument("--pattern-leaves", default=None,
                    help="leaves built again with --sparsity-pattern 2:4 (default: the plan's, else "
                         f"{DEFAULT_PATTERN_LEAVES})")
    ap.add_argument("--targets", default="ethos-u55-128,ethos-u65-256,ethos-u85-256")
    ap.add_argument("--plan", choices=sorted(PLANS), default="full",
                    help="without --models: full (every leaf, about four hours) or page (the support-matrix page's run)")
    ap.add_argument("--only", default=None, help="run only these NAME@FORMAT parts of the plan (a run in pieces)")
    ap.add_argument("--reuse", action="store_true",
                    help="keep the parts the --json file holds already (same leaves and targets) and run the others")
    ap.add_argument("--out", type=Path, default=Path("bench-out") / "models")
    ap.add_argument("--markdown", action="store_true")
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args(argv)
    from markdown_page import header

    parts = wanted_parts(args)
    kept = reusable(args)
    todo = [p for p in parts if p not in kept]
    print(f"bench_models: {len(todo)} model files to run ({len(parts) - len(todo)} kept), "
          f"{sum(len([x for x in f.split(',') if x]) for _, _, fs in todo for f in fs)} optimize commands; "
          f"estimated {estimate(todo) / 60:.0f} min on 2 shared cores", file=sys.stderr, flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "tiny.toml").write_text(TINY_RECIPE)
    paths = write_models(args.out / "models", todo)
    done: dict[tuple[str, str, tuple[str, str]], dict] = dict(kept)
    doc: dict = {"targets": args.targets.split(","), "models": []}
    for name, fmt, leaves in todo:
        path = paths[(name, fmt)]
        t0 = time.perf_counter()
        part = (model_part(name, fmt, path, leaves, args) if isinstance(path, Path)
                else failed_part(name, fmt, path))
        part.update(leaves=list(leaves), seconds=round(time.perf_counter() - t0))
        done[(name, fmt, leaves)] = part
        if args.json:  # a part at a time, so that a run in pieces (--only, --reuse) keeps what is done
            args.json.write_text(json.dumps({**doc, "models": list(done.values())}, indent=1))
    # the parts in the plan's order; a run of --only parts keeps the file's others after them
    order = [done[p] for p in parts] + ([part for key, part in done.items() if key not in parts] if args.only else [])
    doc["models"] = order
    doc["seconds"] = sum(part.get("seconds", 0) for part in order)
    if args.json:
        args.json.write_text(json.dumps(doc, indent=1))
    page = render(doc, args.markdown)
    for where in sorted({str(args.out.resolve()), str(args.out)}, key=len, reverse=True):
        page = page.replace(where, "OUT")  # the page names the --out folder, wherever this run put it
    if args.markdown:
        page = (header("Support matrix: the model zoo through every stage", argv) + "\n" + PAGE_INTRO.format(
            recipe=TINY_RECIPE.strip(), run=(
                f"The run was taken in pieces (`--only NAME@FORMAT,...` into the same `--json` file, then this page "
                f"with `--reuse`, which keeps what the file holds); its parts took {doc['seconds']} s in all."
                if kept else f"The whole run took {doc['seconds']} s.")) + "\n" + page)
    print(page)
    return 0


PAGE_INTRO = """The zoo (`tests/zoo.py`: `keras.applications` networks with `weights=None` and small hand-built ones, 32x32x3
images, seeded random weights and data) through `edgedeploy optimize` (one command per leaf, the pruned leaves
again with `--sparsity-pattern 2:4`), `edgedeploy compile --allow-cpu-ops` per target, `edgedeploy verify` on
every target and `edgedeploy export` for the first. Each cell: `ok`, the operators Vela left on the CPU, or the
reason the command gave; then the command's time and its number in the list under the table (the compile command builds every leaf of
its run folder, so its time is shared). Training is tiny, so accuracies mean nothing here; the matrix checks which
stages each architecture goes through; `OUT` is the `--out` folder. {run} The recipe
(`--recipe`):

```toml
{recipe}
```
"""


if __name__ == "__main__":
    raise SystemExit(main())
