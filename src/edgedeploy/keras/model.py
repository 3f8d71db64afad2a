"""Loading, checking and inspecting Keras 2 (tf_keras) models for the optimization stages."""

from __future__ import annotations

import json
import re
import zipfile
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Iterable, Iterator

from edgedeploy.errors import InvalidInputError
from edgedeploy.core.files import LIMITS, check_input_file
from edgedeploy.keras.hdf5 import check_archive_sizes, check_datasets, keras_weights
from edgedeploy.keras.keras3 import unique_name  # noqa: F401  (layer names are made unique the same way in both)
from edgedeploy.core.weight_stats import WeightStats, stats

KERNEL_LAYERS = ("Conv2D", "DepthwiseConv2D", "Dense")


@dataclass(frozen=True)
class ModelFileInfo:
    path: Path
    keras_version: str | None
    lambda_layers: tuple[str, ...]
    training_config: dict[str, Any] | None
    # the nested models flattened on loading (``outer/inner`` for deeper ones), and the nested model they were
    # in (tf_keras), to check the flat model against on the user's samples when they are at hand
    flattened: tuple[str, ...] = ()
    nested: Any = field(default=None, compare=False, repr=False)


def _walk(config: Any) -> Iterator[dict]:
    if isinstance(config, dict):
        if "class_name" in config:
            yield config
        for v in config.values():
            yield from _walk(v)
    elif isinstance(config, list):
        for v in config:
            yield from _walk(v)


def inspect_model_file(path: Path) -> ModelFileInfo:
    """Read a model file's config without building it (no code from the file runs)."""
    path = Path(path)
    if not path.exists():
        raise InvalidInputError(f"model {path} does not exist", "check the path to the .h5 or .keras model")
    check_input_file(path, "model", "model")  # a regular file of bounded size, before h5py or zipfile open it
    if path.suffix == ".h5":
        import h5py

        try:
            with h5py.File(path, "r") as f:
                attrs = dict(f.attrs)
                check_datasets(f, f"model {path}", path.stat().st_size)  # before tf_keras reads any
        except InvalidInputError:
            raise
        except Exception as exc:  # OSError mostly; a damaged file fails inside h5py in other ways too
            raise InvalidInputError(f"{path} is not a readable HDF5 Keras model ({exc})".splitlines()[0],
                                    "save the model with model.save('x.h5')") from exc
        raw = attrs.get("model_config")
        if raw is None:
            raise InvalidInputError(f"{path} holds weights only, not a model", "save the whole model with model.save('x.h5')")
        try:
            config = json.loads(raw if isinstance(raw, str) else raw.decode())
            version = attrs.get("keras_version")
            version = version.decode() if isinstance(version, bytes) else version
            tc = attrs.get("training_config")
            training = json.loads(tc if isinstance(tc, str) else tc.decode()) if tc is not None else None
        except (ValueError, AttributeError, TypeError) as exc:  # JSON and UTF-8 errors are ValueErrors
            raise InvalidInputError(f"{path}: its model config is damaged ({type(exc).__name__})",
                                    "save the model again with model.save('x.h5')") from exc
    elif path.suffix == ".keras":
        try:
            with zipfile.ZipFile(path) as z:
                check_archive_sizes(z, path)  # before anything is unpacked
                if z.getinfo("config.json").file_size > LIMITS["manifest"]:
                    raise InvalidInputError(f"{path}: its config.json unpacks to "
                                            f"{z.getinfo('config.json').file_size:,} bytes, over the limit of "
                                            f"{LIMITS['manifest']:,}", "see 'Size limits' in docs/files.md")
                config = json.loads(z.read("config.json"))
                meta = json.loads(z.read("metadata.json")) if "metadata.json" in z.namelist() else {}
                with keras_weights(z, path):  # the weights' declared sizes, before Keras reads any
                    pass
        except InvalidInputError:
            raise
        except Exception as exc:  # a bad zip, a missing member, bad JSON, a damaged deflate stream ...
            raise InvalidInputError(f"{path} is not a readable .keras model ({type(exc).__name__}: {exc})".splitlines()[0],
                                    "re-save the model") from exc
        version = meta.get("keras_version")
        training = config.get("compile_config")
    else:
        raise InvalidInputError(f"{path} is not a Keras model file", "pass a .h5 or .keras file saved by tf_keras or Keras 3")
    if not isinstance(config, dict) or not isinstance(training, (dict, type(None))):
        raise InvalidInputError(f"{path}: its model config is not a Keras model config", "re-save the model")
    lambdas = tuple(str((cfg if isinstance(cfg := c.get("config"), dict) else {}).get("name", "?"))
                    for c in _walk(config) if c.get("class_name") == "Lambda")
    return ModelFileInfo(path, version, lambdas, training)


