"""What the user asks for: the tree table, key tables, recipe, project, targets, data and task."""

# The run folder a command or the Python API writes when none is given (a project file's own `out` wins).
DEFAULT_RUN_DIR = "edgedeploy-out"
