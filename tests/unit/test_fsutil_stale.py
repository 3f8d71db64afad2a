"""What a killed command left in a run folder is removed by the next command, in folders edgedeploy wrote only."""

from __future__ import annotations

from edgedeploy.fsutil import LOCK_NAME, lock_run_dir, release_run_dirs


def _leftovers(run):
    stale = run / "import" / ".dscnn.ab12cd34.part"
    stale.mkdir(parents=True)
    (stale / "model_int8.tflite").write_bytes(b"half")
    return stale


def test_a_folder_killed_before_its_first_stage_was_recorded_is_cleaned(tmp_path):
    run = tmp_path / "run"
    stale = _leftovers(run)
    (run / LOCK_NAME).write_text("")  # the earlier command's lock file, and no manifest yet
    try:
        lock_run_dir(run)
    finally:
        release_run_dirs()
    assert not stale.exists() and (run / "import").is_dir()


def test_a_folder_no_edgedeploy_command_wrote_is_left_alone(tmp_path):
    run = tmp_path / "mine"
    stale = _leftovers(run)
    try:
        lock_run_dir(run)
    finally:
        release_run_dirs()
    assert stale.is_dir()