def load_model(path: Path, trust_lambda: bool = False):
    """Load a Keras model as tf_keras (a Keras 3 file rebuilt, see :mod:`edgedeploy.keras.keras3`); refuse ``Lambda`` layers
    (they run code stored in the file) unless trusted."""
    from edgedeploy.keras import tfenv

    info = inspect_model_file(path)
    if info.lambda_layers and not trust_lambda:
        raise InvalidInputError(
            f"{path} has Lambda layers ({', '.join(info.lambda_layers[:3])}) whose code would run on loading",
            "pass --trust-lambda if you trust this file",
        )
    keras = tfenv.load().keras
    if info.keras_version and str(info.keras_version).startswith("3"):
        from edgedeploy.keras.keras3 import load_keras3

        model = load_keras3(path, trust_lambda)  # TFMOT wraps Keras 2 (tf_keras) models only
    else:
        try:
            model = keras.models.load_model(path, compile=False, safe_mode=not trust_lambda) \
                if path.suffix == ".keras" else keras.models.load_model(path, compile=False)
        except Exception as exc:  # Keras raises many kinds of errors on bad files
            custom = re.search(r"Unknown (?:layer|object type|[a-z ]+): '([^']+)'", str(exc))
            if custom:  # a subclassed layer: its code is not in the file, and edgedeploy loads no user code
                raise InvalidInputError(
                    f"{path}: the model uses {custom.group(1)}, a custom layer class whose code is not in the file, "
                    "so tf_keras cannot rebuild (nor edgedeploy flatten) the model",
                    "build that part from built-in Keras layers and save the model again") from exc
            raise InvalidInputError(f"{path} does not load with tf_keras ({type(exc).__name__}: {exc})".splitlines()[0],
                                    "check the file was saved by tf_keras 2.x") from exc
    if len(model.inputs) != 1:
        raise InvalidInputError(f"{path} has {len(model.inputs)} inputs and {len(model.outputs)} outputs",
                                "the deployment tree needs a model with a single input")
    return flatten_checked(as_functional(model), info)


def flatten_checked(model, info: ModelFileInfo):
    """``model`` with its nested models flattened (:mod:`edgedeploy.keras.flatten`), checked against the nested
    model on seeded samples (the caller checks again on the user's samples, with ``info.nested``)."""
    from edgedeploy.keras.flatten import CHECK_SAMPLES, flatten_nested, same_outputs, seeded_samples

    flat, flattened = flatten_nested(model, info.path)
    if not flattened:
        return model, info
    same_outputs(model, flat, seeded_samples(model), info.path, f"{CHECK_SAMPLES} seeded samples")
    return flat, replace(info, flattened=tuple(flattened), nested=model)


