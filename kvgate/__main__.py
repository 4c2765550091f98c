"""``python -m kvgate``: the same CLI as the ``kvgate`` console script.

The supervisor starts its children this way so that they run under the very interpreter
(and virtual environment) of ``kvgate up``, whatever is first on ``PATH``.
"""

from kvgate.cli import main

main()
