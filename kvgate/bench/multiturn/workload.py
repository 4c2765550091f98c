"""Seeded synthetic multi-turn conversations for ``kvgate bench multiturn``.

Two named shapes (:data:`WORKLOADS`). ``chat`` follows public multi-turn serving
benchmarks: a system prompt shared by every conversation, a unique document in the first
user turn (lognormal length), short user messages and answers of 80-120 tokens. ``docqa``
is the prefill-bound shape tiered-cache projects use for their headline figures: a
document of 3-6k tokens, then questions of 50-100 tokens answered in 1-8 tokens. Answers
are as long as the server is told to make them (``min_tokens`` = ``max_tokens``). Text is drawn from the word list below with a seeded generator, so a seed
names the same workload on every machine; the answers are whatever the server says and
are appended to the history by the driver.

Sizes are in tokens of the SmolLM2 tokenizer: every word of the list is chosen to be one
token with its leading space (checked by a test), so ``n`` words are ``n`` tokens.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, replace

_WORD_TEXT = """
    the of and to in is was for on that with as by at from his an be this are or had not
    but have were which one all their has they been would who its more when there some out
    up other into also time than only first new two may after over most many where these
    such any about can made then world like between state both during later year three
    under while being through work well part each city before because people house water
    long down life way back day man family found small system group used own high same
    history name number school since great around area often against field road land end
    game public left power name local still line early second home light music place
    river north south east west order book point side story team open war form hand head
    town body death market sound party black white green blue red stone wood iron glass
    paper money value price trade power letter word voice color table window door garden
    tree flower bird horse fish animal forest mountain island ocean valley bridge tower
    church castle village street station train ship plane car engine machine tool metal
    energy heat cold fire earth air rain snow wind storm cloud sun moon star night morning
    summer winter spring season month week hour minute moment future past present reason
    method result answer question problem idea theory fact model plan rule law court king
    queen prince army soldier battle peace general captain leader member union company
    office bank report paper press film show stage art song dance play sport player
"""
#: Common English words, each one SmolLM2 token with its leading space.
WORDS: tuple[str, ...] = tuple(dict.fromkeys(_WORD_TEXT.split()))


@dataclass(frozen=True)
class Shape:
    """Token counts of a workload; the defaults are the shape every published figure uses."""

    common_prefix: int = 500
    unique_prefix_mean: int = 1000
    unique_prefix_max: int = 3000
    #: sigma of the underlying normal of the lognormal first-turn document
    unique_prefix_sigma: float = 0.6
    user_tokens: tuple[int, int] = (120, 160)
    answer_tokens: tuple[int, int] = (80, 120)
    turns: tuple[int, int] = (6, 9)
    #: when set, the first-turn document is drawn uniformly from this range instead
    unique_prefix_range: tuple[int, int] | None = None


#: The named workloads of ``--workload``: ``chat`` is the shape every earlier figure used;
#: ``docqa`` is a document of 3-6k tokens and 6-10 questions about it (the first one asked
#: with the document), each answered in 1-8 tokens.
WORKLOADS: dict[str, Shape] = {
    "chat": Shape(),
    "docqa": Shape(
        common_prefix=64, unique_prefix_mean=4500, unique_prefix_max=6000,
        user_tokens=(50, 100), answer_tokens=(1, 8), turns=(6, 10),
        unique_prefix_range=(3000, 6000),
    ),
}  # fmt: skip


@dataclass(frozen=True)
class Turn:
    """One user turn: the message to send and the answer length to ask for."""

    user: str
    answer_tokens: int


@dataclass(frozen=True)
class Conversation:
    """A conversation's fixed part; the server's answers are added as it is played."""

    cid: str
    system: str
    turns: tuple[Turn, ...]
    #: tokens of the unique first-turn document (for reports)
    unique_tokens: int = 0

    def tokens(self, turns: int) -> int:
        """KV tokens of its first ``turns`` turns, answers at their asked length (every word
        is one token; the chat template's few role tokens are left out)."""
        played = self.turns[:turns]
        return len(self.system.split()) + sum(len(t.user.split()) + t.answer_tokens for t in played)


def words(rng: random.Random, n: int) -> str:
    """``n`` words (``n`` SmolLM2 tokens) of deterministic filler text."""
    return " ".join(rng.choice(WORDS) for _ in range(n))


def lognormal_tokens(rng: random.Random, mean: int, maximum: int, sigma: float) -> int:
    """A lognormal draw with the given mean (not median), clipped to ``[1, maximum]``."""
    mu = math.log(mean) - sigma * sigma / 2
    return max(1, min(maximum, round(rng.lognormvariate(mu, sigma))))


def conversations(count: int, shape: Shape = Shape(), seed: int = 0) -> list[Conversation]:
    """``count`` conversations of ``shape``; the same ``seed`` gives the same list."""
    system = words(random.Random(f"common-{seed}"), shape.common_prefix)
    out = []
    for i in range(count):
        rng = random.Random(f"conversation-{seed}-{i}")
        if shape.unique_prefix_range is not None:
            n_unique = rng.randint(*shape.unique_prefix_range)
        else:
            n_unique = lognormal_tokens(
                rng, shape.unique_prefix_mean, shape.unique_prefix_max, shape.unique_prefix_sigma
            )
        turns = []
        for t in range(rng.randint(*shape.turns)):
            message = words(rng, rng.randint(*shape.user_tokens))
            if t == 0:
                message = words(rng, n_unique) + "\n\n" + message
            turns.append(Turn(message, rng.randint(*shape.answer_tokens)))
        out.append(Conversation(f"c{seed}-{i}", system, tuple(turns), n_unique))
    return out


def single_history(tokens: int, seed: int, shape: Shape = Shape()) -> Conversation:
    """One conversation whose first turn carries about ``tokens`` tokens of history.

    Used by the restore-vs-resident measurement: the history is the common prefix plus one
    document, and the turn after it is an ordinary user message.
    """
    rng = random.Random(f"history-{seed}-{tokens}")
    conv = conversations(1, replace(shape, turns=(2, 2)), seed)[0]
    doc = words(rng, max(1, tokens - shape.common_prefix))
    first = Turn(doc, 1)
    follow = Turn(words(rng, shape.user_tokens[0]), 1)
    return replace(conv, cid=f"h{seed}-{tokens}", turns=(first, follow), unique_tokens=len(doc))
