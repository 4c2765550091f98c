"""Taking one option out of a raw argument list, before click (or SGLang) parses the rest."""

from __future__ import annotations

from collections.abc import Sequence


def pop_option(
    args: Sequence[str], name: str, *, before_dashes: bool = False
) -> tuple[str | None, list[str]]:
    """The value of ``name X`` / ``name=X`` in ``args`` (the last one given), and the other
    arguments in order. With ``before_dashes``, nothing after a ``--`` is looked at."""
    rest: list[str] = []
    value, i = None, 0
    while i < len(args):
        arg = args[i]
        if before_dashes and arg == "--":
            rest += args[i:]
            break
        if arg == name and i + 1 < len(args):
            value, i = args[i + 1], i + 2
            continue
        if arg.startswith(name + "="):
            value = arg.split("=", 1)[1]
        else:
            rest.append(arg)
        i += 1
    return value, rest
