"""Run the stages of the deployment tree (train a node, convert a leaf) as Ray tasks.

``optimize(..., executor="ray")`` hands each stage's work to a Ray task and waits for it; everything around
the work (cache keys, staging folders, the manifest) stays in the driver, so a stage run on Ray is recorded
and reused exactly as a local one. The task gets the stage function, the loaded data set (with its soft
targets) and the recipe through Ray's object store, loads TensorFlow in the worker, seeds it as a local stage
does, and writes its outputs into the stage's staging folder inside the run folder: the workers must see the
run folder at the same path (a local Ray head, or a cluster whose nodes mount it). ``ray.init`` joins the
cluster named by ``ray_address`` or ``RAY_ADDRESS``, or starts a local Ray instance.
"""

from __future__ import annotations

import os
from typing import Any, Callable

from .ray_executor import import_ray, init_ray


def _call_with_env(fn: Callable[..., Any], *args: Any) -> Any:
    """Runs inside a Ray worker: ``fn(env, *args)`` with this worker's TensorFlow environment."""
    from . import tfenv

    return fn(tfenv.load(), *args)


class RayStages:
    """Run ``fn(env, *args)`` as one Ray task at a time; Ray starts on the first call."""

    def __init__(self, address: str | None = None) -> None:
        self._ray = import_ray()
        self._address = address or os.environ.get("RAY_ADDRESS")
        self._task = None
        self._started_here = False

    def call(self, fn: Callable[..., Any], *args: Any) -> Any:
        ray = self._ray
        if self._task is None:
            if not ray.is_initialized():
                kwargs: dict[str, Any] = {"include_dashboard": False, "log_to_driver": False, "logging_level": "ERROR"}
                if self._address:
                    kwargs["address"] = self._address
                init_ray(ray, kwargs, self._address)
                self._started_here = True
            self._task = ray.remote(num_cpus=1, max_retries=0)(_call_with_env)
        try:
            return ray.get(self._task.remote(fn, *args))
        except ray.exceptions.RayTaskError as exc:  # the stage's own error (typed), raised here as it was there
            cause = exc.as_instanceof_cause()
            raise (cause.cause if getattr(cause, "cause", None) is not None else cause) from None

    def close(self) -> None:
        if self._started_here and self._ray.is_initialized():
            from .ray_executor import shutdown_ray

            shutdown_ray(self._ray)
        self._started_here = False
        self._task = None
