"""Manifest round trip, stage caching and all-or-nothing outputs (no TF, no Vela)."""

from __future__ import annotations

import errno
import json

import pytest

from edgedeploy.errors import DiskFullError, InvalidInputError, ToolFailedError
from edgedeploy.core.files import new_staging_dir
from edgedeploy.export.outdir import lock_out_dir
from edgedeploy.core.manifest import Manifest, Metric
from edgedeploy.core.stage import RunContext, StageResult, StageSpec, place_staged, run_stage


def _stage(calls, fail=False):
    def fn(out):
        calls.append(out)
        (out / "a.txt").write_text("hello")
        if fail:
            raise ToolFailedError("boom", "fix it")
        return StageResult(outputs={"text": out / "a.txt"}, metrics={"n": Metric(5, "count", "computed")})

    return fn


def test_stage_runs_records_and_is_reused(tmp_path):
    src = tmp_path / "in.txt"
    src.write_text("x")
    ctx = RunContext.open(tmp_path / "run")
    calls = []
    spec = StageSpec("demo", "v1", params={"k": 1})
    rec = run_stage(ctx, spec, {"src": src}, _stage(calls))
    assert rec.status == "ok" and rec.output("text").path == "demo/v1/a.txt"
    assert (tmp_path / "run" / "demo" / "v1" / "a.txt").read_text() == "hello"
    data = json.loads((tmp_path / "run" / "manifest.json").read_text())
    assert data["schema"] == "edgedeploy.manifest" and data["stages"][0]["metrics"]["n"] == {
        "value": 5, "unit": "count", "mode": "computed"}

    # same inputs and params: reused, not run again (also from a fresh load of the manifest)
    ctx2 = RunContext.open(tmp_path / "run")
    run_stage(ctx2, spec, {"src": src}, _stage(calls))
    assert len(calls) == 1
    # changed params or inputs: run again
    run_stage(ctx2, StageSpec("demo", "v1", params={"k": 2}), {"src": src}, _stage(calls))
    assert len(calls) == 2
    src.write_text("y")
    run_stage(ctx2, StageSpec("demo", "v1", params={"k": 2}), {"src": src}, _stage(calls))
    assert len(calls) == 3
    # a damaged output is not reused
    (tmp_path / "run" / "demo" / "v1" / "a.txt").write_text("tampered")
    run_stage(ctx2, StageSpec("demo", "v1", params={"k": 2}), {"src": src}, _stage(calls))
    assert len(calls) == 4


def test_failed_stage_leaves_no_output_and_keeps_earlier_result(tmp_path):
    src = tmp_path / "in.txt"
    src.write_text("x")
    ctx = RunContext.open(tmp_path / "run")
    run_stage(ctx, StageSpec("demo", "v1"), {"src": src}, _stage([]))
    src.write_text("changed")
    with pytest.raises(ToolFailedError):
        run_stage(ctx, StageSpec("demo", "v1"), {"src": src}, _stage([], fail=True))
    assert (tmp_path / "run" / "demo" / "v1" / "a.txt").read_text() == "hello"  # the old complete result
    leftovers = [p.name for p in (tmp_path / "run" / "demo").iterdir() if p.name != "v1"]
    assert leftovers == []
    rec = Manifest.load(tmp_path / "run").records["demo/v1"]
    assert rec.status == "failed" and "boom" in rec.error


def test_missing_metric_is_unavailable_with_reason():
    d = Metric.missing("B", "estimated", "Vela reported no value").to_dict()
    assert d == {"value": None, "unit": "B", "mode": "estimated", "unavailable": "Vela reported no value"}


def test_load_errors(tmp_path):
    with pytest.raises(InvalidInputError, match="has no manifest.json"):
        Manifest.load(tmp_path)
    (tmp_path / "manifest.json").write_text("{not json")
    with pytest.raises(InvalidInputError, match="not valid JSON"):
        Manifest.load(tmp_path)
    (tmp_path / "manifest.json").write_text('{"schema": "other"}')
    with pytest.raises(InvalidInputError, match="not an edgedeploy manifest"):
        Manifest.load(tmp_path)


