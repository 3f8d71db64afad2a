"""Leaves that make the NPU faster: unstructured vs 2:4 pruning, and ptq vs ptq_16x8, measured with Vela.

Part 1 (--models, default ic,kws): the MLPerf ResNet-8 (CIFAR-10 JPEG subset, x_train -> x_test) and the MLPerf
DS-CNN (Speech Commands, fine-tune split 0 -> eval split 1) through `edgedeploy optimize` with the leaves ptq,
pruned, pqat and pcqat, once with unstructured pruning and once with `sparsity_pattern = "2:4"` (same seed,
epochs and recipe otherwise), each leaf compiled with Vela 5.2 for ethos-u55-128 and ethos-u85-256
(--optimise Performance). Per leaf: int8 accuracy on the evaluation split, its difference to the ptq leaf with
the paired standard error (same samples scored by both int8 models), Vela-encoded weights on both targets,
NPU MACs and NPU cycles on ethos-u85-256 with their ratio to ptq, NPU cycles on ethos-u55-128 (no sparse
MACs there), and whether every 2:4 group of four held two zeros in the int8 kernels.

Part 2 (--models16, default kws_s,kws): Arm's DS-CNN-S and the MLPerf DS-CNN, leaves ptq and ptq_16x8 (no
training): accuracy, SRAM, NPU cycles and CPU operators on both targets.

Run: python bench/bench_sparsity.py [--models ic,kws] [--models16 kws_s,kws] [--epochs 2] [--seed 0] [--min-steps 0]
     [--out DIR] [--data ../shared/data] [--markdown] [--json FILE]
Timings are not measured here (Vela's cycle estimates are deterministic); training runs on the CPU.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import replace
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "bench"))
from bench_palette import MODELS, paired_deltas  # noqa: E402  (the same models and paired statistics)

TARGETS = ["ethos-u55-128", "ethos-u85-256"]
SPARSE_LEAVES = ["ptq", "pruned", "pqat", "pcqat"]
PATTERNS = {"unstructured": "unstructured", "2:4": "2of4"}  # pattern -> run folder


def _m(rec, key):
    return None if rec is None else rec.metric(key)


def _compile(out: Path, leaves: dict) -> dict:
    from edgedeploy.pipeline.compile import CompileOptions, compile_variants
    from edgedeploy.core.stage import RunContext
    from edgedeploy.config.targets import get_target

    variants = [(leaf, out / rec.output("int8_model").path, rec.id) for leaf, rec in leaves.items()]
    outcome = compile_variants(RunContext.open(out), variants, [get_target(t) for t in TARGETS],
                               CompileOptions(jobs=2, allow_cpu_ops=True))
    return {(r.variant, r.target): r for r in outcome.records}


def _optimize(model: str, data: str, out: Path, recipe, leaves: list[str], args) -> tuple[dict, dict, dict]:
    from edgedeploy.errors import EdgeDeployError
    from edgedeploy.pipeline.driver import drive
    from edgedeploy.pipeline.run_plan import Plan

    done, nodes, failed = {}, {}, {}
    for leaf in leaves:  # one leaf at a time: a leaf that fails is reported while the others are measured
        try:
            outcome = drive(Plan(args.data / model, args.data / data, out, replace(recipe, leaves=(leaf,)))).tree
        except EdgeDeployError as exc:
            failed[leaf] = exc.one_line()
            print(f"{out}: leaf {leaf} failed: {exc.one_line()}", file=sys.stderr, flush=True)
            continue
        done.update(outcome.leaves)
        nodes.update(outcome.nodes)
    return done, nodes, failed


def _pattern_kept(rec) -> bool | None:
    rows = [r for r in rec.details.get("preservation", []) if r.get("pattern") == "2:4"]
    return None if not rows else all(r.get("groups_short", 1) == 0 for r in rows)


def sparsity_part(key: str, args) -> dict:
    from edgedeploy.config.recipe import load_recipe

    title, model, data = MODELS[key]
    result = {"title": title, "patterns": {}}
    for pattern, folder in PATTERNS.items():
        recipe = load_recipe(overrides={"epochs": args.epochs, "seed": args.seed, "sparsity_pattern": pattern,
                                        "min_steps": args.min_steps})
        out = args.out / key / folder
        leaves, _nodes, failed = _optimize(model, data, out, recipe, SPARSE_LEAVES, args)
        comp = _compile(out, leaves)
        paired, _ = paired_deltas(leaves, out)
        rows = {}
        for leaf, rec in leaves.items():
            row = {"int8_accuracy": rec.metric("int8_accuracy"), **paired.get(leaf, {}),
                   "pattern_kept_int8": _pattern_kept(rec)}
            for t in TARGETS:
                c = comp.get((leaf, t))
                row[t] = {k: _m(c, k) for k in ("encoded_weights_bytes", "npu_cycles", "macs", "sram_bytes",
                                               "compute_bound_cycles", "memory_bound_cycles", "cpu_operators")}
            rows[leaf] = row
        base = rows.get("ptq", {})
        for row in rows.values():
            for t in TARGETS:
                for k in ("npu_cycles", "macs", "encoded_weights_bytes"):
                    b, v = (base.get(t) or {}).get(k), row[t].get(k)
                    row[t][f"{k}_vs_ptq"] = round(v / b, 3) if b and v is not None else None
        result["patterns"][pattern] = {"run_dir": str(out), "leaves": rows, "failed": failed}
    return result


def int16_part(key: str, args) -> dict:
    from edgedeploy.config.recipe import load_recipe

    title, model, data = MODELS[key]
    recipe = load_recipe(overrides={"seed": args.seed, "leaves": ["ptq", "ptq_16x8"]})
    out = args.out / key / "16x8"
    leaves, _nodes, failed = _optimize(model, data, out, recipe, ["ptq", "ptq_16x8"], args)
    comp = _compile(out, leaves)
    paired, _ = paired_deltas(leaves, out)
    rows = {}
    for leaf, rec in leaves.items():
        rows[leaf] = {"int8_accuracy": rec.metric("int8_accuracy"), "float_accuracy": rec.metric("float_accuracy"),
                      **paired.get(leaf, {}),
                      **{t: {k: _m(comp.get((leaf, t)), k) for k in ("sram_bytes", "npu_cycles", "cpu_operators",
                                                                      "encoded_weights_bytes")} for t in TARGETS}}
    return {"title": title, "run_dir": str(out), "leaves": rows, "failed": failed}


def _f(v, spec=",.0f"):
    return "n/a" if v is None else format(v, spec)


def render(doc: dict, markdown: bool) -> str:
    lines = []

    def table(header, rows):
        from markdown_page import table as table_lines

        lines.extend(table_lines(header, rows, markdown))

    for key, part in doc.get("sparsity", {}).items():
        lines.append(f"{'### ' if markdown else ''}{part['title']}: unstructured vs 2:4, {doc['epochs']} epochs per "
                     f"stage, seed {doc['seed']}")
        lines.append("")
        header = ["pattern", "leaf", "int8 acc %", "Δ vs ptq (pt) ± SE", "U55-128 enc. weights", "U85-256 enc. weights",
                  "U85 MACs", "U85 MACs vs ptq", "U85 NPU cycles", "U85 cycles vs ptq", "U55 NPU cycles", "2:4 kept"]
        rows = []
        for pattern, p in part["patterns"].items():
            for leaf in SPARSE_LEAVES:
                r = p["leaves"].get(leaf)
                if r is None:
                    rows.append([pattern, leaf, "failed: " + p["failed"].get(leaf, "not run")] + [""] * 9)
                    continue
                u55, u85 = r["ethos-u55-128"], r["ethos-u85-256"]
                kept = {True: "yes", False: "NO", None: "-"}[r["pattern_kept_int8"]]
                rows.append([pattern, leaf, _f(r["int8_accuracy"], ".2f"),
                             f"{_f(r.get('delta_vs_ptq'), '+.2f')} ± {_f(r.get('delta_se'), '.2f')}",
                             _f(u55["encoded_weights_bytes"]), _f(u85["encoded_weights_bytes"]), _f(u85["macs"]),
                             _f(u85["macs_vs_ptq"], ".3f"), _f(u85["npu_cycles"]), _f(u85["npu_cycles_vs_ptq"], ".3f"),
                             _f(u55["npu_cycles"]), kept])
        table(header, rows)
    for key, part in doc.get("int16", {}).items():
        lines.append(f"{'### ' if markdown else ''}{part['title']}: ptq vs ptq_16x8")
        lines.append("")
        header = ["leaf", "acc %", "Δ vs ptq (pt) ± SE", "U55-128 SRAM B", "U55-128 NPU cycles", "U85-256 SRAM B",
                  "U85-256 NPU cycles", "CPU ops (U55/U85)"]
        rows = []
        for leaf in ("ptq", "ptq_16x8"):
            r = part["leaves"].get(leaf)
            if r is None:
                rows.append([leaf, "failed: " + part["failed"].get(leaf, "not run")] + [""] * 6)
                continue
            u55, u85 = r["ethos-u55-128"], r["ethos-u85-256"]
            rows.append([leaf, _f(r["int8_accuracy"], ".2f"),
                         f"{_f(r.get('delta_vs_ptq'), '+.2f')} ± {_f(r.get('delta_se'), '.2f')}",
                         _f(u55["sram_bytes"]), _f(u55["npu_cycles"]), _f(u85["sram_bytes"]), _f(u85["npu_cycles"]),
                         f"{_f(u55['cpu_operators'])}/{_f(u85['cpu_operators'])}"])
        table(header, rows)
    lines.append(f"Command: {doc['command']}")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", default="ic,kws", help="models of part 1 (empty: none)")
    ap.add_argument("--models16", default="kws_s,kws", help="models of part 2 (empty: none)")
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--min-steps", type=int, default=0,
                    help="optimizer steps a stage takes at least (default 0: --epochs as given, as measured in the docs)")
    ap.add_argument("--data", type=Path, default=REPO.parent / "shared" / "data")
    ap.add_argument("--out", type=Path, default=Path("bench-out") / "sparsity")
    ap.add_argument("--markdown", action="store_true")
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args(argv)
    doc = {"epochs": args.epochs, "seed": args.seed, "min_steps": args.min_steps,
           "command": "python bench/bench_sparsity.py " + " ".join(argv if argv is not None else sys.argv[1:]),
           "sparsity": {k: sparsity_part(k, args) for k in args.models.split(",") if k},
           "int16": {k: int16_part(k, args) for k in args.models16.split(",") if k}}
    if args.json:
        args.json.write_text(json.dumps(doc, indent=1, default=str))
    print(render(doc, args.markdown))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
