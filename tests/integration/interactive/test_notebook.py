"""The example notebook, executed by a real Jupyter kernel (nbclient + ipykernel), and the Python API's objects."""

from __future__ import annotations

import inspect
import time
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

REPO = Path(__file__).resolve().parents[3]
NOTEBOOK = REPO / "examples" / "notebook.ipynb"
LIMIT_S = 120


def test_the_example_notebook_runs_in_a_kernel_and_shows_the_report(tmp_path, monkeypatch):
    nb = nbformat.read(NOTEBOOK, as_version=4)
    assert not any(c.get("outputs") for c in nb.cells if c.cell_type == "code"), "store the notebook without outputs"
    monkeypatch.setenv("EDGEDEPLOY_OUT", str(tmp_path / "out"))
    # the kernel is stopped at once when the last cell has run: a graceful shutdown idles seconds waiting for it
    client = NotebookClient(nb, timeout=LIMIT_S, kernel_name="python3", shutdown_kernel="immediate",
                            resources={"metadata": {"path": str(NOTEBOOK.parent)}})
    t0 = time.perf_counter()
    client.execute()
    seconds = time.perf_counter() - t0
    print(f"notebook executed in {seconds:.1f} s")
    assert seconds <= LIMIT_S
    outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs]
    assert not [o for o in outputs if o.output_type == "error"]
    html = [o.data["text/html"] for o in outputs if o.output_type in ("execute_result", "display_data")
            and "text/html" in o.get("data", {})]
    report = next(h for h in html if "edgedeploy-report" in h)
    assert "<table>" in report and "Int8 acc (%)" in report and "qat" in report
    assert "<img alt='Accuracy vs latency, per target' src='data:image/png;base64," in report
    frame = next(h for h in html if "dataframe" in h)
    assert "int8_accuracy_pct" in frame and "ethos-u85-256" in frame
    # the qat leaf trained with a progress bar drawn as a Jupyter widget
    assert any("application/vnd.jupyter.widget-view+json" in o.get("data", {}) for o in outputs)
    assert (tmp_path / "out" / "manifest.json").is_file()


def test_help_shows_the_typed_parameters_and_importing_the_package_stays_light():
    import subprocess
    import sys

    code = ("import sys, pydoc, edgedeploy; text = pydoc.render_doc(edgedeploy.optimize, renderer=pydoc.plaintext); "
            "assert \"model: 'str | os.PathLike[str] | tf_keras.Model | keras.Model'\" in text, text; "
            "assert \"calibration: 'Callable[[], Iterable[Any]] | Iterable[Any] | None' = None\" in text; "
            "assert 'Returns:' in text; "
            "from edgedeploy.pipeline.runners import open_runner; "
            "assert callable(edgedeploy.optimize) and not isinstance(edgedeploy.optimize, type(sys)); "
            "assert 'tensorflow' not in sys.modules and 'pandas' not in sys.modules")
    subprocess.run([sys.executable, "-c", code], check=True)
    from edgedeploy import api
    from edgedeploy.interactive.optimize_run import OptimizeRun

    for name in ("compile", "report", "export"):
        sig = inspect.signature(getattr(OptimizeRun, name))
        assert all(p.annotation is not inspect.Parameter.empty for p in sig.parameters.values() if p.name != "self")
        assert getattr(OptimizeRun, name).__doc__
    # the API's optimize takes what edgedeploy.optimize takes, its recipe keys as one `settings` mapping
    face = inspect.signature(__import__("edgedeploy").optimize).parameters
    typed = inspect.signature(api.optimize).parameters
    assert set(face) == set(typed) and face["settings"].kind is inspect.Parameter.VAR_KEYWORD
    assert typed["settings"].kind is inspect.Parameter.KEYWORD_ONLY
    assert all(typed[n].default == face[n].default for n in face if n != "settings")


@pytest.fixture(scope="module")
def small_run(tmp_path_factory):
    """A tf.data pipeline (batched) and a Keras 3 model object through the API, compiled for one target."""
    import numpy as np

    import edgedeploy
    from edgedeploy.keras import tfenv

    tf = tfenv.load().tf
    import keras  # Keras 3: its model is saved and rebuilt in tf_keras

    rng = np.random.default_rng(5)
    x = rng.normal(size=(96, 6, 6, 2)).astype("float32")
    y = (x.mean(axis=(1, 2, 3)) > 0).astype("int64")
    keras.utils.set_random_seed(5)
    model = keras.Sequential([keras.Input((6, 6, 2)), keras.layers.Conv2D(4, 3, activation="relu"),
                              keras.layers.Flatten(), keras.layers.Dense(2, activation="softmax")])
    data = tf.data.Dataset.from_tensor_slices((x, y)).batch(16)
    out = tmp_path_factory.mktemp("api") / "run"
    run = edgedeploy.optimize(model, data, out, leaves=["ptq"], labels=["low", "high"])
    run.compile("ethos-u55-128")
    return run, x, y


