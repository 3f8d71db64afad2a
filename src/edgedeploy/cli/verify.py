"""``edgedeploy verify``: a compiled leaf on the functional NPU model, compared with TFLite's reference kernels."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

import typer

EXAMPLE = "Example: edgedeploy verify out --leaf ptq -t ethos-u55-128 --count 100"


def register(app: typer.Typer) -> None:
    @app.command("verify", epilog=EXAMPLE)
    def verify_cmd(
        run_dir: Path = typer.Argument(..., help="Run folder written by `edgedeploy compile` or `optimize`."),
        target: Optional[str] = typer.Option(
            None, "--target", "-t", help="Target the leaf was compiled for (may be left out when there is one)."
        ),
        leaf: Optional[str] = typer.Option(None, "--leaf", "-l", help="Variant (may be left out when there is one)."),
        data: Optional[Path] = typer.Option(
            None, "--data", help="Evaluation data .npz whose evaluation rows are the inputs (default: seeded random inputs)."
        ),
        count: int = typer.Option(8, "--count", "-n", help="Number of input cases."),
        seed: int = typer.Option(0, "--seed", help="Seed of the random inputs used when no data is known."),
        json_out: bool = typer.Option(False, "--json", help="Print only versioned JSON on stdout."),
    ) -> None:
        """Run a compiled leaf's command stream on a functional model of the Ethos-U55/U65 and compare its outputs
        with TFLite's reference kernels, bit for bit. Exits 0 only when every output matches."""
        from .. import api
        from .common import guard

        with guard():
            result = api.verify_run(run_dir, api.verify_options(leaf=leaf, target=target, data=data, count=count,
                                                                seed=seed))
            print_result(result.to_dict(), json_out)


def print_result(doc: dict[str, Any], json_out: bool) -> None:
    from .. import api
    from .common import out_console

    if json_out:
        typer.echo(api.dumps(doc))
        return
    ops = ", ".join(f"{v} {k}" for k, v in sorted(doc["operations"].items()))
    line = (f"'{doc['leaf']}' on {doc['target']} ({doc['npu']}): {doc['status']} on {doc['cases']} cases "
            f"({doc['exact_cases']} bit-exact")
    if doc["documented_cases"]:
        line += f", {doc['documented_cases']} within a documented rounding difference, largest output difference " \
                f"{doc['max_abs_diff']}"
    line += f"); inputs: {doc['inputs']}; operations: {ops}"
    out_console.print(line, highlight=False, markup=False, soft_wrap=True)
    for note in doc["documented"]:
        out_console.print(f"  documented difference: {note}", highlight=False, markup=False, soft_wrap=True)


def verify_compiled(run_dir: Path, records: list, json_out: bool) -> list[dict[str, Any]]:
    """``compile --verify``: each Ethos-U (U55, U65, U85) leaf just compiled, on the NPU model (stops at the first failure);
    the results as JSON documents (printed as lines unless ``json_out``)."""
    from .. import api

    manifest = api.Manifest.load(run_dir)
    docs = []
    for r in records:
        family = str((manifest.targets.get(r.target) or {}).get("npu_family") or "")
        if r.stage != "compile" or r.status not in ("ok", "cached") or not family.startswith("ethos-u"):
            continue
        result = api.verify_run(run_dir, api.verify_options(leaf=r.variant, target=r.target))
        docs.append(result.to_dict())
        if not json_out:
            print_result(docs[-1], False)
    return docs