def check_recurrent_layers(model, path: Path, leaves: Iterable[str], qat_leaves: Iterable[str]) -> None:
    """Refuse recurrent layers that TFLite's int8 conversion cannot take, before any training.

    Only a Keras ``LSTM`` layer becomes a TFLite operator of its own (UNIDIRECTIONAL_SEQUENCE_LSTM); any other
    recurrent layer that is not unrolled (GRU, SimpleRNN, RNN over a cell) becomes a loop whose int8
    calibration crashes the converter (a segmentation fault in TensorFlow 2.21), so no leaf could be converted.
    TFMOT has no QAT config for an LSTM, and the converter cannot convert its quantization-aware model, so the
    QAT leaves (``qat_leaves`` of ``leaves``) are refused for it; unrolled layers are plain operators and pass.
    """
    looping: list[str] = []
    lstm: list[str] = []
    for layer in model.layers:
        kind = layer.__class__.__name__
        rnn = layer.forward_layer if kind == "Bidirectional" else layer
        if not hasattr(rnn, "cell") or getattr(rnn, "unroll", False):
            continue
        inside = rnn.__class__.__name__ if rnn is not layer else rnn.cell.__class__.__name__ if kind == "RNN" else ""
        what = f"{layer.name} ({kind}{f'({inside})' if inside else ''})"
        (lstm if rnn.__class__.__name__ == "LSTM" else looping).append(what)
    if looping:
        raise InvalidInputError(
            f"{path}: recurrent layer {', '.join(looping)} is not unrolled, and TFLite's int8 converter crashes on "
            "its loop", "rebuild it with unroll=True (fixed time steps), or use keras.layers.LSTM, which converts "
            "to one operator")
    qat = [leaf for leaf in leaves if leaf in set(qat_leaves)]
    if lstm and qat:
        others = [leaf for leaf in leaves if leaf not in qat]
        raise InvalidInputError(
            f"{path}: TFLite cannot convert the quantization-aware model of LSTM layer {', '.join(lstm)}, so "
            f"QAT leaf {', '.join(qat)} cannot be built",
            f"leave them out (e.g. --leaves {','.join(others or ['ptq', 'pruned', 'pruned_clustered'])}), or "
            "rebuild the LSTM with unroll=True")


def as_functional(model):
    """A ``Sequential`` model as the same functional model (fresh layers of the same names and weights).

    The graph rewrites (batch norms folded, separate ReLUs fused) and TFMOT's Conv + BatchNorm patterns work
    on functional models; other models are returned as they are.
    """
    if model.__class__.__name__ != "Sequential":
        return model
    from edgedeploy.keras import tfenv

    keras = tfenv.load().keras
    inputs = keras.Input(batch_shape=model.input_shape)
    x = inputs
    for layer in model.layers:
        x = layer.__class__.from_config(layer.get_config())(x)
    functional = keras.Model(inputs, x, name=model.name)
    for layer in model.layers:
        functional.get_layer(layer.name).set_weights(layer.get_weights())
    return functional


def clone(model):
    """A fresh copy with the same weights: TFMOT wrappers change the layers they wrap."""
    from edgedeploy.keras import tfenv

    keras = tfenv.load().keras
    copy = keras.models.clone_model(model)
    copy.set_weights(model.get_weights())
    return copy


def inner(layer):
    """The layer inside TFMOT wrappers (or the layer itself)."""
    while hasattr(layer, "layer") and hasattr(layer.layer, "weights"):
        layer = layer.layer
    return layer


def base_name(name: str) -> str:
    for prefix in ("quant_", "prune_low_magnitude_", "cluster_"):
        if name.startswith(prefix):
            return name[len(prefix):]
    return name


def kernel_of(layer):
    """The kernel weights of a (possibly wrapped) Conv2D/DepthwiseConv2D/Dense layer, read by name."""
    for w in layer.weights:
        short = w.name.split("/")[-1]
        if short in ("kernel:0", "depthwise_kernel:0"):
            return w.numpy()
    return None


def keras_weight_stats(model) -> list[WeightStats]:
    found = []
    for layer in model.layers:
        kind = inner(layer).__class__.__name__
        if kind not in KERNEL_LAYERS:
            continue
        k = kernel_of(layer)
        if k is None:
            continue
        # output channels: last axis of Conv2D/Dense kernels; the input-channel axis of depthwise kernels
        axis = 2 if kind == "DepthwiseConv2D" else k.ndim - 1
        found.append(stats(base_name(layer.name), kind, k, axis))
    return found


def is_linear(layer) -> bool:
    """Whether the layer (inside TFMOT's wrappers) has no activation of its own."""
    act = getattr(inner(layer), "activation", None)
    return act is None or getattr(act, "__name__", "") == "linear"
