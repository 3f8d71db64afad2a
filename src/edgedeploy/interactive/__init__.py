"""The Python API for notebooks and scripts: :func:`.optimize_run.optimize` and the objects it returns
(:class:`.optimize_run.OptimizeRun`, :class:`.report_view.Report`). ``import edgedeploy`` exposes them without importing
TensorFlow."""
