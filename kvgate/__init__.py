"""kvgate: the composition root — CLI, settings, the single-machine stack, model fetch, benchmarks."""

__version__ = "0.1.0"
