"""Several choices for one prompt (OpenAI's ``n``), as one stream of ``(index, delta)``.

The first choice runs alone; the others start when it ends. Its pages are in the radix
cache by then (the engine caches a request's full pages when it finishes), so choices
2..n compute only the prompt's last partial page and their own tokens: the prompt is
computed once, for about twice the time of one choice whatever ``n`` is. Their deltas
arrive interleaved, each tagged with its choice's index, as OpenAI streams them. The
prompt is one prompt: usage counts it once (:func:`combined_usage`).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncGenerator, AsyncIterator, Sequence
from contextlib import aclosing

from workers.context import WorkerContext
from workers.engine.api import GenerateRequest, TokenLogprobs
from workers.generation import TextDelta, Usage

#: one choice's delta, tagged with its index
Tagged = tuple[int, TextDelta]


async def choices(
    ctx: WorkerContext, requests: Sequence[GenerateRequest], stops: Sequence[str]
) -> AsyncGenerator[Tagged, None]:
    """The deltas of every request in ``requests``, each with its index, as they come."""
    head = ctx.start(requests[0], stops)
    async with aclosing(head):
        async for delta in head:
            yield 0, delta
    streams: list[AsyncIterator[TextDelta]] = []
    try:
        for request in requests[1:]:
            streams.append(ctx.start(request, stops))
    except BaseException:  # a refusal of a later choice: the ones started stop too
        for stream in streams:
            await stream.aclose()  # type: ignore[attr-defined]
        raise
    async for index, delta in _merged(streams):
        yield index + 1, delta


async def _merged(streams: Sequence[AsyncIterator[TextDelta]]) -> AsyncGenerator[Tagged, None]:
    """Every delta of ``streams``, tagged with the stream's index, in arrival order; a
    failure of one ends all, and leaving early closes every stream."""
    queue: asyncio.Queue[tuple[int, TextDelta | None, BaseException | None]] = asyncio.Queue()

    async def pump(index: int, stream: AsyncIterator[TextDelta]) -> None:
        try:
            async for delta in stream:
                queue.put_nowait((index, delta, None))
        except Exception as exc:
            queue.put_nowait((index, None, exc))
            return
        queue.put_nowait((index, None, None))

    tasks = [asyncio.create_task(pump(i, s)) for i, s in enumerate(streams)]
    try:
        for _ in range(len(tasks)):
            while True:
                index, delta, error = await queue.get()
                if error is not None:
                    raise error
                if delta is None:
                    break
                yield index, delta
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for stream in streams:
            closer = getattr(stream, "aclose", None)
            if closer is not None:
                with contextlib.suppress(Exception):
                    await closer()


async def collect_choices(items: AsyncIterator[Tagged], n: int) -> list[TextDelta]:
    """Run every choice to its end; per choice, one delta holding all its text."""
    texts: list[list[str]] = [[] for _ in range(n)]
    ids: list[list[int]] = [[] for _ in range(n)]
    logprobs: list[list[TokenLogprobs]] = [[] for _ in range(n)]
    finals: list[TextDelta | None] = [None] * n
    async with aclosing(items):  # type: ignore[type-var]
        async for index, delta in items:
            texts[index].append(delta.text)
            ids[index].extend(delta.token_ids)
            logprobs[index].extend(delta.logprobs)
            if delta.finish_reason is not None:
                finals[index] = delta
    out = []
    for index, final in enumerate(finals):
        assert final is not None, f"choice {index} ended without a finish reason"
        text = "".join(texts[index])
        out.append(TextDelta(text, ids[index], final.usage, final.finish_reason, logprobs[index]))
    return out


def combined_usage(usages: Sequence[Usage]) -> Usage:
    """One request's usage over its choices: the prompt (and what of it was cached) once,
    the completions summed."""
    first = usages[0]
    return Usage(
        first.prompt_tokens,
        sum(u.completion_tokens for u in usages),
        first.cached_tokens,
        first.cached_by_tier,
    )
