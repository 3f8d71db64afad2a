"""The coverage table of docs/reference/npu-coverage.md: TFLite operator x target, from `edgedeploy verify` runs.

Each verified leaf adds its operators (those Vela put on the NPU: the int8 model's operators less the ones the
compiled model still runs on the CPU) to its target's column:

* bit-exact: the leaf verified bit-exact, or within the documented difference and the operator is not the one the
  difference is documented for;
* documented difference: the leaf verified within the documented difference and the operator is the documented one
  (TFLite's FULLY_CONNECTED rounding, edgedeploy.npu.verify.DOCUMENTED);
* not modelled: the leaf stopped (exit code 11) before it ran, and no other leaf verified the operator there;
* mismatch: the leaf differed (exit code 12).

Where leaves disagree the worse result wins (mismatch, then not modelled, then documented difference).
"""

from __future__ import annotations

from pathlib import Path

BEGIN = "<!-- coverage table: written by bench/bench_npu_verify.py --write-docs; do not edit by hand -->"
END = "<!-- end of the coverage table -->"
RANK = {"bit-exact": 0, "documented difference": 1, "not modelled": 2, "mismatch": 3}


def npu_operators(int8_model: Path, vela_model: Path | None) -> set[str]:
    """The TFLite operators of ``int8_model`` that Vela put on the NPU (all of them when nothing was compiled)."""
    from edgedeploy.tflite.reader import read_tflite

    counts = read_tflite(int8_model).op_counts
    if vela_model is not None:
        for name, n in read_tflite(vela_model).op_counts.items():
            if counts.get(name, 0) <= n:
                counts.pop(name, None)
    return set(counts)


class Coverage:
    def __init__(self) -> None:
        self.cells: dict[tuple[str, str], tuple[str, set[str]]] = {}

    def add(self, leaf: str, target: str, int8_model: Path, run: Path, doc: dict) -> None:
        from edgedeploy.npu.verify import DOCUMENTED

        vela = next(iter(sorted((run / "compile" / leaf / target).glob("*_vela.tflite"))), None)
        status = doc["status"]
        for op in npu_operators(int8_model, vela):
            if status == "bit-exact" or (status == "documented-difference" and op not in DOCUMENTED):
                result = "bit-exact"
            elif status == "documented-difference":
                result = "documented difference"
            else:
                result = "not modelled" if status == "not-modelled" else "mismatch"
            self._put(op, target, result, leaf)

    def _put(self, op: str, target: str, result: str, leaf: str) -> None:
        old, leaves = self.cells.get((op, target), (result, set()))
        if result == "not modelled" and old != "not modelled" and leaves:
            return  # another leaf ran the operator on this target
        best = result if RANK[result] > RANK[old] or (old == "not modelled" and result != "mismatch") else old
        self.cells[(op, target)] = (best, leaves | {leaf})

    def markdown(self, targets: list[str]) -> str:
        ops = sorted({op for op, _ in self.cells})
        lines = ["| TFLite operator | " + " | ".join(targets) + " |", "|---|" + "---|" * len(targets)]
        for op in ops:
            lines.append(f"| {op} | " + " | ".join(self.cells.get((op, t), ("not tried", set()))[0]
                                                    for t in targets) + " |")
        return "\n".join(lines)


def write_section(page: Path, table: str) -> None:
    """Replace what lies between the page's markers with ``table``."""
    text = page.read_text()
    start, end = text.find(BEGIN), text.find(END)
    if start < 0 or end < start:
        raise SystemExit(f"{page}: the markers {BEGIN!r} and {END!r} are missing; add them where the table goes")
    page.write_text(text[: start + len(BEGIN)] + "\n\n" + table + "\n\n" + text[end:])
