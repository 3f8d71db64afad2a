"""``edgedeploy emulate``: a bundle's golden vectors through its firmware on an emulated Cortex-M55."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

EXAMPLE = "Example: edgedeploy emulate fw --tflm-dir tflite-micro  (or --serve tcp:4000 for HIL tests over a serial link)"


def register(app: typer.Typer) -> None:
    @app.command("emulate", epilog=EXAMPLE)
    def emulate_cmd(
        bundle: Path = typer.Argument(..., help="Folder written by `edgedeploy export --golden N`."),
        tflm_dir: Optional[Path] = typer.Option(
            None, "--tflm-dir", help="TensorFlow Lite Micro tree for cortex-m55 with CMSIS-NN (default: $EDGEDEPLOY_TFLM_DIR)."
        ),
        build_dir: Optional[Path] = typer.Option(
            None, "--build-dir", help="Keep the firmware project and its build here (default: a temporary folder)."
        ),
        stack_size: int = typer.Option(32768, "--stack-size", help="Firmware stack in bytes (TFLM needs more than 1 KiB)."),
        timeout: float = typer.Option(120.0, "--timeout", min=1.0, help="Seconds QEMU may run before it counts as a hang."),
        json_out: bool = typer.Option(False, "--json", help="Print only the result as JSON on stdout."),
        serve: Optional[str] = typer.Option(
            None, "--serve", metavar="tcp:[HOST:]PORT",
            help="Instead: serve the bundle's device runner on the board's UART at this TCP address until stopped "
            "(pytest --edgedeploy-device serial:socket://127.0.0.1:PORT).",
        ),
    ) -> None:
        """Build the bundle's CPU path into firmware, run every golden vector on QEMU (mps3-an547), compare bit-exactly."""
        from .. import api
        from .common import err_console, escape, guard, out_console

        if serve is not None:
            _serve(bundle, serve, tflm_dir, build_dir, stack_size, json_out)
            return
        with guard():
            result = api.emulate_bundle(bundle, tflm_dir=tflm_dir, build_dir=build_dir, timeout=timeout,
                                        stack_bytes=stack_size)
            if json_out:
                typer.echo(api.dumps(result.to_dict()))
            else:
                b = result.board
                lib = b["tflm_library"]
                out_console.print(
                    f"emulated '{result.name}' on {b['machine']}, QEMU {b['qemu']}\n"
                    f"  firmware   {b['compiler']}, TFLM {b['tflm_dir']} ({lib['sources']} sources, "
                    + (f"compiled now in {lib['seconds']} s" if lib["compiled_now"] else f"cached {lib['cache_key']}")
                    + f"), operators {', '.join(b['operators'])}",
                    highlight=False,
                    soft_wrap=True,
                )
                for v in result.vectors:
                    mark = "[green]ok[/]" if v.ok else "[bold red]FAIL[/]"
                    out_console.print(f"  {mark}  {escape(v.line())}", highlight=False, soft_wrap=True)
                over = result.arena_used_bytes > result.header_arena_bytes
                out_console.print(
                    f"  arena      {result.arena_used_bytes} B used (measured), header "
                    f"{result.name.upper()}_CPU_TENSOR_ARENA_SIZE {result.header_arena_bytes} B"
                    + (" [bold red]TOO SMALL[/]" if over else "")
                    + (f"; NPU path arena {result.npu_arena_bytes} B" if result.npu_arena_bytes else ""),
                    highlight=False,
                    soft_wrap=True,
                )
                out_console.print(
                    f"  stack      {result.stack_used_bytes} B used of {result.stack_size_bytes} B (measured)\n"
                    f"  run        {len(result.vectors)} vectors in {result.run_seconds:.2f} s on QEMU"
                    + ("; measured figures written to manifest.json" if result.manifest_updated else ""),
                    highlight=False,
                    soft_wrap=True,
                )
                for w in result.warnings:
                    err_console.print(f"[yellow]warning:[/] {escape(w)}", highlight=False, soft_wrap=True)
            result.check()


def _serve(bundle: Path, address: str, tflm_dir: Optional[Path], build_dir: Optional[Path], stack_size: int, json_out: bool) -> None:
    from .. import api
    from ..errors import UsageError
    from .common import err_console, escape, guard, out_console

    with guard():
        if json_out:
            raise UsageError("--json does not go with --serve, which runs until stopped", "leave out --json")

        def ready(line: str) -> None:
            out_console.print(
                f"serving on {escape(address)} (QEMU mps3-an547 UART0): {escape(line)}\n"
                f"  test it: pytest examples/hil --edgedeploy-bundle {escape(str(bundle))} "
                f"--edgedeploy-device serial:socket://{escape(_client_host(address))}; stop with Ctrl-C",
                highlight=False, soft_wrap=True,
            )

        result = api.serve_bundle(bundle, address, tflm_dir=tflm_dir, build_dir=build_dir, stack_bytes=stack_size,
                                  on_ready=ready)
        err_console.print(f"stopped serving '{escape(result.name)}' on {result.address} after {result.seconds:.0f} s", highlight=False)


def _client_host(address: str) -> str:
    parts = address.split(":")
    return f"{parts[1]}:{parts[2]}" if len(parts) == 3 else f"127.0.0.1:{parts[-1]}"
