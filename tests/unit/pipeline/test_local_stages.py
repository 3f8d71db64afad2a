"""How :class:`LocalStages` hands queued stages to its workers, on stand-in workers (one thread each, stages that
record the thread they ran in), so neither TensorFlow nor a process is started."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from concurrent.futures.process import BrokenProcessPool

import pytest

from edgedeploy.errors import ToolFailedError
from edgedeploy.pipeline.runners import local
from edgedeploy.pipeline.runners.local import LocalStages


POOLS: list[ThreadPoolExecutor] = []  # every stand-in worker started by the running test
OUT = Path("stage-out")  # (never written: the stand-in stages write nothing)
STAGE = ("stage", {}, OUT)  # a stage's name, input models and output folder, as the driver submits them


@pytest.fixture
def runner(monkeypatch):
    # a worker is a one-thread pool; a stage's work is called as it is (no TensorFlow environment)
    def pool(max_workers, mp_context=None, initializer=None, initargs=()):
        POOLS.append(ThreadPoolExecutor(max_workers))
        return POOLS[-1]

    POOLS.clear()
    monkeypatch.setattr(local, "ProcessPoolExecutor", pool)
    monkeypatch.setattr(local, "run_work", lambda fn, *args: (fn(*args), None, None))
    stages = LocalStages(2)
    yield stages
    stages.close()


def _work(name, inputs, out, hold: threading.Event | None = None):
    """A stage: waits for ``hold`` (when given), then gives the thread it ran in."""
    if hold is not None:
        assert hold.wait(10)
    return threading.get_ident()


def _result(runner, future):
    """What ``runner.collect`` gives, within 10 s (a stage never started fails the test instead of hanging it)."""
    got: list = []
    collector = threading.Thread(target=lambda: got.append(runner.collect(future, OUT)[0]), daemon=True)
    collector.start()
    collector.join(10)
    assert got, "collect did not return: the stage never started"
    return got[0]


def test_a_leaf_runs_in_the_worker_that_trained_its_node(runner):
    hold = threading.Event()
    busy = runner.submit(_work, *STAGE, hold)  # the first worker, held
    node = runner.submit(_work, *STAGE)  # the second worker
    node_thread = _result(runner, node)
    hold.set()
    first_thread = _result(runner, busy)
    assert first_thread != node_thread
    # both workers are free: the leaf goes to its node's worker, other work to the first free one
    leaf = runner.submit(_work, *STAGE, after=node)
    other = runner.submit(_work, *STAGE)
    assert _result(runner, leaf) == node_thread
    assert _result(runner, other) == first_thread


def test_queued_work_waits_for_the_driver_and_then_takes_any_free_worker(runner):
    holds = [threading.Event(), threading.Event()]
    first, second = runner.submit(_work, *STAGE, holds[0]), runner.submit(_work, *STAGE, holds[1])
    queued = runner.submit(_work, *STAGE, after=second)  # asks for the second worker, which is busy
    assert not queued.running() and not queued.done()
    holds[0].set()
    first_thread = _result(runner, first)  # the driver collects: the queued stage starts on the free worker
    assert _result(runner, queued) == first_thread  # rather than wait for the worker it asked for
    holds[1].set()
    assert _result(runner, second) != first_thread


def test_a_worker_freed_while_the_driver_is_away_is_kept_for_the_next_submit(runner):
    holds = [threading.Event(), threading.Event()]
    node, busy = runner.submit(_work, *STAGE, holds[0]), runner.submit(_work, *STAGE, holds[1])
    waiting = runner.submit(_work, *STAGE)
    holds[0].set()
    assert node.result(10)  # done, not collected: the queued stage has not taken its worker
    assert not waiting.running() and not waiting.done()
    leaf = runner.submit(_work, *STAGE, after=node)
    runner.start_queued()
    assert _result(runner, leaf) == node.result()[0]  # not given to the stage queued before it
    holds[1].set()
    assert _result(runner, waiting) in (node.result()[0], busy.result()[0])


def test_close_cancels_queued_work(runner):
    hold = threading.Event()
    running = [runner.submit(_work, *STAGE, hold) for _ in range(2)]
    queued = runner.submit(_work, *STAGE)
    hold.set()
    for future in running:
        future.result(10)
    runner.close()
    assert queued.cancelled()


def test_collecting_a_queued_stage_outside_the_graph_starts_it_when_a_worker_frees(runner):
    hold = threading.Event()
    running = [runner.submit(_work, *STAGE, hold) for _ in range(2)]
    queued = runner.submit(_work, *STAGE)
    threading.Timer(0.2, hold.set).start()  # both workers finish later; nothing else submits or waits
    assert _result(runner, queued) in {f.result()[0] for f in running}


def _dies(name, inputs, out):  # what a pool raises for the work of a worker process that died
    raise BrokenProcessPool("a child process terminated abruptly")


def test_a_dead_worker_fails_its_stage_and_the_next_stage_there_gets_a_new_process(runner):
    first = _result(runner, runner.submit(_work, *STAGE))
    with pytest.raises(ToolFailedError) as err:
        runner.collect(runner.submit(_dies, *STAGE), OUT)
    assert err.value.exit_code == 6 and "jobs, now 2" in err.value.one_line()
    assert len(POOLS) == 1  # both ran in the first worker
    assert _result(runner, runner.submit(_work, *STAGE)) != first
    assert len(POOLS) == 2


def test_a_stage_whose_pool_cancelled_it_while_closing_ends_instead_of_hanging(runner):
    from concurrent.futures import CancelledError, Future

    stage = runner.submit(_work, *STAGE)
    assert stage.result(10)  # (the stand-in worker ran it)
    running, inner = Future(), Future()
    running.set_running_or_notify_cancel()  # as the runner marks a stage it hands to a worker
    inner.cancel()  # what a closing pool does with work it had not started
    runner._done(0, running, inner)
    with pytest.raises(CancelledError):
        running.result(1)
