"""Hostile and broken input, class by class: every case is one line, a documented exit code, no traceback, and
nothing blocks or fills memory.

Classes: files that are not regular files or are too large (every reader); non-finite values in any array of a data
file; requirement limits from flags and project files (one validator); internal errors on hand-made files (a closed
stdout, .npz members that are not arrays, a manifest's details, --compare rows); error lines of unbounded length
and raw HTML in the Markdown report.

tests/data/report/run_u55_u85 is a run folder written by `edgedeploy compile` with Vela 5.2.0 (see its SOURCE.md).
"""

from __future__ import annotations

import json
import math
import os
import shutil
import signal
import socket
import subprocess
import sys
import zipfile
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from helpers import examples, run_cli, run_in_process

from edgedeploy.config.requirements import REQUIREMENT_NAMES
from edgedeploy.core import files as fsutil
from edgedeploy.errors import EdgeDeployError, InvalidInputError, UsageError

RUN = Path(__file__).resolve().parents[2] / "data" / "report" / "run_u55_u85"


def one_line(proc, code: int, fragment: str = "") -> None:
    err = proc.stderr
    assert proc.returncode == code, err
    assert err.startswith("error: ") and err.count("\n") == 1 and "Traceback" not in err, err
    assert fragment in err, err


@pytest.fixture(autouse=True)
def _never_block():
    """A reader that opens a FIFO blocks forever: fail the test instead."""
    def blocked(signum, frame):
        raise TimeoutError("blocked reading an input file")

    old = signal.signal(signal.SIGALRM, blocked)
    signal.alarm(60)
    yield
    signal.alarm(0)
    signal.signal(signal.SIGALRM, old)


# ----------------------------------------------------------------------------------------------- 1: special files

def make_special(path: Path, kind: str) -> Path:
    """A file at ``path`` that no reader may block on or read whole."""
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "socket":
        s = socket.socket(socket.AF_UNIX)
        s.bind(str(path))
        s.close()
    elif kind == "dev_zero":
        path.symlink_to("/dev/zero")
    elif kind == "folder":
        path.mkdir()
    elif kind == "oversize":
        path.write_bytes(b"#" * 4096)  # over the limits the test sets
    return path


def _readers():
    from edgedeploy.config.data import load_dataset, read_targets
    from edgedeploy.keras.model import inspect_model_file
    from edgedeploy.core.manifest import Manifest
    from edgedeploy.core.npz import read_npz
    from edgedeploy.pipeline.project import load_project
    from edgedeploy.config.recipe import load_recipe
    from edgedeploy.report import requirements_from_project
    from edgedeploy.report.regressions import load_report_json
    from edgedeploy.report.sweep_report import load_sweep_record, load_sweep_report_json
    from edgedeploy.config.targets import load_target_file
    from edgedeploy.tflite.reader import read_tflite

    # (what, file name, read(path-of-that-file))
    return [
        ("project file", "edgedeploy.toml", load_project),
        ("project requirements", "edgedeploy.toml", requirements_from_project),
        ("recipe file", "recipe.toml", load_recipe),
        ("target file", "t.toml", load_target_file),
        ("tflite model", "m.tflite", read_tflite),
        ("keras model", "m.h5", inspect_model_file),
        ("run manifest", "manifest.json", lambda p: Manifest.load(p.parent)),
        ("sweep record", "sweep.json", lambda p: load_sweep_record(p.parent)),
        ("--compare report", "old.json", load_report_json),
        ("--compare sweep report", "old.json", load_sweep_report_json),
        ("data file", "d.npz", lambda p: load_dataset(p, (1,), 2)),
        ("data targets", "d.npz", read_targets),
        ("golden vectors", "golden.npz", read_npz),
    ]


READERS = [r[0] for r in _readers()]


