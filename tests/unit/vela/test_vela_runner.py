"""The Vela runner's check and parse steps, on Vela's recorded files and logs (no Vela run: see
tests/integration/vela/test_vela_runner.py for runs in real workers)."""

from __future__ import annotations

import errno
import shutil
from concurrent.futures import Future
from concurrent.futures.process import BrokenProcessPool
from pathlib import Path

import pytest

from edgedeploy.config.targets import get_target
from edgedeploy.errors import DiskFullError, ToolFailedError
from edgedeploy.vela.outputs import build_vela_args, parse_summary_csv, summary_metrics
from edgedeploy.vela.runner import DEBUG_DB_FLAG, NEEDED, VelaRequest, VelaRun, check, finish, read_outputs, wait
from edgedeploy.vela.worker import VelaJobResult

PALETTE = Path(__file__).resolve().parents[2] / "data" / "palette"
REPO = Path(__file__).resolve().parents[3]
DSCNN = REPO / "examples" / "kws" / "dscnn_mlperf_int8.tflite"
U55 = get_target("ethos-u55-128")

# recorded file -> the name Vela gives it for a model named model_int8.tflite
RECORDED = {
    "dscnn_u55_128_summary.csv": "model_int8_summary_Ethos_U55_High_End_Embedded.csv",
    "dscnn_u55_128_debug.xml": "model_int8_debug.xml",
    "dscnn_u55_128_vela.tflite": "model_int8_vela.tflite",
    "dscnn_u55_128_stdout.txt": "vela.log",
}


def _folder(tmp_path: Path, leave_out: tuple[str, ...] = ()) -> VelaRequest:
    """A request whose output folder holds Vela's recorded output of the DS-CNN on ethos-u55-128."""
    model = tmp_path / "model_int8.tflite"
    shutil.copyfile(DSCNN, model)
    out = tmp_path / "out"
    out.mkdir()
    for src, dst in RECORDED.items():
        if dst not in leave_out:
            shutil.copyfile(PALETTE / src, out / dst)
    return VelaRequest(model, U55, out, "Performance", (DEBUG_DB_FLAG,))


def _run(request: VelaRequest, outcome: VelaJobResult | BaseException) -> VelaRun:
    job: Future = Future()
    job.set_exception(outcome) if isinstance(outcome, BaseException) else job.set_result(outcome)
    return VelaRun(request, request.args, job)


def test_request_builds_the_arguments_every_caller_gave(tmp_path):
    request = VelaRequest(Path("m.tflite"), U55, tmp_path, "Size", (DEBUG_DB_FLAG,))
    assert request.args == build_vela_args(Path("m.tflite"), U55, tmp_path, "Size", (DEBUG_DB_FLAG,))
    assert request.log_path == tmp_path / "vela.log"


def test_finish_parses_every_output_into_one_result(tmp_path):
    request = _folder(tmp_path)
    result = finish(_run(request, VelaJobResult(0, 1.5)), need=NEEDED | {"debug_db"})
    summary = parse_summary_csv((PALETTE / "dscnn_u55_128_summary.csv").read_text())
    assert result.summary == summary
    assert result.metrics == summary_metrics(summary, U55, [])
    assert sorted(result.files) == ["debug_db", "summary_csv", "vela_model"]
    assert result.debug_tables is not None and {"perf", "perf_debug", "source"} <= set(result.debug_tables)
    assert result.operator_counts == {"cpu": 0, "npu": 39} and result.cpu_operators == []
    assert result.seconds == 1.5 and result.args == request.args and result.log_path == request.log_path


@pytest.mark.parametrize("leave_out,need,missing", [
    ("model_int8_summary_Ethos_U55_High_End_Embedded.csv", NEEDED, "summary_csv"),
    ("model_int8_vela.tflite", NEEDED, "vela_model"),
    ("model_int8_debug.xml", NEEDED | {"debug_db"}, "debug_db"),
    ("", NEEDED | {"per_layer_csv"}, "per_layer_csv"),
])
def test_an_output_that_is_needed_and_missing_is_a_tool_failure(tmp_path, leave_out, need, missing):
    request = _folder(tmp_path, (leave_out,))
    with pytest.raises(ToolFailedError) as err:
        read_outputs(request, need=need, shown="the user's model.tflite")
    assert f"Vela wrote no {missing} for the user's model.tflite on ethos-u55-128" in err.value.message


@pytest.mark.parametrize("log,error,raised,words", [
    pytest.param("Reading model\nedgedeploy: Vela raised OSError: [Errno 28] No space left on device\n", None,
                 DiskFullError, ["no space left on the device writing", "the model is not at fault"],
                 id="full disk in the log"),
    pytest.param("Reading model\n", "OSError: [Errno 122] Disk quota exceeded", DiskFullError,
                 ["writing", "Vela's output for m.tflite on ethos-u55-128"], id="full quota in the error"),
    pytest.param("one\ntwo\nthree\nError: the accelerator ran out of SRAM\n", "VelaError: SRAM", ToolFailedError,
                 ["Vela failed on m.tflite for target ethos-u55-128 (exit 1): two | three | Error: the "
                  "accelerator ran out of SRAM"], id="Vela's own error: its last three lines"),
])
def test_a_failed_run_says_why(tmp_path, log, error, raised, words):
    request = VelaRequest(tmp_path / "m.tflite", U55, tmp_path / "out")
    request.output_dir.mkdir()
    request.log_path.write_text(log)
    with pytest.raises(raised) as err:
        finish(_run(request, VelaJobResult(1, 0.1, error)), shown="m.tflite", written=tmp_path / "final")
    line = err.value.one_line()
    assert all(w in line for w in words), line
    if raised is DiskFullError:
        assert str(tmp_path / "final") in line and "Vela failed" not in line


def test_a_failure_hint_is_the_callers_else_the_targets_settings(tmp_path):
    request = VelaRequest(tmp_path / "m.tflite", U55, tmp_path)
    request.log_path.write_text("Error: bad\n")
    with pytest.raises(ToolFailedError) as err:
        check(request, VelaJobResult(2, 0.1))
    assert str(U55.vela_ini_path()) in err.value.hint and "(exit 2)" in err.value.message
    with pytest.raises(ToolFailedError) as err:
        check(request, VelaJobResult(2, 0.1), fix="read the log")
    assert err.value.hint == "read the log"
    assert check(request, VelaJobResult(0, 0.1)) is None


def test_a_worker_that_died_or_a_full_disk_under_the_log_is_named(tmp_path):
    request = VelaRequest(tmp_path / "m.tflite", U55, tmp_path)
    with pytest.raises(ToolFailedError) as err:
        wait(_run(request, BrokenProcessPool("gone")), shown="user.tflite", died_fix="others went on")
    assert "Vela's worker process died compiling user.tflite for target ethos-u55-128" in err.value.message
    assert err.value.hint == "others went on"
    with pytest.raises(DiskFullError) as full:
        wait(_run(request, OSError(errno.ENOSPC, "No space left on device")))
    assert str(tmp_path) in full.value.message
    with pytest.raises(PermissionError):  # any other OSError is not the runner's to explain
        wait(_run(request, PermissionError(errno.EACCES, "denied")))