def test_a_batched_dataset_and_a_keras3_model_give_a_report_that_converts_to_pandas(small_run):
    import json

    run, x, y = small_run
    manifest = json.loads((run.run_dir / "manifest.json").read_text())
    source = manifest["info"]["optimize"]["data_source"]
    assert source["source"] == "tf.data" and source["n_fine_tune"] + source["n_evaluation"] == len(x)
    assert source["labels"] == ["low", "high"] and "stratified" in source["split_from"]
    report = run.report(max_flash="1MiB")
    frame = report.to_pandas()
    assert list(frame["leaf"]) == ["ptq"] and list(frame["target"]) == ["ethos-u55-128"]
    assert frame.loc[0, "compiled_model_bytes"] == report.doc["rows"][0]["values"]["compiled_model_bytes"]["value"]
    assert frame.attrs["units"]["latency_ms"] == "ms"
    html = report._repr_html_()
    assert html.startswith("<div class='edgedeploy-report'>") and "<body" not in html and "<html" not in html
    assert ".edgedeploy-report table {" in html
    bundle = run.export("ptq", "ethos-u55-128", run.run_dir.parent / "fw", golden=2)
    assert any(f.endswith(".npz") for f in bundle.files) and (bundle.out / "manifest.json").is_file()


def test_an_endless_dataset_is_refused(tmp_path):
    import numpy as np

    import edgedeploy
    from edgedeploy.keras import tfenv
    from edgedeploy.errors import InvalidInputError

    tf, keras = tfenv.load().tf, tfenv.load().keras
    model = keras.Sequential([keras.layers.Input((3,)), keras.layers.Dense(2, activation="softmax")])
    data = tf.data.Dataset.from_tensor_slices((np.zeros((4, 3), "float32"), np.array([0, 1, 0, 1]))).repeat()
    with pytest.raises(InvalidInputError, match="repeats forever"):
        edgedeploy.optimize(model, data, tmp_path / "out", leaves=["ptq"])


def test_a_python_preprocessing_function_and_a_calibration_generator_reach_every_stage(tmp_path):
    """Raw arrays through a function given in Python; the calibration generator's samples go through it too, and
    the same happens for a data file given by path with a calibration generator."""
    import json

    import numpy as np

    import edgedeploy
    from edgedeploy.keras import tfenv

    keras = tfenv.load().keras
    rng = np.random.default_rng(9)
    raw = rng.normal(size=(60, 8)).astype("float32")
    y = (raw[:, 0] > 0).astype("int64")

    def features(sample):
        return np.abs(sample[:4]) * 2.0

    def representative_dataset():
        for row in raw[:5]:
            yield [row[None]]

    model = keras.Sequential([keras.layers.Input((4,)), keras.layers.Dense(2, activation="softmax")])
    run = edgedeploy.optimize(model, (raw, y), tmp_path / "arrays", leaves=["ptq"], preprocess=features,
                              calibration=representative_dataset)
    with np.load(run.run_dir / "inputs" / "data.npz") as d:
        assert np.array_equal(d["x"], np.stack([features(r) for r in raw]))
        assert np.array_equal(d["x_calibration"], np.stack([features(r) for r in raw[:5]]))
    assert "5 given calibration samples" in run.leaves["ptq"].details["calibration"]
    rerun = edgedeploy.optimize(model, (raw, y), tmp_path / "arrays", leaves=["ptq"], preprocess=features,
                                calibration=representative_dataset)
    assert rerun.leaves["ptq"].started == run.leaves["ptq"].started  # same model and samples: the stage is reused
    source = json.loads((run.run_dir / "manifest.json").read_text())["info"]["optimize"]["data_source"]
    assert source["preprocess"]["ref"].endswith(":test_a_python_preprocessing_function_and_a_calibration_generator_"
                                                "reach_every_stage.<locals>.features")

    npz = tmp_path / "d.npz"
    np.savez(npz, x=raw, y=y, split=(np.arange(60) % 5 == 0).astype("int8"))
    again = edgedeploy.optimize(model, npz, tmp_path / "file", leaves=["ptq"], preprocess=features,
                                calibration=representative_dataset)
    with np.load(again.run_dir / "inputs" / "data.npz") as d:
        assert np.array_equal(d["x"], np.stack([features(r) for r in raw]))
        assert np.array_equal(d["split"], (np.arange(60) % 5 == 0).astype("int8"))
        assert np.array_equal(d["x_calibration"], np.stack([features(r) for r in raw[:5]]))
