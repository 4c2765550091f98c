"""One serving process per GPU (or CPU): the worker agent and the engines it fronts."""
