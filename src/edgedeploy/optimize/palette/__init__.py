"""Palette-aware compression: keep clusters and sparsity all the way into the NPU's weight streams.

Vela encodes each weight stream losslessly, with a palette of at most 32 distinct int8 values and run-length
coding of zeros. TFMOT clusters float weights; int8 per-channel scales (and batch norms folded into the kernels)
then spread each tensor's clusters over many distinct int8 values, and Vela's palette no longer applies.

This module keeps the palette in the int8 values themselves. For each weight tensor it chooses one shared
*integer* palette ``P`` (at most ``clusters`` values in [-127, 127]) and writes every output channel as its
own scale times palette values::

    w[..., c] = s_c * P[index],  s_c = max|w[..., c]| / 127,  ±127 in P

(With ``[palette] scales = "fitted"`` each ``s_c`` is instead the fraction of that which fits the channel's
weights best, its largest weights clipped to ±127: :func:`fitted_scales`.) Because each channel keeps a weight at
±127, the converter's symmetric per-channel scale is exactly ``s_c`` and the int8 kernel holds only values of
``P``: at most ``clusters`` distinct values per tensor, whatever the channel scales are. Zero stays a palette
value, so pruned weights stay zero. Batch norms are folded into the kernels first, so the converter has nothing
left to fold.

Nodes (see :data:`edgedeploy.config.tree.NODE_TABLE`): ``clustered_palette`` / ``pruned_clustered_palette`` cluster the baseline / the TFMOT
pruned node straight onto per-tensor palettes, zeros kept (PTQ leaves of the same names; they replace TFMOT's
clustering, whose per-tensor float clusters a folded batch norm would spread again), and ``cqat_palette`` /
``pcqat_palette`` run
quantization-aware training whose weight quantizers snap each kernel to its palette on every step (a
straight-through estimator), so the palette survives training and conversion. A layer whose batch norm was
folded trains in its kernel's units before folding (:func:`palette_qat_model`), as TFMOT's QAT of the unfolded
model does; the factors are kept in the node's plan file.

By default the projection is error-compensating (:func:`project_compensated`, GPTQ-style): each layer's input
hessian from real fine-tune samples (:func:`layer_hessians`) lets the error of every snapped weight be pushed
onto the weights not yet snapped, so the layer's output moves far less than with nearest-value snapping
(:func:`project`, ``[palette] projection = "nearest"``).

Per-layer settings (``[layers.NAME] sparsity / clusters``) and an optional sensitivity sweep (``[palette]
search = true``) choose, per layer, the palette size and extra sparsity that give the smallest Vela-encoded
weights within an accuracy budget, judged on fine-tune samples from the rise of the cross-entropy
(:func:`drop_per_loss`). Work items of the sweep run in a local process pool, or as Ray tasks
(``executor = "ray"``).

Modules: :mod:`.projection` (palettes and the projections onto them), :mod:`.plan` (plans and the search),
:mod:`.models` (Keras models), :mod:`.sensitivity` (the sensitivity sweep), :mod:`.palette_qat` (QAT that keeps the
palette) and :mod:`.stages` (the nodes' and leaves' stages); Vela's debug database is read by
:mod:`edgedeploy.vela.debugdb`. The package's face is the two stages the optimize registry dispatches to.
"""

from __future__ import annotations

from .stages import convert_leaf, train_node

__all__ = ["convert_leaf", "train_node"]
