"""Property-based tests: every parser of outside input, fed mutated real inputs, gives an EdgeDeployError or a
result, never another exception (Hypothesis; the examples are seeded by Hypothesis' own database-free runs)."""

from __future__ import annotations

import io
import tempfile
import zipfile
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from helpers import examples

from edgedeploy.errors import EdgeDeployError

DATA = Path(__file__).resolve().parents[2] / "data"
REPO = Path(__file__).resolve().parents[3]
FAST = settings(max_examples=examples(60), deadline=None, derandomize=True, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


@st.composite
def mutated(draw, original: bytes, max_edits: int = 6) -> bytes:
    """``original`` with a few seeded edits: bytes flipped or set, a slice cut, bytes inserted, or a truncation."""
    data = bytearray(original)
    for _ in range(draw(st.integers(1, max_edits))):
        if not data:
            break
        kind = draw(st.sampled_from(["flip", "set", "cut", "insert", "truncate", "dup"]))
        i = draw(st.integers(0, len(data) - 1))
        if kind == "flip":
            data[i] ^= draw(st.integers(1, 255))
        elif kind == "set":
            data[i] = draw(st.sampled_from([0, 0xFF, 0x7F, 0x80, ord(","), ord('"'), ord("\n"), ord("9")]))
        elif kind == "cut":
            del data[i:i + draw(st.integers(1, 64))]
        elif kind == "insert":
            data[i:i] = draw(st.binary(min_size=1, max_size=16))
        elif kind == "dup":
            data[i:i] = data[i:i + draw(st.integers(1, 200))]
        else:
            del data[i:]
    return bytes(data)


def _text(data: bytes) -> str:
    return data.decode("utf-8", "replace")


# --------------------------------------------------------------------------- .tflite reader

TFLITE = (REPO / "examples" / "kws" / "dscnn_mlperf_int8.tflite").read_bytes()
VELA_TFLITE = (DATA / "palette" / "dscnn_u55_128_vela.tflite").read_bytes()


@FAST
@given(data=st.one_of(mutated(TFLITE, 8), mutated(VELA_TFLITE, 8)))
def test_tflite_reader_on_mutated_models(data):
    from edgedeploy.tflite.reader import check_int8_model, read_tflite, read_weight_tensors

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "m.tflite"
        path.write_bytes(data)
        try:
            model = read_tflite(path)
            model.float_compute_ops(), model.misbiased_operators(), model.has_ethos_u_op(), model.op_counts
            for t in read_weight_tensors(path):
                t.values()
            check_int8_model(str(path))
        except EdgeDeployError:
            pass


# --------------------------------------------------------------------------- Vela's CSVs, stdout and debug database

SUMMARY = (DATA / "vela" / "dscnn_u55_128_summary.csv").read_bytes()
PER_LAYER = (DATA / "vela" / "dscnn_u55_128_per-layer.csv").read_bytes()
STDOUT = (DATA / "vela" / "ds_cnn_s_arm_u85_256_stdout.txt").read_bytes()
DEBUG_DB = (DATA / "palette" / "dscnn_u55_128_debug.xml").read_bytes()


@FAST
@given(summary=mutated(SUMMARY), layers=mutated(PER_LAYER))
def test_vela_csv_parsers_on_mutated_files(summary, layers):
    from edgedeploy.config.targets import get_target
    from edgedeploy.vela.outputs import parse_per_layer_csv, parse_summary_csv, summary_metrics

    try:
        rows = parse_per_layer_csv(_text(layers))
        metrics = summary_metrics(parse_summary_csv(_text(summary)), get_target("ethos-u55-128"), rows)
        assert all(m.value is None or isinstance(m.value, (int, float, str)) for m in metrics.values())
    except EdgeDeployError:
        pass


@FAST
@given(stdout=mutated(STDOUT, 10))
def test_vela_stdout_parsers_on_mutated_output(stdout):
    from edgedeploy.vela.outputs import parse_cpu_operators, parse_operator_counts

    ops = parse_cpu_operators(_text(stdout))
    assert all(isinstance(o.name, str) for o in ops)
    assert all(isinstance(v, int) for v in parse_operator_counts(_text(stdout)).values())


@FAST
@given(xml=mutated(DEBUG_DB, 10))
def test_vela_debug_database_on_mutated_files(xml):
    from edgedeploy.vela.debugdb import parse_debug_db, summarize_layers, weight_layers

    try:
        summarize_layers(weight_layers(parse_debug_db(_text(xml))))
    except EdgeDeployError:
        pass


# --------------------------------------------------------------------------- FVP output

FVP_LOGS = [p.read_bytes() for p in sorted((DATA / "fvp").glob("*.txt"))]


@FAST
@given(st.sampled_from(range(len(FVP_LOGS))).flatmap(lambda i: mutated(FVP_LOGS[i], 10)))
def test_fvp_log_parser_on_mutated_logs(log):
    from edgedeploy.fvp.parse import parse_fvp_log

    parsed = parse_fvp_log(_text(log))
    assert isinstance(parsed.failures, list)


# --------------------------------------------------------------------------- TOML loaders

toml_scalars = st.one_of(st.booleans(), st.integers(-2**63, 2**63 - 1), st.floats(), st.text(max_size=12))
toml_values = st.recursive(toml_scalars, lambda inner: st.one_of(st.lists(inner, max_size=3),
                                                                 st.dictionaries(st.text(max_size=8), inner, max_size=3)),
                           max_leaves=8)
KEY_NAMES = st.sampled_from(["leaves", "sparsity", "clusters", "epochs", "stages", "layers", "palette", "training",
                             "selection", "pruning", "seed", "model", "data", "targets", "recipe", "compile", "out",
                             "trust_lambda", "requirements", "name", "kind", "npu", "vela", "clocks", "fvp", "memory"])


@FAST
@given(table=st.dictionaries(st.one_of(KEY_NAMES, st.text(max_size=8)), toml_values, max_size=5))
def test_recipe_loader_on_random_tables(table):
    from edgedeploy.config.recipe import Recipe, load_recipe

    try:
        assert isinstance(load_recipe(table=table), Recipe)
    except EdgeDeployError:
        pass


PROJECT = (REPO / "examples" / "kws_tree" / "edgedeploy.toml").read_bytes()
TARGET = (REPO / "targets" / "corstone-300-u55-128.toml").read_bytes()


@FAST
@given(project=mutated(PROJECT, 4), target=mutated(TARGET, 4))
def test_project_and_target_loaders_on_mutated_files(project, target):
    from edgedeploy.pipeline.project import load_project
    from edgedeploy.config.targets import load_target_file

    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "edgedeploy.toml").write_bytes(project)
        (Path(tmp) / "t.toml").write_bytes(target)
        for load, name in ((load_project, "edgedeploy.toml"), (load_target_file, "t.toml")):
            try:
                load(Path(tmp) / name)
            except EdgeDeployError:
                pass


