"""HDF5 files (Keras .h5) whose declared dataset sizes the file cannot hold are refused before a dataset is read:
checked on files written with h5py, and through `edgedeploy report RUN -f html` on a run whose baseline .h5 was
replaced (its manifest hash updated to match)."""

from __future__ import annotations

import hashlib
import json
import shutil
import time
from pathlib import Path

import numpy as np
import pytest

from edgedeploy.errors import InvalidInputError
from edgedeploy.keras.hdf5 import check_datasets
from helpers import RECORDED_RUN, one_error_line, run_in_process

h5py = pytest.importorskip("h5py")


def _declared_only(f, name: str, shape) -> None:
    f.create_dataset(name, shape=shape, dtype="f4")  # storage allocated late: the file stays small


def _filtered(f, name: str, shape) -> None:
    f.create_dataset(name, shape=shape, dtype="f4", chunks=(1024, 1024), compression="gzip")


def _several(f, name: str, shape) -> None:
    for i in range(8):
        f.create_dataset(f"{name}_{i}", data=np.zeros(shape, np.float32))


def _external(f, name: str, shape) -> None:
    f.create_dataset(name, shape=shape, dtype="f4", external=[("/etc/hostname", 0, h5py.h5f.UNLIMITED)])


CASES = {
    "a 7.2 GB kernel never written": (_declared_only, (1_800_000, 1000),
                                      "dataset 'model_weights/dense/kernel:0' declares 1800000x1000 float32 "
                                      "(7,200,000,000 bytes), more than the file holds"),
    "a compressed kernel of 4.3 GB": (_filtered, (65536, 16384),
                                      "declares 65536x16384 float32 (4,294,967,296 bytes), more than the model "
                                      "limit allows (2,147,483,648 bytes)"),
    "data kept in another file": (_external, (4, 4), "keeps its data outside the file (external storage)"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_declared_sizes_are_checked_before_reading(tmp_path, case):
    make, shape, message = CASES[case]
    path = tmp_path / "model.h5"
    with h5py.File(path, "w") as f:
        make(f, "model_weights/dense/kernel:0", shape)
    t0 = time.perf_counter()
    with h5py.File(path, "r") as f, pytest.raises(InvalidInputError) as caught:
        check_datasets(f, f"model {path}", path.stat().st_size)
    assert caught.value.one_line().startswith(f"model {path}: ") and message in caught.value.one_line()
    assert time.perf_counter() - t0 < 2


def test_datasets_that_add_up_past_the_file_are_refused(tmp_path):
    path = tmp_path / "model.h5"
    with h5py.File(path, "w") as f:
        _several(f, "k", (256, 256))  # 8 kernels of 262,144 bytes
    with h5py.File(path, "r") as f:
        check_datasets(f, "model", path.stat().st_size)  # written in full: they fit
        with pytest.raises(InvalidInputError, match=r"the datasets up to 'k_3' declare 1,048,576 bytes, more than "
                                                    r"the file holds \(1,000,000 bytes\)"):
            check_datasets(f, "model", 1_000_000)


def test_a_real_keras_file_passes(tmp_path):
    path = tmp_path / "model.h5"
    with h5py.File(path, "w") as f:
        f.create_dataset("model_weights/conv2d/conv2d/kernel:0", data=np.ones((3, 3, 1, 8), np.float32))
        f.create_dataset("model_weights/conv2d/conv2d/bias:0", data=np.ones(8, np.float32))
    with h5py.File(path, "r") as f:
        check_datasets(f, "model", path.stat().st_size)


def test_report_refuses_a_replaced_baseline_before_reading_it(tmp_path):
    run = tmp_path / "run"
    shutil.copytree(RECORDED_RUN, run)
    base = run / "optimize" / "baseline" / "model.h5"
    base.parent.mkdir(parents=True)
    with h5py.File(base, "w") as f:
        _declared_only(f, "model_weights/dense/dense/kernel:0", (1_800_000, 1000))
    body = base.read_bytes()
    manifest = json.loads((run / "manifest.json").read_text())
    record = dict(manifest["stages"][0], id="optimize/baseline", stage="optimize", variant="baseline", inputs=[],
                  outputs=[{"role": "keras_model", "path": "optimize/baseline/model.h5",
                            "sha256": hashlib.sha256(body).hexdigest(), "bytes": len(body)}], params={},
                  metrics={}, details={})
    manifest["stages"].append(record)
    (run / "manifest.json").write_text(json.dumps(manifest))
    t0 = time.perf_counter()
    proc = run_in_process("report", run, "-f", "html", "-o", tmp_path / "page.html")
    assert proc.returncode == 3, proc.stderr
    assert one_error_line(proc) == (
        f"error: model {base}: dataset 'dense/dense/kernel:0' declares 1800000x1000 float32 (7,200,000,000 bytes), "
        f"more than the file holds ({len(body):,} bytes). the file is damaged or was replaced; save the model "
        "again (model.save)")
    assert not (tmp_path / "page.html").exists()
    assert time.perf_counter() - t0 < 60


def test_a_model_file_is_checked_before_tensorflow_reads_it(tmp_path):
    from edgedeploy.keras.model import inspect_model_file

    path = tmp_path / "model.h5"
    with h5py.File(path, "w") as f:
        f.attrs["model_config"] = json.dumps({"class_name": "Sequential", "config": {"layers": []}})
        _declared_only(f, "model_weights/dense/dense/kernel:0", (1_800_000, 1000))
    with pytest.raises(InvalidInputError, match=r"dataset 'model_weights/dense/dense/kernel:0' declares 1800000x1000 "
                                                r"float32 \(7,200,000,000 bytes\), more than the file holds"):
        inspect_model_file(path)


def _keras_archive(path: Path, weights: Path | None, extra: dict[str, bytes] | None = None,
                   compression: int = 8) -> Path:
    """A .keras archive as Keras writes one (config.json, metadata.json, model.weights.h5), around ``weights``."""
    import zipfile

    with zipfile.ZipFile(path, "w", compression=compression) as z:
        z.writestr("metadata.json", json.dumps({"keras_version": "3.10.0"}))
        z.writestr("config.json", json.dumps({"class_name": "Sequential", "config": {"layers": []}}))
        if weights is not None:
            z.write(weights, "model.weights.h5")
        for name, body in (extra or {}).items():
            z.writestr(name, body)
    return path


def _weights(tmp_path: Path, make, shape) -> Path:
    path = tmp_path / "w.h5"
    with h5py.File(path, "w") as f:
        make(f, "layers/dense/vars/0", shape)
    return path


KERAS_CASES = {  # (weights: make, shape; other members; the model limit, or None; words of the one line)
    "weights declaring a 7.2 GB kernel": (
        (_declared_only, (1_800_000, 1000)), None, None,
        "(its model.weights.h5): dataset 'layers/dense/vars/0' declares 1800000x1000 float32 (7,200,000,000 bytes), "
        "more than the file holds"),
    "weights keeping their data in another file": (
        (_external, (4, 4)), None, None, "(its model.weights.h5): dataset 'layers/dense/vars/0' keeps its data "
                                         "outside the file (external storage)"),
    "a member unpacking past the model limit": (
        None, {"assets/blob": bytes(300_000)}, 200_000,
        "its member 'assets/blob' unpacks to 300,000 bytes, over the limit of 200,000"),
    "members unpacking past the model limit together": (
        None, {"assets/a": bytes(120_000), "assets/b": bytes(120_000)}, 200_000,
        "its members up to 'assets/b' unpack to 240,"),
}


@pytest.mark.parametrize("case", list(KERAS_CASES))
def test_a_keras_archive_is_checked_before_its_weights_are_read(tmp_path, monkeypatch, case):
    from edgedeploy.core import files
    from edgedeploy.keras.model import inspect_model_file

    weights, extra, limit, words = KERAS_CASES[case]
    if limit is not None:
        monkeypatch.setitem(files.LIMITS, "model", limit)
    path = _keras_archive(tmp_path / "m.keras", weights and _weights(tmp_path, *weights), extra)
    assert path.stat().st_size < 100_000  # what it declares, not what it holds
    t0 = time.perf_counter()
    with pytest.raises(InvalidInputError) as caught:
        inspect_model_file(path)
    line = caught.value.one_line()
    assert line.startswith(f"model {path}" if weights else f"{path}: ") and words in line, line
    assert time.perf_counter() - t0 < 2


def test_a_keras_archive_with_sound_weights_passes(tmp_path):
    from edgedeploy.keras.model import inspect_model_file

    weights = tmp_path / "w.h5"
    with h5py.File(weights, "w") as f:
        f.create_dataset("layers/dense/vars/0", data=np.ones((3, 2), np.float32))
    for compression in (0, 8):  # stored and deflated, as either Keras writes them
        path = _keras_archive(tmp_path / f"m{compression}.keras", weights, compression=compression)
        assert inspect_model_file(path).keras_version == "3.10.0"


def test_optimize_refuses_a_keras_file_whose_weights_declare_more_than_it_holds(tmp_path):
    path = _keras_archive(tmp_path / "m.keras", _weights(tmp_path, _declared_only, (1_800_000, 1000)))
    data = tmp_path / "d.npz"
    np.savez(data, x=np.zeros((8, 3), np.float32), y=np.arange(8) % 2, split=np.arange(8) % 2)
    proc = run_in_process("optimize", path, "--data", data, "-o", tmp_path / "out")
    assert proc.returncode == 3, proc.stderr
    assert one_error_line(proc).startswith(f"error: model {path} (its model.weights.h5): dataset 'layers/dense/vars/0' "
                                           "declares 1800000x1000 float32 (7,200,000,000 bytes)")
    assert not (tmp_path / "out").exists()


def test_the_reports_kernel_plot_reads_a_keras_archive_through_the_same_check(tmp_path):
    from edgedeploy.report.plot_inputs import keras_kernels

    weights = tmp_path / "w.h5"
    with h5py.File(weights, "w") as f:
        f.create_dataset("layers/dense/vars/0", data=np.ones((3, 2), np.float32))
    kernels = keras_kernels(_keras_archive(tmp_path / "ok.keras", weights))
    assert list(kernels) == ["layers/dense/vars/0"] and kernels["layers/dense/vars/0"].shape == (3, 2)
    bad = _keras_archive(tmp_path / "bad.keras", _weights(tmp_path, _declared_only, (1_800_000, 1000)))
    with pytest.raises(InvalidInputError, match=r"\(its model.weights.h5\): dataset 'layers/dense/vars/0' declares"):
        keras_kernels(bad)
