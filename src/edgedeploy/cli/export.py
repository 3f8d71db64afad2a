"""``edgedeploy export``: a compiled model as C sources, CMake glue and golden vectors."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

EXAMPLE = "Example: edgedeploy export out --leaf ptq -t ethos-u55-128 -o fw --golden 8"


def register(app: typer.Typer) -> None:
    @app.command("export", epilog=EXAMPLE)
    def export_cmd(
        run_dir: Path = typer.Argument(..., help="Run folder written by `edgedeploy compile` or `optimize`."),
        target: Optional[str] = typer.Option(
            None, "--target", "-t", help="Target the model was compiled for (may be left out when there is one)."
        ),
        out: Path = typer.Option(..., "--out", "-o", help="Folder to write the firmware bundle into."),
        leaf: Optional[str] = typer.Option(
            None, "--leaf", "-l", help="Variant to export (may be left out when the run holds one)."
        ),
        name: Optional[str] = typer.Option(
            None, "--name", help="C name prefix: NAME.c, NAME_model[] ... (default: the leaf name)."
        ),
        golden: Optional[int] = typer.Option(
            None, "--golden", help="Golden cases to write (default: 8 when evaluation data is known, else 0)."
        ),
        data: Optional[Path] = typer.Option(
            None, "--data", help="Evaluation data .npz (default: the data the run's convert stage recorded)."
        ),
        section: Optional[str] = typer.Option(
            None,
            "--section",
            help="Linker section of the model (default: the board's memory.model_section, else .rodata.nn_model).",
        ),
        force: bool = typer.Option(
            False, "--force", help="Write into a folder holding other files (they are left as they are)."
        ),
        json_out: bool = typer.Option(False, "--json", help="Print only the bundle manifest as JSON on stdout."),
    ) -> None:
        """Export a compiled model for firmware: C source/header, CMake, golden vectors."""
        from .. import api
        from .common import err_console, escape, guard, out_console

        with guard():
            result = api.export_bundle(
                run_dir,
                api.ExportOptions(
                    out=out, target=target, leaf=leaf, name=name, golden=golden, data=data, section=section, force=force
                ),
            )
            m = result.manifest
            if json_out:
                typer.echo(api.dumps({**m, "out": str(result.out.resolve())}))
                return
            mem = m["memory"]
            out_console.print(
                f"exported '{m['source']['leaf']}' for {m['source']['target']} to {result.out}\n"
                f"  model      {m['model']['c_source']}: {m['model']['symbol']}[{m['model']['bytes']}] "
                f"aligned {m['model']['alignment']} in section {m['model']['section']}\n"
                f"  arena      {mem['tensor_arena_bytes']} B = {mem['planned_bytes']} B ({mem['planned_from']}) "
                f"+ {mem['runtime_margin_bytes']} B margin",
                highlight=False,
                soft_wrap=True,
            )
            g = m["golden"]
            if g["count"]:
                cmp = g["tflite_comparison"]
                versus = (
                    f"LiteRT (XNNPACK) max |diff| {cmp['max_abs_diff']}, {cmp['fraction_differing']:.1%} of outputs differ"
                    if cmp.get("available")
                    else f"LiteRT comparison unavailable: {cmp.get('reason')}"
                )
                out_console.print(
                    f"  golden     {g['count']} cases from {Path(g['data']['path']).name} ({g['data']['split']}), "
                    f"{g['reference']['description']}; {versus}",
                    highlight=False,
                    soft_wrap=True,
                )
            else:
                out_console.print("  golden     none (pass --data DATA.npz --golden N)", highlight=False)
            out_console.print(f"  files      {', '.join(result.files)}", highlight=False, soft_wrap=True)
            for w in result.warnings:
                err_console.print(f"[yellow]warning:[/] {escape(w)}", highlight=False, soft_wrap=True)
