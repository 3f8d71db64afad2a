"""The deployment tree: prune, cluster and quantization-aware training on the user's model and data.

:mod:`.walk` walks the node table (:mod:`edgedeploy.tree`) and runs each node's technique and each leaf's
conversion as named in :mod:`.registry`: the TFMOT techniques in :mod:`.techniques` (run by the node stage in
:mod:`.node`), the palette-aware ones in :mod:`.palette`, the int8 leaf in :mod:`.leaf`. Every trained node
fine-tunes with :func:`.fit.fine_tune`.
"""

from __future__ import annotations

from .fit import Loss, TrainingSet, fine_tune, teacher_targets, training_set  # noqa: F401
from .leaf import FLOAT_MODEL, INT8_MODEL, QAT_WEIGHTS, int8_stats, leaf_int8, tfenv_seed  # noqa: F401
from .techniques import cluster, load_qat, prune, qat_model, settle_cluster_weights, start_qat_ranges  # noqa: F401
from .walk import OptimizeOutcome, make_runner, optimize  # noqa: F401