def test_saved_text_is_plain_indented_json_and_follows_replaced_records(tmp_path):
    from pathlib import Path

    from edgedeploy.core.manifest import Artifact, StageRecord, ToolInfo

    m = Manifest(tmp_path)
    m.save()
    assert json.loads((tmp_path / "manifest.json").read_text())["stages"] == []
    details = {"layers": [{"name": "conv", "cycles": 12}], "where": Path("/x")}
    first = StageRecord("compile/a/t", "compile", "ok", variant="a", target="t",
                        tool=ToolInfo("vela", "5.2.0", ["vela", "a.tflite"]),
                        outputs=[Artifact("log", "compile/a/t/vela.log", "0" * 64, 3)],
                        metrics={"n": Metric(1, "count", "estimated"), "gone": Metric.missing("B", "estimated", "no")},
                        details=details)
    m.record(first)
    m.record(StageRecord("import/a", "import", "ok", variant="a"))
    text = (tmp_path / "manifest.json").read_text()
    assert text == json.dumps(m.to_dict(), indent=2, default=str) + "\n"
    # a record replaced under the same id is written anew; the others keep their text
    m.record(StageRecord("compile/a/t", "compile", "failed", variant="a", target="t", error="boom"))
    again = Manifest.load(tmp_path)
    assert again.records["compile/a/t"].status == "failed" and again.records["compile/a/t"].error == "boom"
    assert list(again.records) == ["compile/a/t", "import/a"]
    assert (tmp_path / "manifest.json").read_text() == json.dumps(m.to_dict(), indent=2, default=str) + "\n"
    # to_dict does not copy the details it writes, and round-trips
    assert StageRecord.from_dict(json.loads(json.dumps(first.to_dict(), default=str))).metrics["gone"].value is None


def test_atomic_writes_and_staging_folders_respect_the_umask(tmp_path):
    import os
    import stat

    from edgedeploy.core.files import atomic_write_text, new_staging_dir

    old = os.umask(0o022)
    try:
        atomic_write_text(tmp_path / "a.json", "{}")
        staged = new_staging_dir(tmp_path / "stage")
        os.umask(0o027)
        atomic_write_text(tmp_path / "b.json", "{}")
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "a.json").stat().st_mode) == 0o644
    assert stat.S_IMODE(staged.stat().st_mode) == 0o755
    assert stat.S_IMODE((tmp_path / "b.json").stat().st_mode) == 0o640


def test_stale_staging_of_a_killed_run_is_removed_and_nothing_else(tmp_path):
    from edgedeploy.core.files import new_staging_dir, release_run_dirs
    from edgedeploy.core.stage import RunContext

    run = tmp_path / "run"
    ctx = RunContext.open(run)
    staged = new_staging_dir(ctx.stage_dir("compile/v/ethos-u55-128"))  # then the command is killed
    (staged / "v_vela.tflite").write_bytes(b"half")
    release_run_dirs()
    # names shaped like edgedeploy's temporary files, made by the user: never removed
    (run / "compile" / "v" / ".ethos-u55-128.ab_cd123.part").mkdir(parents=True)
    (run / "compile" / "v" / ".ethos-u55-128.old4242").mkdir()
    (run / ".manifest.json.zz9_aa12.part").write_text("{")
    (run / "compile" / "v" / "mine.part").write_text("user file")
    RunContext.open(run)
    release_run_dirs()
    left = sorted(str(p.relative_to(run)) for p in run.rglob("*"))
    assert left == [".edgedeploy.lock", ".manifest.json.zz9_aa12.part", "compile", "compile/v",
                    "compile/v/.ethos-u55-128.ab_cd123.part", "compile/v/.ethos-u55-128.old4242",
                    "compile/v/mine.part"]


