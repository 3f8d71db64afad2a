"""Vela's worker processes in a process that has TensorFlow loaded (after `optimize`, in a notebook): forked from
a server process that imported Vela and never TensorFlow, so a pool after the first starts without importing."""

from __future__ import annotations

import os

# what a worker reports of itself: whether it has TensorFlow and Vela loaded, and its parent process
PROBE = ("(__import__('sys').modules.__contains__('tensorflow'), "
         "__import__('sys').modules.__contains__('ethosu.vela.vela'), __import__('os').getppid())")


def test_workers_fork_from_a_server_that_imported_vela_and_not_tensorflow(dscnn_int8, tmp_path):
    from edgedeploy.keras import tfenv
    from edgedeploy.pipeline.compile import CompileOptions, compile_tflite
    from edgedeploy.vela.pool import VelaPool

    tfenv.load()  # TensorFlow loaded here, as after training
    parents = set()
    for _ in range(2):  # one pool after another, as two compiles make
        with VelaPool(2) as pool:
            seen = [pool.call(eval, PROBE).result() for _ in range(4)]
        assert all(not has_tf and has_vela for has_tf, has_vela, _ in seen), seen
        parents |= {parent for _, _, parent in seen}
    assert len(parents) == 1 and os.getpid() not in parents  # both pools' workers: children of the one server
    # and such workers compile as any others
    outcome = compile_tflite([dscnn_int8], ["ethos-u55-128"], tmp_path / "run", CompileOptions(jobs=1))
    assert outcome.records[0].status == "ok" and outcome.records[0].metrics["total_cycles"].value > 0
