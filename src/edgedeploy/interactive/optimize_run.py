"""The Python API for notebooks and scripts: :func:`optimize` returns an :class:`OptimizeRun`.

    import edgedeploy
    run = edgedeploy.optimize(model, (x, y), "out", leaves=["ptq", "pcqat"], epochs=2)
    run.compile(["ethos-u55-128"])
    run.report()                      # shown inline in Jupyter; .to_pandas() for a DataFrame
    run.export("pcqat", "ethos-u55-128", "fw", golden=8)

Everything lands in a run folder, as with the command line: ``edgedeploy report OUT`` reads the same folder.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterable, Mapping, Sequence

import numpy as np

from ..errors import UsageError
from .arguments import as_count, as_names, as_path, as_text, check_data_arguments, target_names
from edgedeploy.config import DEFAULT_RUN_DIR
from edgedeploy.core.nospace import ensure_room
from edgedeploy.keras.saving import saved_bytes_bound

if TYPE_CHECKING:
    import keras
    import tensorflow as tf
    import tf_keras

    from edgedeploy.config.recipe import Recipe
    from edgedeploy.pipeline.compile import CompileOutcome
    from ..export.bundle_stage import ExportResult
    from edgedeploy.core.manifest import StageRecord
    from .report_view import Report

MODEL_FILE = Path("inputs") / "model"


def _keras_flavour(model: Any) -> str | None:
    """``tf_keras`` or ``keras`` (3) for a model object, None for anything else."""
    for cls in type(model).__mro__:
        top = cls.__module__.split(".", 1)[0]
        if cls.__name__ in ("Model", "Functional", "Sequential") and top in ("tf_keras", "keras"):
            return top
    return None


def save_model_object(model: Any, out: Path) -> Path:
    """A model object saved into the run folder, written to a temporary name first: a tf_keras model as
    ``inputs/model.h5`` (the same model gives the same bytes, so a re-run reuses its stages), a Keras 3 model as
    ``inputs/model.keras``."""
    flavour = _keras_flavour(model)
    if flavour is None:
        raise UsageError(f"model is a {type(model).__name__}, not a Keras model or a path",
                         "pass a tf_keras or Keras 3 model, or the path of a .h5 or .keras file")
    suffix = ".h5" if flavour == "tf_keras" else ".keras"
    final = Path(out) / MODEL_FILE.with_suffix(suffix)
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = final.with_name(f".{final.stem}.{os.getpid()}.tmp{suffix}")
    try:
        ensure_room(final, saved_bytes_bound(model))  # HDF5 can crash on a full disk
        model.save(tmp)
        os.replace(tmp, final)
    finally:
        tmp.unlink(missing_ok=True)
    return final


def _input_shape(model: Any, model_path: Path, trust_lambda: bool) -> tuple[Any, ...]:
    if _keras_flavour(model) is not None:
        return tuple(model.input_shape[1:])
    from edgedeploy.keras.model import load_model

    loaded, _ = load_model(model_path, trust_lambda)
    return tuple(loaded.input_shape[1:])


@dataclass
class OptimizeRun:
    """One run folder of the deployment tree: its leaves, and what can be done with them next."""

    run_dir: Path
    leaves: dict[str, "StageRecord"] = field(default_factory=dict, repr=False)  # leaf -> its convert record
    compiled: list[str] = field(default_factory=list)  # targets compiled so far
    nodes: dict[str, "StageRecord"] = field(default_factory=dict, repr=False)  # trained node -> its record

    def __post_init__(self) -> None:
        self.run_dir = as_path(self.run_dir, "run_dir", "a run folder")

    def __repr__(self) -> str:
        return f"OptimizeRun({str(self.run_dir)!r}, leaves={list(self.leaves)}, compiled={self.compiled})"

    def compile(self, targets: str | Sequence[str], *, jobs: int | None = None) -> "CompileOutcome":
        """Compile every leaf with Vela for ``targets`` (names such as ``ethos-u55-128`` or target files), into
        the run folder; ``jobs`` Vela worker processes (default: one per core)."""
        from edgedeploy.pipeline.compile import CompileOptions, compile_run

        names = target_names(targets)
        options = CompileOptions() if jobs is None else CompileOptions(jobs=as_count(jobs, "jobs", "a whole number"))
        outcome = compile_run(self.run_dir, names, options)
        self.compiled += [t for t in names if t not in self.compiled]
        return outcome

    def report(self, *, max_accuracy_drop: float | None = None, max_flash: str | int | None = None,
               max_sram: str | int | None = None, max_latency_ms: float | None = None,
               max_npu_cycles: int | None = None, max_metric_drop: float | None = None) -> "Report":
        """The report of the run folder, judged by the requirements given (sizes as bytes or text: ``"64KiB"``)."""
        from ..report import build_report
        from edgedeploy.report.judge import requirements_from_options
        from .report_view import Report

        req = requirements_from_options(max_accuracy_drop=max_accuracy_drop, max_metric_drop=max_metric_drop,
                                        max_flash=max_flash, max_sram=max_sram, max_latency_ms=max_latency_ms,
                                        max_npu_cycles=max_npu_cycles)
        return Report(build_report(self.run_dir, req, html=True))

    def export(self, leaf: str, target: str, out: str | os.PathLike[str], *, golden: int | None = None,
               name: str | None = None, force: bool = False) -> "ExportResult":
        """The firmware bundle of ``leaf`` compiled for ``target``: C source and header, CMake entry point and
        ``golden`` golden vectors from the evaluation split (default 8 when the run has data)."""
        from ..export import ExportOptions, export_bundle

        leaf = as_text(leaf, "leaf", "a leaf name", '"ptq"')
        target = as_text(target, "target", "a target name or file", '"ethos-u55-128"')
        if golden is not None:
            golden = as_count(golden, "golden", "a number of golden cases")
        return export_bundle(self.run_dir, ExportOptions(out=as_path(out, "out", "a folder"), target=target,
                                                         leaf=leaf, golden=golden, name=name, force=force))

    def _repr_html_(self) -> str:
        import html

        def acc(rec: "StageRecord") -> str:
            value = rec.metric("int8_accuracy")
            return "–" if value is None else f"{value:.2f}"

        rows = "".join(f"<tr><td>{html.escape(leaf)}</td><td>{acc(rec)}</td></tr>" for leaf, rec in self.leaves.items())
        return (f"<p>edgedeploy run <code>{html.escape(str(self.run_dir))}</code></p><table><thead><tr><th>Leaf</th>"
                f"<th>Int8 accuracy (%)</th></tr></thead><tbody>{rows}</tbody></table>")


def optimize(
    model: str | os.PathLike[str] | tf_keras.Model | keras.Model,
    data: str | os.PathLike[str] | tuple[Any, Any] | Mapping[str, np.ndarray] | tf.data.Dataset,
    out: str | os.PathLike[str] = DEFAULT_RUN_DIR,
    *,
    leaves: Sequence[str] | None = None,
    recipe: str | os.PathLike[str] | Mapping[str, Any] | Recipe | None = None,
    preprocess: str | Callable[[np.ndarray], Any] | None = None,
    calibration: Callable[[], Iterable[Any]] | Iterable[Any] | None = None,
    labels: Sequence[str] | None = None,
    batched: bool | None = None,
    trust_lambda: bool = False,
    executor: str = "local",
    ray_address: str | None = None,
    **settings: Any,
) -> OptimizeRun:
    """Run the deployment tree on ``model`` and ``data`` into the run folder ``out``; convert every leaf to int8 and
    score it on the evaluation split. Imports TensorFlow when called.

    Args:
        model: a ``.h5`` or ``.keras`` file, or a tf_keras or Keras 3 model object (saved into ``out/inputs/``;
            a Keras 3 model is rebuilt in tf_keras, as its file would be).
        data: an ``.npz`` file or a folder with one subfolder of images or WAV files per class; or ``(x, y)``
            arrays (a seeded stratified choice of ``data.eval_fraction`` of each class evaluates), ``((x_train,
            y_train), (x_test, y_test))``, a dict with an ``.npz`` layout's arrays, or a ``tf.data.Dataset`` of
            ``(x, y)`` (batched or not), or a pair of datasets (fine-tune, evaluation). A dataset is read up to
            ``data.max_samples``: one of unknown length stops there (the manifest says so), a longer one of known
            length is refused, and one that repeats forever is refused.
        out: the run folder (manifest and outputs; ``edgedeploy report OUT`` reads it too).
        leaves: the leaves to convert, e.g. ``["ptq", "pcqat"]`` (default: the recipe's).
        recipe: a recipe TOML file, or its table as a dict (``{"epochs": 2, "data": {"sample_rate": 8000}}``), or
            a loaded :class:`~edgedeploy.config.recipe.Recipe` (then without ``leaves`` and ``settings``).
        preprocess: a function run on every sample before fine-tuning, calibration, evaluation and golden
            vectors (an MFCC front end, say), or its ``module:function`` name.
        calibration: int8 calibration samples apart from the fine-tune split: a ``representative_dataset``-style
            function (each item ``[x]``) or an iterable of inputs, read up to the recipe's ``data.max_samples``
            (the manifest says how many were read, and when it had more); a seeded random choice of
            ``calibration_samples`` of them calibrates.
        labels: class names in index order (in-memory data; a folder's come from its subfolders).
        batched: whether a ``tf.data.Dataset`` yields batches (default: its inputs have one more axis than the
            model's input).
        trust_lambda: load a model file with Lambda layers (runs their code).
        executor: where each stage runs: ``local`` (this process, or ``jobs`` worker processes) or ``ray``.
        ray_address: the Ray cluster to join (default: ``RAY_ADDRESS``, else a local Ray).
        **settings: recipe keys by name, e.g. ``epochs=2``, ``sparsity=0.5``, ``seed=1``, ``jobs=2``.

    Returns:
        An :class:`OptimizeRun`: ``.compile(targets)``, ``.report()``, ``.export(leaf, target, out)``.
    """
    from ..data_sources import Samples
    from edgedeploy.keras import tfenv
    from edgedeploy.pipeline.compile import CompileOptions, check_executor
    from edgedeploy.pipeline.driver import drive
    from edgedeploy.pipeline.run_plan import Plan

    if _keras_flavour(model) is None:  # (checked before TensorFlow is imported)
        as_path(model, "model", "a Keras model or the path of a .h5 or .keras file",
                "pass a tf_keras or Keras 3 model, or the path of its .h5 or .keras file")
    check_data_arguments(data, calibration, preprocess, labels, batched)
    out = as_path(out, "out", "a folder")
    check_executor(executor)
    r = _recipe(recipe, leaves, preprocess, settings)
    in_place = isinstance(data, (str, os.PathLike)) and calibration is None and not callable(preprocess)
    if _keras_flavour(model) is not None or not in_place:
        tfenv.load()  # before any model object's Keras is used here (model files load it when they are read)
    model_path = save_model_object(model, out) if _keras_flavour(model) is not None else Path(model)
    source: Path | Samples
    if in_place:
        assert isinstance(data, (str, os.PathLike))  # (what in_place says)
        source = Path(data)
    else:
        source = _in_memory(data, model, model_path, r, calibration, labels, batched, preprocess, trust_lambda)
    plan = Plan(model_path, source, out, r, options=CompileOptions(executor=executor, ray_address=ray_address),
                trust_lambda=trust_lambda)
    done = drive(plan).tree
    assert done is not None  # (a run that is not a walk returns its tree)
    return OptimizeRun(done.run_dir, dict(done.leaves), nodes=dict(done.nodes))


def _recipe(recipe: Any, leaves: Sequence[str] | None, preprocess: Any, settings: Mapping[str, Any]) -> Any:
    """The run's recipe: a loaded one as it is, else the file or table with ``leaves``, a named ``preprocess``
    and ``settings`` over it."""
    from edgedeploy.config.recipe import Recipe, load_recipe

    if isinstance(recipe, Recipe):
        if settings or leaves is not None or isinstance(preprocess, str):
            raise UsageError("a loaded Recipe is given with settings beside it",
                             "set them in the recipe, or pass the recipe's file or table instead")
        return recipe
    if recipe is not None and not isinstance(recipe, Mapping):
        as_path(recipe, "recipe", "a recipe .toml file or its table as a dict")
    overrides = {**settings, "leaves": as_names(leaves, "leaves", '["ptq"]') if leaves is not None else None}
    if isinstance(preprocess, str):
        overrides["preprocess"] = preprocess
    return load_recipe(Path(recipe) if isinstance(recipe, (str, os.PathLike)) else None, overrides,
                       table=recipe if isinstance(recipe, Mapping) else None)


def _in_memory(data: Any, model: Any, model_path: Path, r: Any, calibration: Any, labels: Any, batched: Any,
               preprocess: Any, trust_lambda: bool):
    """In-memory data (or a path given with a calibration source or a Python preprocessing function) as samples.
    A preprocessing function given in Python runs here; one named in the recipe runs when the samples are written
    (:func:`edgedeploy.data_sources.prepare_data`), on the calibration samples too."""
    from dataclasses import replace

    from ..data_sources import DataOptions, prepare_data
    from ..data_sources.memory import calibration_samples, from_memory
    from ..data_sources.preprocess import apply, load_preprocess

    shape = _input_shape(model, model_path, trust_lambda)
    pre = load_preprocess(preprocess) if callable(preprocess) else None
    if isinstance(data, (str, os.PathLike)):
        import tempfile

        ref = preprocess if callable(preprocess) else (r.preprocess or None)
        with tempfile.TemporaryDirectory() as tmp:  # the file or folder read as the command line reads it
            options = replace(DataOptions.from_recipe(r), preprocess=ref)
            path, record = prepare_data(Path(data), shape, Path(tmp), options, lock=False)
            with np.load(path, allow_pickle=False) as npz:
                arrays = {k: npz[k] for k in npz.files}
        samples = from_memory(arrays, len(shape), eval_fraction=r.eval_fraction, seed=r.seed, labels=labels,
                              max_samples=r.max_samples)
        samples.files = [str(f) for f in arrays["files"]] if "files" in arrays else None
        samples.info = dict(record or {"source": "npz", "path": str(Path(data).resolve())})
        if ref is not None and pre is None:
            pre = load_preprocess(ref)
        if calibration is not None:
            samples.x_calibration, samples.info["calibration_read"] = calibration_samples(
                calibration, len(shape), r.max_samples)
            if pre is not None:
                samples.x_calibration = apply(pre, samples.x_calibration, None, "calibration")
        return samples
    samples = from_memory(data, len(shape), eval_fraction=r.eval_fraction, seed=r.seed, batched=batched,
                          labels=labels, max_samples=r.max_samples)
    if calibration is not None:
        samples.x_calibration, samples.info["calibration_read"] = calibration_samples(
            calibration, len(shape), r.max_samples)
    if pre is not None:
        samples.x = apply(pre, samples.x, samples.files, "given")
        if samples.x_calibration is not None:
            samples.x_calibration = apply(pre, samples.x_calibration, None, "calibration")
        samples.info["preprocess"] = pre.record()
    return samples