# --------------------------------------------------------------------------- the .npz loader


def _npz_bytes() -> bytes:
    rng = np.random.default_rng(0)
    buf = io.BytesIO()
    np.savez(buf, x=rng.normal(size=(12, 4, 2)).astype(np.float32), y=rng.integers(0, 3, 12),
             split=np.array([0, 1] * 6), labels=np.array(["a", "b", "c"]))
    return buf.getvalue()


NPZ = _npz_bytes()
arrays = st.one_of(
    st.just(np.zeros((0,))), st.just(np.array(3)), st.just(np.array([np.nan, np.inf])),
    st.just(np.array(["a", "b"])), st.just(np.ones((12, 4, 2), dtype=np.complex64)),
    st.just(np.ones((12, 8), dtype=np.float32)), st.just(np.arange(12) - 5), st.just(np.full(12, 0.5)),
    st.just(np.ones((12, 4, 2), dtype=bool)), st.just(np.array([[0, 1, 2]] * 12)),
)


@FAST
@given(blob=mutated(NPZ, 6))
def test_npz_loader_on_mutated_files(blob):
    from edgedeploy.config.data import load_dataset

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "d.npz"
        path.write_bytes(blob)
        try:
            load_dataset(path, (4, 2), 3)
        except EdgeDeployError:
            pass


@FAST
@given(replace=st.dictionaries(st.sampled_from(["x", "y", "split", "labels", "x_train"]), arrays, min_size=1, max_size=3))
def test_npz_loader_on_odd_arrays(replace):
    from edgedeploy.config.data import load_dataset

    rng = np.random.default_rng(0)
    content = {"x": rng.normal(size=(12, 4, 2)).astype(np.float32), "y": rng.integers(0, 3, 12),
               "split": np.array([0, 1] * 6), **replace}
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "d.npz"
        np.savez(path, **content)
        try:
            d = load_dataset(path, (4, 2), 3)
            assert np.isfinite(d.x_fit).all() and np.isfinite(d.x_eval).all()
        except EdgeDeployError:
            pass


# --------------------------------------------------------------------------- run manifests (a run folder is input too)


def _manifest_bytes() -> bytes:
    from edgedeploy.core.manifest import Artifact, Manifest, Metric, StageRecord

    with tempfile.TemporaryDirectory() as tmp:
        m = Manifest(Path(tmp))
        m.record(StageRecord("compile/a/ethos-u55-128", "compile", "ok", "a", "ethos-u55-128",
                             outputs=[Artifact("vela_model", "compile/a/x.tflite", "0" * 64, 3)],
                             metrics={"sram_bytes": Metric(1024, "B", "estimated")}))
        return m.path.read_bytes()


MANIFEST = _manifest_bytes()


@FAST
@given(blob=mutated(MANIFEST, 6))
def test_manifest_loader_on_mutated_files(blob):
    from edgedeploy.core.manifest import Manifest

    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "manifest.json").write_bytes(blob)
        try:
            Manifest.load(Path(tmp))
        except EdgeDeployError:
            pass


# --------------------------------------------------------------------------- Keras model files (read without TensorFlow)

H5 = (REPO / "examples" / "kws_tree" / "dscnn_mlperf_float.h5").read_bytes()


@settings(max_examples=examples(30), deadline=None, derandomize=True, database=None,
          suppress_health_check=list(HealthCheck))
@given(blob=st.one_of(mutated(H5[:8192], 6).map(lambda head: head + H5[8192:]), mutated(H5, 3)))
def test_model_file_inspection_on_mutated_files(blob):
    from edgedeploy.keras.model import inspect_model_file

    with tempfile.TemporaryDirectory() as tmp:
        for name in ("m.h5", "m.keras"):
            path = Path(tmp) / name
            path.write_bytes(blob)
            try:
                inspect_model_file(path)
            except EdgeDeployError:
                pass
