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
from helpers import RECORDED_RUN, one_error_line, run_cli

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
    proc = run_cli("report", run, "-f", "html", "-o", tmp_path / "page.html", timeout=120)
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
