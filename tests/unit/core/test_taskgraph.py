"""The task graph of the deployment tree: dependencies from the node table, the order ready tasks start in, and
what a failing task stops."""

from __future__ import annotations

import threading
from concurrent.futures import Future, ThreadPoolExecutor

import pytest

from edgedeploy.errors import PreservationError, ToolFailedError
from edgedeploy.core.graph import build_graph, descendants, ready, run_graph
from edgedeploy.config.tree import LEAF_TABLE, NODE_TABLE


def test_dependencies_come_from_the_node_table():
    g = build_graph(["ptq", "pqat", "pcqat", "cqat_palette"], ["u55", "u85"])
    assert g["optimize/baseline"].deps == ()
    for task in g.values():
        if task.kind == "node" and NODE_TABLE[task.name].parent:
            assert task.deps == (f"optimize/{NODE_TABLE[task.name].parent}",)
    assert g["convert/ptq"].deps == ("optimize/baseline",)
    # a QAT leaf reads its node's weights and the model they apply to
    assert g["convert/pqat"].deps == ("optimize/pqat", "optimize/pruned")
    assert g["convert/pcqat"].deps == ("optimize/pcqat", "optimize/pruned_clustered")
    assert g["compile/pcqat/u85"].deps == ("convert/pcqat",)
    assert [t for t in g if t.startswith("compile/")] == [f"compile/{leaf}/{t}" for leaf in
                                                         ("ptq", "pqat", "pcqat", "cqat_palette") for t in ("u55", "u85")]
    # every dependency comes before its task: the graph's order is the one-at-a-time order
    seen: set[str] = set()
    for task in g.values():
        assert set(task.deps) <= seen
        seen.add(task.id)


def test_a_palette_size_budget_waits_for_the_baseline():
    assert build_graph(["pcqat_palette"], palette_budget=True)["optimize/pruned_clustered_palette"].deps == (
        "optimize/pruned", "optimize/baseline")
    assert build_graph(["clustered_palette"], palette_budget=True)["optimize/clustered_palette"].deps == (
        "optimize/baseline",)


def test_every_leaf_of_the_table_has_its_nodes():
    g = build_graph(list(LEAF_TABLE))
    assert {t.name for t in g.values() if t.kind == "node"} == set(NODE_TABLE)
    assert {t.name for t in g.values() if t.kind == "leaf"} == set(LEAF_TABLE)


def test_ready_tasks_start_compiles_then_conversions_then_nodes():
    g = build_graph(["ptq", "pruned", "qat"], ["u55"])
    assert [t.id for t in ready(g, [], [])] == ["optimize/baseline"]
    after_baseline = [t.id for t in ready(g, ["optimize/baseline"], ["optimize/baseline"])]
    assert after_baseline == ["convert/ptq", "optimize/pruned", "optimize/qat"]
    done = ["optimize/baseline", "convert/ptq"]
    assert [t.id for t in ready(g, done, done)] == ["compile/ptq/u55", "optimize/pruned", "optimize/qat"]
    assert descendants(g, "optimize/pruned") == ["convert/pruned", "compile/pruned/u55"]


def _done(value=None) -> Future:
    f: Future = Future()
    f.set_result(value)
    return f


def test_one_at_a_time_runs_in_the_graph_order_with_each_leaf_before_the_next_node():
    g = build_graph(["ptq", "pruned", "pqat"], ["u55"])
    finished = []
    run = run_graph(g, lambda t: _done(), lambda t, f: finished.append(t.id))
    assert run.order == finished == run.done
    assert run.order == ["optimize/baseline", "convert/ptq", "compile/ptq/u55", "optimize/pruned", "convert/pruned",
                         "compile/pruned/u55", "optimize/pqat", "convert/pqat", "compile/pqat/u55"]


def test_independent_tasks_run_at_once_and_finish_in_this_thread():
    g = build_graph(["pruned", "qat", "clustered"])
    here = threading.get_ident()
    barrier = threading.Barrier(3, timeout=10)  # the three children of the baseline must be running together
    finishers = set()

    def work(task):
        if task.kind == "node" and task.name != "baseline":
            barrier.wait()
        return task.id

    with ThreadPoolExecutor(4) as pool:
        run = run_graph(g, lambda t: pool.submit(work, t), lambda t, f: finishers.add((f.result(), threading.get_ident())))
    assert {tid for _, tid in finishers} == {here}
    assert sorted(run.done) == sorted(g)


def test_a_failing_task_stops_its_descendants_and_the_others_finish():
    g = build_graph(["ptq", "pruned", "pqat", "qat"], ["u55"])

    def finish(task, future):
        if task.id == "optimize/pruned":
            raise PreservationError("pruned lost its sparsity", "hint")

    with pytest.raises(PreservationError, match="pruned"):
        run_graph(g, lambda t: _done(), finish)
    run = run_graph(g, lambda t: _done(), finish, raise_first=False)
    assert list(run.failed) == ["optimize/pruned"]
    assert run.skipped == ["optimize/pqat", "convert/pruned", "convert/pqat", "compile/pruned/u55", "compile/pqat/u55"]
    assert set(run.done) == set(g) - set(run.skipped) - {"optimize/pruned"}
    assert not set(run.order) & set(run.skipped)


def test_the_first_failure_in_graph_order_is_raised_and_a_start_error_counts_as_a_failure():
    g = build_graph(["ptq", "pruned", "qat"], ["u55"])

    def start(task):
        if task.id in ("optimize/qat", "compile/ptq/u55"):
            raise ToolFailedError(f"{task.id} failed", "hint")
        return _done()

    run = run_graph(g, start, lambda t, f: None, raise_first=False)
    assert sorted(run.failed) == ["compile/ptq/u55", "optimize/qat"]
    assert "convert/qat" in run.skipped and "compile/pruned/u55" in run.done
    with pytest.raises(ToolFailedError, match="optimize/qat"):
        run_graph(g, start, lambda t, f: None)


def test_a_bug_is_not_swallowed():
    g = build_graph(["ptq"])

    def finish(task, future):
        raise KeyError("bug")

    with pytest.raises(KeyError):
        run_graph(g, lambda t: _done(), finish)


def test_work_held_back_until_the_graph_waits_is_started_by_before_wait():
    g = build_graph(["ptq", "pruned", "qat"])
    held: dict[str, Future] = {}  # task -> its future, which only before_wait (or the rescue below) ends
    calls: list[list[str]] = []

    def start(task):
        held[task.id] = Future()
        return held[task.id]

    def before_wait():  # the runner starts what it held back: here, every task is done at once
        calls.append(sorted(t for t, f in held.items() if not f.done()))
        for f in held.values():
            if not f.done():
                f.set_result(None)

    stop = threading.Event()

    def rescue():  # ends, after 5 s, any wait that nobody else ends (so that a failure is not a hang)
        if not stop.wait(5):
            while not stop.wait(0.05):
                for f in list(held.values()):
                    if not f.done():
                        f.set_result("rescued")

    threading.Thread(target=rescue, daemon=True).start()
    try:
        run = run_graph(g, start, lambda t, f: None, before_wait=before_wait)
    finally:
        stop.set()
    assert all(f.result() is None for f in held.values())  # none had to be rescued from a wait nobody ended
    # called once every ready task had started: the baseline alone, then its three children together
    assert calls == [["optimize/baseline"], ["convert/ptq", "optimize/pruned", "optimize/qat"], ["convert/pruned",
                                                                                                 "convert/qat"]]
    assert sorted(run.done) == sorted(g)
