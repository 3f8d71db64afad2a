"""The core: files, processes, names, the manifest, the stage lifecycle and the task graph."""