def test_a_metric_that_is_not_a_number_is_a_damaged_manifest(tmp_path):
    import json

    from edgedeploy.errors import InvalidInputError
    from edgedeploy.core.manifest import Manifest

    stage = {"id": "compile/m/ethos-u55-128", "stage": "compile", "status": "ok", "variant": "m",
             "target": "ethos-u55-128", "metrics": {"sram_bytes": {"value": "NaN", "unit": "B"}}}
    (tmp_path / "manifest.json").write_text(json.dumps(
        {"schema": "edgedeploy.manifest", "schema_version": 1, "stages": [stage]}))
    with pytest.raises(InvalidInputError, match="metric 'sram_bytes'.*not a number"):
        Manifest.load(tmp_path)
    for bad in (float("nan"), 10**400):
        stage["metrics"]["sram_bytes"]["value"] = bad
        (tmp_path / "manifest.json").write_text(json.dumps(
            {"schema": "edgedeploy.manifest", "schema_version": 1, "stages": [stage]}))
        with pytest.raises(InvalidInputError, match="not a number"):
            Manifest.load(tmp_path)
    for key, bad in (("details", []), ("warnings", 5), ("status", "weird")):
        (tmp_path / "manifest.json").write_text(json.dumps(
            {"schema": "edgedeploy.manifest", "schema_version": 1, "stages": [{**stage, key: bad}]}))
        with pytest.raises(InvalidInputError, match="is damaged"):
            Manifest.load(tmp_path)
    (tmp_path / "manifest.json").write_text(json.dumps(
        {"schema": "edgedeploy.manifest", "schema_version": 1, "targets": {"t": {"npu_hz": "fast"}}}))
    with pytest.raises(InvalidInputError, match="npu_hz is 'fast'"):
        Manifest.load(tmp_path)
    stage["metrics"]["sram_bytes"]["value"] = 1024
    (tmp_path / "manifest.json").write_text(json.dumps(
        {"schema": "edgedeploy.manifest", "schema_version": 1, "stages": [stage]}))
    assert Manifest.load(tmp_path).records["compile/m/ethos-u55-128"].metric("sram_bytes") == 1024


def _sha(data: bytes) -> str:
    import hashlib

    return hashlib.sha256(data).hexdigest()


BYTES = b"int8 model bytes"


def _flipped(path):
    data = bytearray(path.read_bytes())
    data[3] ^= 1
    path.write_bytes(bytes(data))


def _fifo(path):
    import os

    path.unlink()
    os.mkfifo(path)  # never opened: a read would block


@pytest.mark.parametrize(("change", "links", "why"), [
    (None, True, None),
    (_flipped, True, "was changed after it was written (sha256 "),
    (lambda p: p.write_bytes(BYTES + b"!"), True, "was changed after it was written (17 bytes, recorded 16)"),
    (lambda p: p.unlink(), True, "is missing"),
    (_fifo, True, "is not a regular file"),
    (lambda p: (p.unlink(), p.mkdir()), True, "is not a regular file"),
    (lambda p: (p.rename(p.with_name("real")), p.symlink_to("real")), True, None),
    (lambda p: (p.rename(p.with_name("real")), p.symlink_to("real")), False, "is a link"),
])
def test_a_recorded_file_is_checked_by_kind_size_and_sha256(tmp_path, change, links, why):
    from edgedeploy.core.manifest import check_recorded_file, file_mismatch

    path = tmp_path / "model_int8.tflite"
    path.write_bytes(BYTES)
    if change is not None:
        change(path)
    got = file_mismatch(path, _sha(BYTES), len(BYTES), links=links)
    assert (got is None) if why is None else (got is not None and got.startswith(why)), got
    if why is None:
        assert check_recorded_file(path, _sha(BYTES), "the model", "RUN/manifest.json", "fix it", len(BYTES),
                                   links=links) == path
        return
    with pytest.raises(InvalidInputError) as err:
        check_recorded_file(path, _sha(BYTES), "the model", "RUN/manifest.json", "re-run it", len(BYTES), links=links)
    line = err.value.one_line()
    assert "\n" not in line and str(path) in line and f"RUN/manifest.json records sha256 {_sha(BYTES)[:16]}" in line
    assert "re-run it" in line


def _run_with(tmp_path, records):
    from edgedeploy.core.manifest import StageRecord

    manifest = Manifest(tmp_path / "run")
    for rec in records:
        manifest.records[rec["id"]] = StageRecord.from_dict({"status": "ok", **rec})
    return manifest


