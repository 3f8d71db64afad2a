"""Where stage work runs: in this process or a process pool (local) or on Ray."""
