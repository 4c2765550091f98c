"""`kvgate bench multiturn`: multi-turn conversations against the tiers, end to end.

`command` is the click command; `workload` makes the conversations; `driver` plays them
against an OpenAI endpoint; `metrics` summarises a run; `stack` and `worker` start what a
configuration needs; `compare` runs every configuration; `noreuse` and `restore` are the
paired measurements beside it; `run` ties a comparison together; `report` and `docs` write
its tables, plots and `docs/benchmarks.md`.
"""
