"""Running SGLang as a kvgate worker: its command line, its process, its health and load.

Nothing here imports SGLang or torch: the launcher only builds a command line and runs it,
so ``--dry-run`` works on any machine. SGLang loads our storage backend
(``tiering.sglang.backend``) inside its own process.
"""