@pytest.mark.parametrize("kind", ["fifo", "socket", "dev_zero", "folder", "oversize"])
@pytest.mark.parametrize("reader", READERS)
def test_every_reader_refuses_what_is_not_a_bounded_regular_file(tmp_path, monkeypatch, reader, kind):
    what, name, read = next(r for r in _readers() if r[0] == reader)
    for key in fsutil.LIMITS:
        monkeypatch.setitem(fsutil.LIMITS, key, 1024)
    path = make_special(tmp_path / name, kind)
    with pytest.raises(EdgeDeployError) as err:
        read(path)
    text = err.value.one_line()
    assert "\n" not in text and (name in text or str(tmp_path) in text), text
    if kind != "folder":  # a folder keeps each file kind's own error (usage, target); the others are bad input
        assert isinstance(err.value, InvalidInputError), text
        assert {"fifo": "a FIFO", "socket": "a socket", "dev_zero": "a device file",
                "oversize": "over the limit"}[kind] in text


def test_a_3gib_tflite_is_refused_before_it_is_read(tmp_path):
    from edgedeploy.tflite.reader import read_tflite

    model = tmp_path / "big.tflite"
    shutil.copyfile(Path(__file__).resolve().parents[3] / "examples" / "kws" / "dscnn_mlperf_int8.tflite", model)
    os.truncate(model, 3 << 30)  # the model followed by zeros (sparse: no disk used)
    with pytest.raises(InvalidInputError, match=r"3,221,225,472 bytes, over the limit of 2,147,483,648"):
        read_tflite(model)
    assert fsutil.LIMITS["model"] == 2 << 30  # a flatbuffer cannot exceed 2 GiB


@pytest.mark.parametrize("where", ["project", "compare", "manifest"])
def test_a_fifo_given_to_the_cli_is_one_line_and_exit_3(tmp_path, where):
    fifo = make_special(tmp_path / ("manifest.json" if where == "manifest" else "f.json"), "fifo")
    args = {"project": ["report", RUN, "--project", fifo], "compare": ["report", RUN, "--compare", fifo],
            "manifest": ["report", tmp_path]}[where]
    one_line(run_in_process(*args), 3, "is a FIFO, not a regular file")


def test_dev_zero_as_a_project_file_to_compile_is_one_line_and_exit_3(tmp_path):
    (tmp_path / "p.toml").symlink_to("/dev/zero")
    one_line(run_in_process("compile", tmp_path / "p.toml", "-o", tmp_path / "out"), 3, "is a device file")
    assert not (tmp_path / "out").exists()


# ------------------------------------------------------------------------------------------- 2: non-finite values

LAYOUTS = {
    "x/y/split": lambda rng: {"x": rng.normal(size=(6, 3)).astype(np.float32), "y": np.array([0, 1, 0, 1, 0, 1]),
                              "split": np.array([0, 0, 0, 1, 1, 1])},
    "train/test": lambda rng: {"x_train": rng.normal(size=(4, 3)).astype(np.float32), "y_train": np.array([0, 1, 0, 1]),
                               "x_test": rng.normal(size=(2, 3)).astype(np.float32), "y_test": np.array([0, 1])},
    "one-hot": lambda rng: {"x_train": rng.normal(size=(4, 3)).astype(np.float32),
                            "y_train": np.eye(2, dtype=np.float32)[[0, 1, 0, 1]],
                            "x_test": rng.normal(size=(2, 3)).astype(np.float32),
                            "y_test": np.eye(2, dtype=np.float32)[[0, 1]]},
    "regression": lambda rng: {"x": rng.normal(size=(6, 3)).astype(np.float32),
                               "y": rng.normal(size=(6, 2)).astype(np.float32), "split": np.array([0, 0, 0, 1, 1, 1])},
}


def _poisonable(arrays):
    return sorted(k for k, a in arrays.items() if k != "split")


