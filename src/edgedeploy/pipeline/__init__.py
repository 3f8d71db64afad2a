"""The driver level: compile, walk and sweep over the task graph, and the stage runners."""
