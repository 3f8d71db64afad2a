"""The Python API for notebooks and scripts: :func:`.run.optimize` and the objects it returns
(:class:`.run.OptimizeRun`, :class:`.report_view.Report`). ``import edgedeploy`` exposes them without importing
TensorFlow."""
