"""The deployment tree: prune, cluster and quantization-aware training on the user's model and data.

:mod:`edgedeploy.pipeline.tree_run` runs the node table (:mod:`edgedeploy.config.tree`) as a task graph and looks up
each node's technique and each leaf's conversion in :mod:`.registry`: the TFMOT techniques in :mod:`.techniques.prune`,
:mod:`.techniques.cluster` and :mod:`.techniques.qat` (run by the node stage in :mod:`.node`), the thinned node in
:mod:`.techniques.thin`, the palette-aware ones in :mod:`.palette`, the int8 leaves in :mod:`.leaf` and :mod:`.leaf16`.
Every trained node fine-tunes with :func:`.finetune.fit.fine_tune`.
"""

from __future__ import annotations

from edgedeploy.core.lazy import lazy_exports

# Name -> the module that defines it, imported when first used.
_EXPORTS = {
    "TrainingSet": ".finetune.fit",
    "fine_tune": ".finetune.fit",
    "teacher_targets": ".finetune.fit",
    "training_set": ".finetune.fit",
    "FLOAT_MODEL": ".leaf",
    "INT8_MODEL": ".leaf",
    "QAT_WEIGHTS": ".leaf",
    "int8_stats": ".leaf",
    "leaf_int8": ".leaf",
    "tfenv_seed": ".leaf",
    "cluster": ".techniques.cluster",
    "load_qat": ".techniques.qat",
    "prune": ".techniques.prune",
    "qat_model": ".techniques.qat",
    "settle_cluster_weights": ".techniques.qat",
    "start_qat_ranges": ".techniques.qat",
}
__getattr__ = lazy_exports(__name__, _EXPORTS)