@settings(max_examples=examples(40), deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(layout=st.sampled_from(sorted(LAYOUTS)), pick=st.integers(0, 10**6), where=st.integers(0, 10**6),
       bad=st.sampled_from([math.nan, math.inf, -math.inf]))
def test_a_non_finite_value_in_any_array_is_named_with_its_first_index(tmp_path, layout, pick, where, bad):
    from edgedeploy.config.data import load_dataset, read_targets

    arrays = LAYOUTS[layout](np.random.default_rng(pick))
    names = _poisonable(arrays)
    name = names[pick % len(names)]
    a = arrays[name].astype(np.float32) if arrays[name].dtype.kind in "iu" else arrays[name].copy()
    a.reshape(-1)[where % a.size] = bad
    arrays[name] = a
    first = np.argwhere(~np.isfinite(a))[0]
    path = tmp_path / f"d{pick}.npz"
    np.savez(path, **arrays)
    kind = "regression" if layout == "regression" else "classification"
    with pytest.raises(InvalidInputError) as err:
        if name.startswith("y"):
            read_targets(path)  # the targets decide the task: checked before anything is inferred from them
        load_dataset(path, (3,), 2, kind)
    text = err.value.one_line()
    index = f"index {int(first[0])}" if a.ndim == 1 else f"index {[int(i) for i in first]}"
    assert f"'{name}' holds" in text and index in text and "replace or drop" in text, text


@pytest.mark.parametrize("row", [0, 3, 5])
def test_one_hot_float_targets_with_a_nan_row_are_refused_not_read_as_regression(tmp_path, row):
    from edgedeploy.config.data import read_targets

    y = np.eye(3, dtype=np.float32)[[0, 1, 2, 0, 1, 2]]
    y[row] = np.nan
    np.savez(tmp_path / "d.npz", x_train=np.zeros((6, 4), np.float32), y_train=y,
             x_test=np.zeros((2, 4), np.float32), y_test=np.eye(3, dtype=np.float32)[[0, 1]])
    with pytest.raises(InvalidInputError, match=rf"'y_train' holds nan at index \[{row}, 0\] \(sample {row}\); 3 non-finite"):
        read_targets(tmp_path / "d.npz")


# -------------------------------------------------------------------------------------------- 3: requirement limits

HUGE = "9" * 400
BAD_LIMITS = [
    ("--max-accuracy-drop", "nan"), ("--max-accuracy-drop", "inf"), ("--max-accuracy-drop", HUGE),
    ("--max-accuracy-drop", "-1"), ("--max-accuracy-drop", "101"),
    ("--max-metric-drop", "nan"), ("--max-metric-drop", "-inf"),
    ("--max-flash", "nan"), ("--max-flash", "inf"), ("--max-flash", HUGE), ("--max-flash", "0"), ("--max-flash", "2TiB"),
    ("--max-sram", "1e400"), ("--max-sram", "-5"),
    ("--max-latency-ms", "nan"), ("--max-latency-ms", "0"), ("--max-latency-ms", HUGE),
    ("--max-npu-cycles", HUGE), ("--max-npu-cycles", "0"),
]


@pytest.mark.parametrize("flag,value", BAD_LIMITS, ids=[f"{f}={v[:8]}" for f, v in BAD_LIMITS])
def test_a_bad_limit_flag_is_refused_by_the_one_validator(flag, value):
    from edgedeploy.report.judge import requirements_from_options

    name = flag[2:].replace("-", "_")
    kind = {"max_flash": str, "max_sram": str, "max_npu_cycles": int}.get(name, float)  # as typer converts it
    with pytest.raises(UsageError) as err:
        requirements_from_options(**{name: kind(value)})
    assert err.value.one_line().startswith(f"{flag} is") and len(err.value.one_line()) < 400


CLI_LIMITS = [BAD_LIMITS[i] for i in (0, 1, 2, 5, 9, 12, 14, 17)]


@pytest.mark.parametrize("flag,value", CLI_LIMITS, ids=[f"{f}={v[:8]}" for f, v in CLI_LIMITS])
def test_a_bad_limit_flag_is_one_line_and_exit_2(flag, value):
    proc = run_in_process("report", RUN, flag, value)
    one_line(proc, 2, flag)
    assert len(proc.stderr) < 400 and "over by" not in proc.stdout


@pytest.mark.parametrize("flag,value", [("--max-flash", "nan"), ("--max-latency-ms", "1e999"),
                                        ("--max-npu-cycles", HUGE), ("--max-accuracy-drop", "-0.5")])
def test_a_bad_limit_flag_of_a_walk_is_refused_before_the_model_is_read(tmp_path, flag, value):
    proc = run_in_process("optimize", tmp_path / "m.h5", "--data", tmp_path / "d.npz", "--walk", "-t",
                          "ethos-u55-128", flag, value, "-o", tmp_path / "out")
    one_line(proc, 2, flag)
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("tolerance", ["cycles=inf", "accuracy=nan", "flash=inf%", f"sram={HUGE}"])
def test_a_non_finite_tolerance_is_one_line_and_exit_2(tmp_path, tolerance):
    one_line(run_in_process("report", RUN, "--compare", tmp_path / "old.json", "--tolerance", tolerance), 2,
             "--tolerance")


@pytest.mark.parametrize("key,value", [("max_accuracy_drop", "nan"), ("max_accuracy_drop", "inf"),
                                       ("max_latency_ms", "-inf"), ("max_flash", HUGE), ("max_flash", "nan"),
                                       ("max_npu_cycles", HUGE), ("max_sram", '"1e400"'), ("max_accuracy_drop", "1e300")])
def test_a_bad_limit_in_a_project_file_is_refused_by_both_readers(tmp_path, key, value):
    from edgedeploy.pipeline.project import load_project
    from edgedeploy.report import requirements_from_project

    p = tmp_path / "edgedeploy.toml"
    p.write_text(f'model = "m.h5"\ndata = "d.npz"\n[requirements]\n{key} = {value}\n')
    for read in (load_project, requirements_from_project):
        with pytest.raises(UsageError) as err:
            read(p)
        assert f"requirements.{key}" in err.value.message and len(err.value.one_line()) < 400
    one_line(run_in_process("report", RUN, "--project", p), 2, f"requirements.{key}")


@settings(max_examples=examples(200), deadline=None)
@given(name=st.sampled_from(REQUIREMENT_NAMES),
       value=st.one_of(st.floats(allow_nan=True, allow_infinity=True), st.integers(-2**70, 2**70)))
def test_one_validator_accepts_exactly_the_documented_bounds(name, value):
    from edgedeploy.config.requirements import REQUIREMENTS, check_requirement

    b = REQUIREMENTS[name]
    ok = (math.isfinite(value) and (value > b.low if b.low_open else value >= b.low) and value <= b.high
          and (b.kind is float or float(value).is_integer()))
    try:
        got = check_requirement(name, value, f"--{name}")
    except UsageError as exc:
        assert not ok, (name, value, exc.one_line())
        assert "\n" not in exc.one_line() and len(exc.one_line()) < 400
    else:
        assert ok and got == value and isinstance(got, b.kind), (name, value, got)


# --------------------------------------------------------------------------- 4: no internal error on hand-made files

# the closed stream is found before the arguments are read: a command in the default run, the options that print
# and exit on their own with the slow tests
@pytest.mark.parametrize("args", ["targets list", pytest.param("--help", marks=pytest.mark.slow),
                                  pytest.param("--version", marks=pytest.mark.slow)])
def test_a_closed_stdout_is_one_line_and_exit_2_not_a_traceback(args):
    proc = subprocess.run(f"{sys.executable} -m edgedeploy {args} >&-", shell=True, capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert proc.stderr.count("\n") == 1 and "standard output is closed" in proc.stderr


def test_a_closed_stdin_or_stderr_is_no_matter():
    proc = subprocess.run(f"{sys.executable} -m edgedeploy targets list <&-", shell=True, capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 0 and "ethos-u55-128" in proc.stdout
    proc = subprocess.run(f"{sys.executable} -m edgedeploy targets list 2>&-", shell=True, capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 0 and "ethos-u55-128" in proc.stdout


@pytest.mark.parametrize("member,content", [("notes.txt", b"hello"), ("x", b"\x93NUMPY"), ("sub/", b"")])
def test_npz_members_that_are_not_arrays_are_one_error(tmp_path, member, content):
    from edgedeploy.config.data import load_dataset, read_targets

    path = tmp_path / "d.npz"
    np.savez(path, x=np.zeros((4, 3), np.float32), y=np.array([0, 1, 0, 1]), split=np.array([0, 0, 1, 1]))
    with zipfile.ZipFile(path, "a") as zf:
        zf.writestr(member, content)
    for read in (lambda: load_dataset(path, (3,), 2), lambda: read_targets(path)):
        with pytest.raises(InvalidInputError, match=r"is not a \.npy array"):
            read()


def test_an_npz_that_unpacks_beyond_the_limit_is_refused(tmp_path, monkeypatch):
    from edgedeploy.core.npz import read_npz

    path = tmp_path / "d.npz"
    np.savez_compressed(path, x=np.zeros((1 << 16,), np.float32))  # 256 KiB that packs into a few hundred bytes
    monkeypatch.setitem(fsutil.LIMITS, "data", path.stat().st_size + 1024)
    with pytest.raises(InvalidInputError, match="unpacks to 262,272 bytes, over the limit"):
        read_npz(path)


def _tampered_run(tmp_path, change) -> Path:
    run = tmp_path / "run"
    shutil.copytree(RUN, run)
    doc = json.loads((run / "manifest.json").read_text())
    change(doc)
    (run / "manifest.json").write_text(json.dumps(doc))
    return run


@pytest.mark.parametrize("change,fragment", [
    (lambda d: d["stages"][2].update(details={"data": [1, 2]}), "details.data"),
    (lambda d: d["stages"][2].update(details={"data": {"path": ["x"]}}), "details.data.path"),
    (lambda d: d["stages"][2].update(details={"data": {"labels": [1, 2]}}), "details.data.labels"),
    (lambda d: d["stages"][2].update(details={"metric": "accuracy"}), "details.metric"),
    (lambda d: d["stages"][2].update(details={"npu_compute": 7}), "details.npu_compute"),
    (lambda d: d["info"].update(walk={"requirements": {"max_flash": -3}}), "info.walk.requirements.max_flash"),
    (lambda d: d["info"].update(walk={"requirements": [1]}), "info.walk.requirements"),
])
def test_a_hand_edited_manifest_is_one_line_and_exit_3(tmp_path, change, fragment):
    run = _tampered_run(tmp_path, change)
    one_line(run_in_process("report", run), 3, fragment)


@pytest.fixture(scope="module")
def reference() -> str:
    """A reference report of RUN as `report --format json` writes it."""
    proc = run_in_process("report", RUN, "--format", "json")
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


BAD_ROWS = [
    ("a number, not a row", lambda rows: rows.__setitem__(0, 7), "row 0 is int"),
    ("no leaf", lambda rows: rows[0].pop("leaf"), "row 0 has no leaf name"),
    ("a list as target", lambda rows: rows[0].update(target=["x"]), "row 0 has target"),
    ("values not a table", lambda rows: rows[0].update(values=[1]), "`values` that are not a table"),
    ("a bare number cell", lambda rows: rows[0]["values"].update(sram_bytes=5), "value sram_bytes is 5"),
    ("text as a value", lambda rows: rows[0]["values"].update(total_cycles={"value": "fast"}),
     "value total_cycles is 'fast'"),
    ("NaN as a value", lambda rows: rows[0]["values"].update(total_cycles={"value": math.nan}), "not a finite number"),
    ("a huge value", lambda rows: rows[0]["values"].update(sram_bytes={"value": 10**400}), "not a finite number"),
    ("a bad direction", lambda rows: rows[0]["values"].update(int8_metric={"value": 1, "higher_is_better": "no"}),
     "higher_is_better"),
]


@pytest.mark.parametrize("what,change,fragment", BAD_ROWS, ids=[b[0] for b in BAD_ROWS])
def test_hand_made_compare_rows_are_one_line_and_exit_3(tmp_path, reference, what, change, fragment):
    doc = json.loads(reference)
    change(doc["rows"])
    old = tmp_path / "old.json"
    old.write_text(json.dumps(doc, default=str).replace('"NaN"', "NaN"))
    one_line(run_in_process("report", RUN, "--compare", old, "--fail-on-regression"), 3, fragment)


# ------------------------------------------------------------------------------------------------- 5: bounded text

@settings(max_examples=examples(200), deadline=None)
@given(words=st.lists(st.text(min_size=0, max_size=3000), min_size=1, max_size=8))
@example(words=["0" * 161])  # one word just over the limit: shortened, both ends kept
@example(words=["0" * 160 + " "])  # a word at the limit, then a space: two words, neither over it
def test_an_error_line_is_bounded_and_keeps_both_ends_of_a_long_word(words):
    from edgedeploy.cli.common import ERROR_LINE_LIMIT, bounded_line

    line = " ".join(words)
    out = bounded_line(line)
    assert len(out) <= ERROR_LINE_LIMIT
    if len(line) <= fsutil.SHORT_LIMIT:
        assert out == line
    pieces = line.split(" ")  # the words bounded_line sees (a drawn word may hold spaces itself)
    if len(pieces) == 1 and len(line) > fsutil.SHORT_LIMIT:
        assert out.startswith(line[:40]) and out.endswith(line[-40:]) and "..." in out


def test_a_long_model_path_gives_a_short_line(tmp_path):
    deep = "d" * 200
    path = "/".join([str(tmp_path), *([deep] * 600), "model.tflite"])  # 120 kB: near the longest argument Linux takes
    proc = run_cli("compile", path, "-t", "ethos-u55-128", "-o", tmp_path / "out")
    assert proc.returncode == 3 and proc.stderr.count("\n") == 1, proc.stderr[:300]
    assert len(proc.stderr) < 600 and "model.tflite" in proc.stderr and "..." in proc.stderr


def test_a_long_path_in_a_project_file_gives_a_short_line(tmp_path):
    p = tmp_path / "edgedeploy.toml"
    p.write_text(f'model = "{"m" * 3_000_000}.h5"\ndata = "d.npz"\n')
    proc = run_in_process("compile", p, "-o", tmp_path / "out")
    assert proc.returncode in (2, 3) and proc.stderr.count("\n") == 1 and len(proc.stderr) < 1200, proc.stderr[:300]


HOSTILE = ["<script>alert(1)</script>", '<img src=x onerror="alert(1)">', "a`<b>`c"]


@pytest.mark.parametrize("text", HOSTILE)
def test_the_markdown_report_escapes_raw_html_from_names_and_warnings(text):
    from edgedeploy.report import build_report
    from edgedeploy.report.render import render_markdown

    doc = build_report(RUN)
    doc["notes"].append(f"warning: {text}")
    doc["rows"][0]["leaf"] = text
    doc["run_dir"] = text
    doc["manifest"]["path"] = text
    doc["tools"][text] = text
    for rec in doc["recommendations"].values():
        rec["message"] = text
    md = render_markdown(doc)
    assert "<script" not in md and "<img" not in md and "<b>" not in md
    assert "&lt;" in md


def test_the_sweep_markdown_escapes_raw_html():
    from edgedeploy.report.render.sweep_formats import render_sweep_markdown

    doc = {"run_dir": HOSTILE[0], "sweep": {"path": HOSTILE[2]}, "edgedeploy_version": "0", "created": HOSTILE[1],
           "requirements": {"sources": []}, "overall": {}, "models": [], "rows": [], "targets": [],
           "notes": [HOSTILE[0]], "comparable": {"ranked": True, "why": ""}}
    md = render_sweep_markdown(doc)
    assert "<script" not in md and "<img" not in md and "<b>" not in md
