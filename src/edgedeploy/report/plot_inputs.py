"""Gathering what the HTML page plots beyond the rows: per-layer cycles and a kernel through the stages.

Collected with the rest of the report (``build_report(..., html=True)``), so the HTML renderer reads
nothing but the document it is given.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping

from edgedeploy.core.files import check_input_file
from edgedeploy.errors import InvalidInputError
from edgedeploy.keras.hdf5 import check_datasets, keras_weights
from .collect import int8_model_path


STAGE_CHAIN = (("baseline",), ("pruned",), ("pruned_clustered", "clustered"))
INT8_CHAIN = ("pruned_clustered", "pcqat", "clustered", "cqat", "pruned", "pqat", "qat", "ptq")


def _keras_file(manifest, rec) -> Path | None:
    from edgedeploy.core.manifest import checked_artifact

    for a in rec.outputs:
        if a.path.endswith((".h5", ".keras")):
            path = manifest.resolve(a)
            return checked_artifact(manifest, rec, a, f"the Keras model of {rec.variant}") if path.exists() else path
    for name in ("model.keras", "model.h5"):
        p = manifest.run_dir / rec.id / name
        if p.is_file():
            return p
    return None


def keras_kernels(path: Path) -> dict[str, Any]:
    """Weight arrays of rank >= 2 in a Keras ``.h5`` or ``.keras`` file, by their path in the file (needs h5py)."""
    import zipfile

    import h5py
    import numpy as np

    check_input_file(path, "model", "model")  # a file named by a run's manifest: regular and bounded
    found: dict[str, Any] = {}

    def visit(root, where: str, size: int) -> None:
        group = root["model_weights"] if "model_weights" in root else root
        check_datasets(group, where, size)  # declared sizes, before a dataset is read

        def take(name, obj):
            if isinstance(obj, h5py.Dataset) and obj.ndim >= 2 and "optimizer" not in name:
                found[name] = np.asarray(obj[()])

        group.visititems(take)

    if Path(path).suffix == ".keras":
        with zipfile.ZipFile(path) as zf, keras_weights(zf, path) as f:  # sizes checked before anything is read
            if f is not None:
                visit(f, f"model {path} (its model.weights.h5)", zf.getinfo("model.weights.h5").file_size)
    else:
        with h5py.File(path, "r") as f:
            visit(f, f"model {path}", Path(path).stat().st_size)
    return found


def _segments(name: str) -> set[str]:
    out = set()
    for part in name.replace(";", "/").split("/"):
        out.add(part)
        for prefix in ("prune_low_magnitude_", "cluster_", "quant_"):
            if part.startswith(prefix):
                out.add(part[len(prefix):])
    return out


def _stage_files(manifest) -> tuple[dict[str, Path], tuple[str, Path] | None]:
    """The Keras model of each optimize node and the int8 model of the first leaf of :data:`INT8_CHAIN` the run
    has, each checked against the manifest's sha256 first (a changed one is refused, never read)."""
    optimize = {r.variant: r for r in manifest.find(stage="optimize") if r.status != "failed" and r.variant}
    kept = {node: _keras_file(manifest, rec) for node, rec in optimize.items()}
    models = {k: v for k, v in kept.items() if v is not None and v.is_file()}
    for leaf in INT8_CHAIN:
        recs = manifest.find(stage="convert", variant=leaf)
        path = int8_model_path(manifest, recs[0]) if recs else None
        if path is not None and path.is_file():
            return models, (leaf, path)
    return models, None


def weight_stages(manifest, files: tuple[dict[str, Path], tuple[str, Path] | None] | None = None
                  ) -> tuple[list[tuple[str, Any]], str | None, str | None]:
    """Weights of one sample kernel through baseline → pruned → clustered → int8 (or why they are unavailable);
    ``files``: :func:`_stage_files` of the run, read here when not given."""
    import numpy as np

    models, int8 = files if files is not None else _stage_files(manifest)
    if "baseline" not in models:
        return [], None, ("no optimize/baseline record with a Keras model in this run "
                          "(it was compiled from a .tflite, or optimize did not save the baseline)")
    try:
        import h5py  # noqa: F401
    except ImportError:
        return [], None, "reading Keras weights needs h5py, which is not installed"
    base = keras_kernels(models["baseline"])
    if not base:
        return [], None, f"{models['baseline']} holds no kernel of rank >= 2"
    sample_path = max(base, key=lambda k: base[k].size)
    layer = sample_path.split("/")[0]
    stages: list[tuple[str, Any]] = [("baseline (float)", base[sample_path])]
    for names in STAGE_CHAIN[1:]:
        node = next((n for n in names if n in models), None)
        if node is None:
            continue
        kernels = keras_kernels(models[node])
        match = [v for k, v in kernels.items() if layer in _segments(k) and v.size == base[sample_path].size]
        if match:
            stages.append((f"{node} (float)", max(match, key=lambda v: v.size)))
    from edgedeploy.tflite.reader import read_weight_tensors

    if int8 is not None:
        leaf, path = int8
        tensors = [w for w in read_weight_tensors(path) if w.dtype == "int8"]
        same = [w for w in tensors if int(np.prod(w.shape)) == base[sample_path].size]
        named = [w for w in same if layer in _segments(w.name)]
        pick = named[0] if named else (same[0] if len(same) == 1 else None)
        if pick is not None:
            values = pick.values().astype(np.float64)
            if len(pick.scale) > 1:
                axis = pick.quantized_dimension
                shape = [1] * values.ndim
                shape[axis] = len(pick.scale)
                values = values * np.asarray(pick.scale).reshape(shape)
            elif pick.scale:
                values = values * pick.scale[0]
            stages.append((f"int8 of {leaf} (dequantized)", values))
    return stages, layer, None


def _safe_weight_stages(manifest) -> tuple[list, str | None, str | None]:
    files = _stage_files(manifest)  # a file changed since its stage wrote it stops the report: never read
    try:
        return weight_stages(manifest, files)
    except InvalidInputError:  # a model file the run names that breaks a size limit: refused, not skipped
        raise
    except Exception as exc:  # an unreadable optional model must not lose the report
        return [], None, f"could not read the stage models ({type(exc).__name__}: {exc})"


def plot_inputs(manifest, doc: Mapping[str, Any]) -> dict[str, Any]:
    """Per-layer cycles of each target's recommended leaf, and one kernel's weights through the stages."""
    layer_cycles: dict[str, list] = {}
    for t, rec in doc["recommendations"].items():
        leaf = rec.get("leaf")
        if not leaf:
            continue
        row = next(r for r in doc["rows"] if r["leaf"] == leaf and r.get("target") == t)
        crec = manifest.records.get(row["stages"]["compile"] or "")
        layer_cycles[t] = (crec.details.get("layers") if crec else None) or []
    stages, layer, why = _safe_weight_stages(manifest)
    return {"layer_cycles": layer_cycles, "weight_stages": {"stages": stages, "layer": layer, "unavailable": why}}
