"""The coverage table bench/bench_npu_verify.py writes into docs/reference/npu-coverage.md (bench/npu_coverage.py):
the worse result wins, a stopped leaf does not hide another leaf's result, the page keeps what lies outside the
markers."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "bench"))
from npu_coverage import BEGIN, END, Coverage, write_section  # noqa: E402

U55, U85 = "ethos-u55-128", "ethos-u85-256"


def _cover(results: list[tuple[str, str, str, str]]) -> Coverage:
    cover = Coverage()
    for op, target, result, leaf in results:
        cover._put(op, target, result, leaf)
    return cover


@pytest.mark.parametrize("results, cell", [
    ([("bit-exact", "a"), ("documented difference", "b")], "documented difference"),
    ([("documented difference", "a"), ("mismatch", "b")], "mismatch"),
    ([("bit-exact", "a"), ("not modelled", "b")], "bit-exact"),  # another leaf ran it
    ([("not modelled", "a"), ("bit-exact", "b")], "bit-exact"),
    ([("not modelled", "a")], "not modelled"),
    ([("not modelled", "a"), ("mismatch", "b")], "mismatch"),
])
def test_the_cell_is_the_worse_result_of_leaves_that_ran(results, cell):
    cover = _cover([("CONV_2D", U85, r, leaf) for r, leaf in results])
    assert cover.cells[("CONV_2D", U85)][0] == cell


def test_the_table_has_a_row_per_operator_and_a_column_per_target():
    cover = _cover([("CONV_2D", U55, "bit-exact", "a"), ("FULLY_CONNECTED", U85, "documented difference", "a")])
    assert cover.markdown([U55, U85]).splitlines() == [
        f"| TFLite operator | {U55} | {U85} |", "|---|---|---|",
        "| CONV_2D | bit-exact | not tried |", "| FULLY_CONNECTED | not tried | documented difference |"]


def test_the_page_keeps_what_lies_outside_the_markers(tmp_path):
    page = tmp_path / "page.md"
    page.write_text(f"# Title\n\nbefore\n\n{BEGIN}\n| old |\n{END}\n\nafter\n")
    write_section(page, "| new |")
    assert page.read_text() == f"# Title\n\nbefore\n\n{BEGIN}\n\n| new |\n\n{END}\n\nafter\n"
    write_section(page, "| newer |")  # again: the same shape
    assert page.read_text().count("| newer |") == 1 and "| new |" not in page.read_text()


def test_a_page_without_markers_is_left_alone(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("# Title\n")
    with pytest.raises(SystemExit, match="markers"):
        write_section(page, "| new |")
    assert page.read_text() == "# Title\n"
