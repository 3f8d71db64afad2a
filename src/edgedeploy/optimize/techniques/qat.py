"""The ``qat`` technique: quantization-aware training with TFMOT and the node's scheme (plain, prune- or
cluster-preserving), its input preprocessing folded first and its activation ranges started from the float
parent."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from edgedeploy.config.data import Dataset
from edgedeploy.config.recipe import Recipe
from edgedeploy.config.tree import NODE_TABLE
from edgedeploy.errors import UsageError
from edgedeploy.keras.rewrites.bn_as_depthwise import batch_norms_as_depthwise
from edgedeploy.keras.rewrites.hard_swish import hard_activations_as_layers
from edgedeploy.keras.input_affine import AS_DEPTHWISE, fold_input_affine
from edgedeploy.keras.model import clone
from edgedeploy.keras.qat_annotate import (
    freeze_quantized, init_activation_ranges, quantize_for_qat, shape_only, unsupported_for_qat,
)
from edgedeploy.keras.rewrites import separate_kernel_outputs
from edgedeploy.keras.rewrites.split_activation import separate_swish
from edgedeploy.optimize.finetune.fit import fine_tune

from .selection import mirrored


def qat_model(env, parent, node: str, details: dict[str, Any] | None = None):
    """The QAT model of ``node`` built from its (float) parent, before training, with the node's scheme.

    Preprocessing at the input (a ``Rescaling``, ``Normalization``) is folded into the kernels it feeds first
    (:func:`edgedeploy.keras.input_affine.fold_input_affine`): fake-quantized, it would stay in the int8 model as
    an elementwise operator over the whole input, which ``ptq``'s converter folds away. Those kernels keep their
    folded weights in training (and so their zeros and clusters). ``details`` (when given) records what was folded
    and what was left, with its reason. The parent is first rewritten into layers TFMOT quantizes as the int8
    converter computes them (:func:`qat_float`)."""
    return _qat_of_float(qat_float(parent, details), node, details)


def _qat_of_float(parent, node: str, details: dict[str, Any] | None = None):
    """:func:`qat_model` of a parent :func:`qat_float` has rewritten already."""
    parent, folded = fold_qat_input(parent, NODE_TABLE[node].keeps_clusters, details)
    model = _quantized(parent, node)
    freeze_quantized(model, {name for into in folded.values() for name in into})
    return model


def qat_float(parent, details: dict[str, Any] | None = None):
    """``parent`` rewritten, with the same function, into layers TFMOT's QAT can take and quantizes as the int8
    converter computes them: hard-swish and hard-sigmoid from TensorFlow operations as one layer each
    (:func:`edgedeploy.keras.rewrites.hard_swish.hard_activations_as_layers`), batch norms it cannot fold as 1x1 depthwise convolutions
    (:func:`edgedeploy.keras.rewrites.bn_as_depthwise.batch_norms_as_depthwise`), a kernel layer's swish as an activation
    layer of its own (:func:`edgedeploy.keras.rewrites.split_activation.separate_swish`). ``details`` (when given) records
    what was rewritten. A model without such layers comes back as it is."""
    rewrites = (("hard_activations_as_layers", hard_activations_as_layers),
                ("batch_norms_as_depthwise", batch_norms_as_depthwise), ("separate_swish", separate_swish))
    for key, rewrite in rewrites:
        parent, names = rewrite(parent)
        if names and details is not None:
            details.setdefault("qat_rewrites", {})[key] = names
    return parent


def fold_qat_input(parent, uniform_only: bool, details: dict[str, Any] | None = None
                   ) -> tuple[Any, dict[str, list[str]]]:
    """``parent`` with its input preprocessing folded into the kernels it feeds, before QAT
    (:func:`edgedeploy.keras.input_affine.fold_input_affine`; ``uniform_only`` for kernels that keep clusters or a
    palette), and ``{folded layer: [layers folded into]}``. ``details`` (when given) records what was folded and
    what was left, with its reason."""
    parent, folded, left = fold_input_affine(parent, uniform_only=uniform_only)  # (a new model, when it folds)
    if details is not None and (folded or left):
        details["input_preprocessing"] = {
            "folded": folded, "left": left,
            "note": "folded into the kernels they feed before QAT, which keep their folded weights in training"}
    return parent, folded


def input_fold_warnings(details: dict[str, Any]) -> list[str]:
    """The warning for the input preprocessing :func:`fold_qat_input` left as it is (none when it left none)."""
    left = details.get("input_preprocessing", {}).get("left")
    if not left:
        return []
    return ["input preprocessing stays an int8 operator of its own: " + "; ".join(
        f"{name}: {reason}" for name, reason in left.items())]


def _quantized(parent, node: str):
    """:func:`quantize_for_qat` of ``parent`` with the QAT scheme of ``node``."""
    settings = NODE_TABLE[node].settings
    scheme_name = settings.get("scheme", "default_8bit")
    if scheme_name == "default_8bit":
        return quantize_for_qat(clone(parent), what=f"stage {node}")
    from tensorflow_model_optimization.python.core.quantization.keras.collab_opts.cluster_preserve import (
        default_8bit_cluster_preserve_quantize_scheme as cluster_preserve,
    )
    from tensorflow_model_optimization.python.core.quantization.keras.collab_opts.prune_preserve import (
        default_8bit_prune_preserve_quantize_scheme as prune_preserve,
    )

    if scheme_name == "prune_preserve":
        scheme = prune_preserve.Default8BitPrunePreserveQuantizeScheme()
    elif scheme_name == "cluster_preserve":
        scheme = cluster_preserve.Default8BitClusterPreserveQuantizeScheme(
            preserve_sparsity=bool(settings.get("preserve_sparsity", False)))
    else:
        raise UsageError(f"stage {node}: unknown QAT scheme '{scheme_name}'", "fix edgedeploy.config.tree.NODE_TABLE")
    model, _ = separate_kernel_outputs(clone(parent))  # (else TFMOT's Concatenate and ReLU transforms drop the scheme)
    return quantize_for_qat(model, scheme, what=f"stage {node}")


def settle_cluster_weights(model) -> int:
    """Set each cluster-preserving QAT kernel to exactly its centroids; returns how many kernels were set.

    In training, TFMOT's (P)CQAT quantizer assigns the clustered weights (centroids gathered by the indices
    of the nearest centroid to the original weights) to the layer's kernel on every forward pass, but inside
    ``model.fit`` the kernel variable also takes an optimizer step after that assignment, so after training
    it holds the clustered values plus one step (about one learning rate) of drift: more distinct values than
    clusters, which int8 rounding can keep. The int8 model is converted from that kernel, so it is set back to
    the centroids here, from the final centroids and original weights, as the training forward pass does.
    """
    from tensorflow_model_optimization.python.core.quantization.keras.collab_opts.cluster_preserve import (
        cluster_preserve_quantize_registry as registry,
    )

    from edgedeploy.keras import tfenv

    tf = tfenv.load().tf
    settled = 0
    for layer in model.layers:
        for weight, _quantizer, qvars in getattr(layer, "_weight_vars", []):
            if not isinstance(qvars, dict) or registry.CLUSTER_CENTROIDS not in qvars:
                continue
            impl = qvars[registry.CLUSTERING_IMPL]
            original = qvars[registry.ORIGINAL_WEIGHTS]
            if registry.SPARSITY_MASK in qvars:
                original.assign(original * qvars[registry.SPARSITY_MASK])
                if qvars.get(registry.CENTROIDS_MASK) is not None:
                    impl.cluster_centroids.assign(impl.cluster_centroids * qvars[registry.CENTROIDS_MASK])
            indices = impl.get_pulling_indices(original)
            qvars[registry.PULLING_INDICES].assign(tf.cast(indices, qvars[registry.PULLING_INDICES].dtype))
            weight.assign(impl.get_clustered_weight(qvars[registry.PULLING_INDICES], original))
            settled += 1
    return settled


def start_qat_ranges(model, parent, data: Dataset, recipe: Recipe, details: dict[str, Any]) -> None:
    """Start the QAT model's activation ranges from its float parent on the fine-tune samples (recipe
    ``qat_ranges = "calibrated"``), or leave TFMOT's [-6, 6] (``"tfmot"``); see
    :func:`edgedeploy.keras.qat_annotate.init_activation_ranges`."""
    if recipe.qat_ranges == "calibrated":
        count = init_activation_ranges(model, parent, data.x_fit, recipe.batch_size)
        details["qat_ranges"] = (f"{count} activation ranges started from the float parent on the "
                                 f"{len(data.x_fit)} fine-tune samples")
    else:
        details["qat_ranges"] = "TFMOT's start of [-6, 6]"


def load_qat(env, parent_path: Path, weights_path: Path, node: str):
    parent = env.keras.models.load_model(parent_path, compile=False)
    model = qat_model(env, parent, node)
    model.load_weights(weights_path)
    return model


def qat_node(run) -> Any:
    """QAT with the node's scheme, its activation ranges started from the float parent."""
    parent, node = qat_float(run.parent(), run.details), run.node.name  # (the ranges start from its layers)
    model = _qat_of_float(parent, node, run.details)
    run.warnings.extend(input_fold_warnings(run.details))
    start_qat_ranges(model, parent, run.data, run.recipe, run.details)
    folded = run.details.get("input_preprocessing", {}).get("folded", {})
    # the hard activations' layers are fake-quantized at their output by design (edgedeploy.keras.rewrites.hard_swish)
    rewritten = set(run.details.get("qat_rewrites", {}).get("hard_activations_as_layers", ()))
    # an input affine left at an image input is a 1x1 depthwise convolution in the QAT model, quantized as one
    as_depthwise = {name for name, why in run.details.get("input_preprocessing", {}).get("left", {}).items()
                    if why.endswith(AS_DEPTHWISE)}
    unquantized = [name for name in unsupported_for_qat(parent)
                   if name not in folded and name not in rewritten and name not in as_depthwise]
    if unquantized:
        run.details["qat_unquantized_layers"] = unquantized
        # reshapes and max poolings only move values and keep their input's scale: nothing to say
        computing = [n for n in unquantized if not shape_only(parent.get_layer(n))]
        if computing:
            run.warnings.append(f"{', '.join(computing)}: TFMOT has no QAT config for these layers; only their "
                                "outputs are fake-quantized in training, and the int8 converter quantizes the rest")
    fine_tune(run.env, model, run.data, run.recipe, "qat", run.loss, node, record=run.training,
              mirrored=mirrored(run))
    if run.node.settings.get("settle_clusters"):
        run.training["cluster_kernels_settled"] = settle_cluster_weights(model)
    return model
