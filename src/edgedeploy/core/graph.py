"""The deployment tree as a task graph, and the scheduler that runs every ready task.

Each stage is one task: train a node (``optimize/<node>``), convert a leaf (``convert/<leaf>``) and compile a leaf
for a target (``compile/<leaf>/<target>``). A task depends on the stages whose outputs it reads, all taken from the
node table (:mod:`edgedeploy.config.tree`):

- a node on its parent node (and a palette node with a size budget on ``baseline``, whose ptq leaf sets it);
- a leaf on its node, and a QAT leaf also on its node's parent (its weights are applied over that model);
- a compile on its leaf's conversion.

:func:`run_graph` starts every task whose dependencies have finished, as many as the caller's ``start`` allows
(a worker pool queues what it cannot run yet), and hands each finished task to ``finish`` in the calling thread,
so everything that writes the run folder's manifest runs in one thread. A task that fails stops the tasks that
depend on it (directly or not); every other task still runs to its end, and the first failure (in the graph's
order) is raised once nothing is left running.
"""

from __future__ import annotations

from concurrent.futures import FIRST_COMPLETED, Future, wait
from dataclasses import dataclass, field
from typing import Callable, Iterable, Mapping, Sequence

from edgedeploy.errors import EdgeDeployError
from edgedeploy.config.tree import LEAF_TABLE, NODE_TABLE, nodes_for

KINDS = ("compile", "leaf", "node")  # the order ready tasks start in: compiles and conversions first, so that
# their (short) work overlaps the training of the nodes still to come


@dataclass(frozen=True)
class GraphTask:
    id: str  # the stage id it records
    kind: str  # node, leaf or compile
    name: str  # the node or leaf
    target: str | None = None
    deps: tuple[str, ...] = ()


def node_id(name: str) -> str:
    return f"optimize/{name}"


def leaf_id(name: str) -> str:
    return f"convert/{name}"


def compile_id(leaf: str, target: str) -> str:
    return f"compile/{leaf}/{target}"


def build_graph(leaves: Sequence[str], targets: Sequence[str] = (), *, palette_budget: bool = False) -> dict[str, GraphTask]:
    """Every task the leaves (and their compiles for ``targets``) need, in the order a one-at-a-time run takes
    them: nodes parents first, then the leaves, then each leaf's compiles."""
    graph: dict[str, GraphTask] = {}
    for name in nodes_for(list(leaves)):
        node = NODE_TABLE[name]
        deps = [node_id(node.parent)] if node.parent else []
        if palette_budget and node.technique == "palette":
            deps.append(node_id("baseline"))
        graph[node_id(name)] = GraphTask(node_id(name), "node", name, deps=tuple(dict.fromkeys(deps)))
    for name in leaves:
        node = NODE_TABLE[LEAF_TABLE[name].node]
        deps = [node_id(node.name)] + ([node_id(node.parent)] if node.qat and node.parent else [])
        graph[leaf_id(name)] = GraphTask(leaf_id(name), "leaf", name, deps=tuple(deps))
    for name in leaves:
        for target in targets:
            graph[compile_id(name, target)] = GraphTask(compile_id(name, target), "compile", name, target,
                                                   deps=(leaf_id(name),))
    return graph


def descendants(graph: Mapping[str, GraphTask], task_id: str) -> list[str]:
    """The tasks that depend on ``task_id``, directly or through others (graph order)."""
    below: set[str] = {task_id}
    for t in graph.values():  # graph order puts every task after its dependencies
        if any(d in below for d in t.deps):
            below.add(t.id)
    return [t for t in graph if t in below and t != task_id]


def ready(graph: Mapping[str, GraphTask], done: Iterable[str], started: Iterable[str]) -> list[GraphTask]:
    """Tasks not started whose dependencies are all done: compiles first, then conversions, then nodes."""
    done, started = set(done), set(started)
    order = {t: i for i, t in enumerate(graph)}
    out = [t for t in graph.values() if t.id not in started and all(d in done for d in t.deps)]
    return sorted(out, key=lambda t: (KINDS.index(t.kind), order[t.id]))


@dataclass
class GraphRun:
    """How each task ended: done, failed (with its error) or skipped (a task it depends on failed)."""

    done: list[str] = field(default_factory=list)
    failed: dict[str, EdgeDeployError] = field(default_factory=dict)
    skipped: list[str] = field(default_factory=list)
    order: list[str] = field(default_factory=list)  # the order tasks started in


def run_graph(
    graph: Mapping[str, GraphTask],
    start: Callable[[GraphTask], "Future | None"],
    finish: Callable[[GraphTask, "Future | None"], None],
    *,
    raise_first: bool = True,
    before_wait: Callable[[], None] | None = None,
) -> GraphRun:
    """Run every task of ``graph``.

    ``start(task)`` begins a task and returns a future for its work (``None``: nothing left to wait for, e.g. a
    result reused from an earlier run); ``finish(task, future)`` records it once the future is done and raises
    :class:`~edgedeploy.errors.EdgeDeployError` when the task failed. Both run in this thread, as does
    ``before_wait()``, called once every ready task has started and before waiting for one to finish. Other
    exceptions (a bug, Ctrl-C) propagate at once; the caller's pools cancel what is still queued.
    """
    run = GraphRun()
    running: dict[Future, GraphTask] = {}
    blocked: set[str] = set()

    def fail(task: GraphTask, exc: EdgeDeployError) -> None:
        run.failed[task.id] = exc
        for below in descendants(graph, task.id):
            if below not in blocked:
                blocked.add(below)
                run.skipped.append(below)

    def settle(task: GraphTask, future: Future | None) -> None:
        try:
            finish(task, future)
        except EdgeDeployError as exc:
            fail(task, exc)
            return
        run.done.append(task.id)

    while True:
        nexts = ready(graph, run.done, set(run.order) | blocked)
        if nexts:
            task = nexts[0]
            run.order.append(task.id)
            try:
                future = start(task)
            except EdgeDeployError as exc:  # it could not start (``start`` recorded why)
                fail(task, exc)
                continue
            if future is None or future.done():
                settle(task, future)
            else:
                running[future] = task
            continue
        if not running:
            break
        if before_wait is not None:
            before_wait()
        finished, _ = wait(list(running), return_when=FIRST_COMPLETED)
        for future in sorted(finished, key=lambda f: list(graph).index(running[f].id)):
            settle(running.pop(future), future)
    if run.failed and raise_first:
        first = min(run.failed, key=list(graph).index)
        raise run.failed[first]
    return run