@pytest.mark.parametrize(("rid", "hint"), [
    ("convert/ptq", "run the `edgedeploy optimize` command that wrote RUN again (same model, data and options): it "
                    "makes convert/ptq anew"),
    ("compile/ptq/ethos-u55-128", "run `edgedeploy compile RUN -t ethos-u55-128` again, which compiles it anew"),
    ("import/kws", "run `edgedeploy compile /m/kws.tflite -t ethos-u55-128 -o RUN` again, which copies it anew"),
    ("compile/kws/ethos-u55-128", "run `edgedeploy compile /m/kws.tflite -t ethos-u55-128 -o RUN` again, which "
                                  "compiles it anew"),
])
def test_a_changed_output_names_the_command_that_writes_it_again(tmp_path, rid, hint):
    from edgedeploy.core.manifest import remake_hint

    manifest = _run_with(tmp_path, [
        {"id": "convert/ptq", "stage": "convert", "variant": "ptq"},
        {"id": "compile/ptq/ethos-u55-128", "stage": "compile", "variant": "ptq", "target": "ethos-u55-128",
         "parent": "convert/ptq"},
        {"id": "import/kws", "stage": "import", "variant": "kws", "params": {"source": "/m/kws.tflite"}},
        {"id": "compile/kws/ethos-u55-128", "stage": "compile", "variant": "kws", "target": "ethos-u55-128",
         "parent": "import/kws"},
    ])
    assert remake_hint(manifest, manifest.records[rid]).replace(str(tmp_path / "run"), "RUN") == hint


def test_a_stage_whose_output_was_changed_runs_again_and_says_so(tmp_path, caplog):
    src = tmp_path / "in.txt"
    src.write_text("x")
    ctx = RunContext.open(tmp_path / "run")
    calls = []
    spec = StageSpec("demo", "v1")
    run_stage(ctx, spec, {"src": src}, _stage(calls))
    (tmp_path / "run" / "demo" / "v1" / "a.txt").write_text("hellO")
    with caplog.at_level("WARNING", logger="edgedeploy"):
        rec = run_stage(RunContext.open(tmp_path / "run"), spec, {"src": src}, _stage(calls))
    assert len(calls) == 2 and (tmp_path / "run" / "demo" / "v1" / "a.txt").read_text() == "hello"
    assert rec.output("text").sha256 == _sha(b"hello")
    assert "demo/v1: an output was changed or removed after the stage wrote it" in caplog.text


def _no_space(staged):
    raise OSError(errno.ENOSPC, "No space left on device", str(staged / "m.c"))


def _tool_failed(staged):
    raise ToolFailedError("boom", "fix it")


def _bug(staged):
    raise ValueError("a bug")


@pytest.mark.parametrize("fail, raised, text", [
    pytest.param(_no_space, DiskFullError, "writing {shown}/m.c", id="full disk: named in the stage folder"),
    pytest.param(_tool_failed, ToolFailedError, "boom", id="edgedeploy error: raised as it is"),
    pytest.param(_bug, ValueError, "a bug", id="another error: raised as it is"),
])
def test_place_staged_removes_the_staging_folder_of_failed_work_and_places_nothing(tmp_path, fail, raised, text):
    """The end of every stage's writing, a run's stage or a firmware bundle: failed work places nothing, leaves
    no staging folder, and a full disk names the file where the user will look for it, not its staging name."""
    shown = tmp_path / "fw"
    staged = new_staging_dir(shown / "bundle", root=shown)
    placed = []
    with pytest.raises(raised) as info:
        place_staged(staged, shown, lambda: fail(staged), placed.append)
    assert text.format(shown=shown) in str(info.value) and str(staged) not in str(info.value)
    assert placed == [] and not staged.exists()


def test_place_staged_places_the_finished_work_and_returns_its_result(tmp_path):
    shown = tmp_path / "fw"
    staged = new_staging_dir(shown / "bundle", root=shown)
    placed = []
    assert place_staged(staged, shown, lambda: (staged / "m.c").write_text("1"), placed.append) == 1
    assert placed == [staged] and (staged / "m.c").read_text() == "1"


@pytest.mark.parametrize("lock, line", [
    pytest.param(lambda f: RunContext.open(f), "output folder {f} is a file. pass a folder path with -o/--out",
                 id="a run folder"),
    pytest.param(lambda f: lock_out_dir(f), "--out {f} is a file. pass a folder path for the firmware bundle",
                 id="a firmware bundle's folder"),
])
def test_an_output_folder_that_is_a_file_is_one_usage_line_and_left_as_it_is(tmp_path, lock, line):
    """Every stage's writing starts by locking its output folder (core/stage.py's lock_output), export's too."""
    from edgedeploy.errors import UsageError

    folder = tmp_path / "f"
    folder.write_text("x")
    with pytest.raises(UsageError) as err:
        lock(folder)
    assert err.value.one_line() == line.format(f=folder)
    assert folder.read_text() == "x" and sorted(p.name for p in tmp_path.iterdir()) == ["f"]
