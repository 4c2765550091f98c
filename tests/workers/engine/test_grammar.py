"""Grammar-constrained decoding in the engine: the tiny random Llama, SmolLM2's vocabulary."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import jsonschema
import pytest
import torch
import xgrammar as xgr

from tests.support.engine import run, run_together, tokens
from tests.support.worker import tiny_engine
from workers.engine.api import SamplingParams
from workers.engine.engine import TorchEngine
from workers.engine.grammar import GrammarError, Grammars, GrammarState, _apply_on_cpu
from workers.engine.tokenizer import Tokenizer, load_tokenizer

#: every value bounded, so that even random weights reach the end of the object (strings by
#: a pattern: xgrammar 0.2 lets raw control characters into maxLength strings, not JSON)
PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "pattern": "^[A-Za-z ]{1,12}$"},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "member": {"type": "boolean"},
        "color": {"enum": ["red", "green", "blue"]},
    },
    "required": ["name", "age", "member", "color"],
}


@pytest.fixture(scope="module")
def tokenizer(smollm2_gguf: Path) -> Tokenizer:
    return load_tokenizer(smollm2_gguf)


@pytest.fixture(scope="module")
def grammars(tokenizer: Tokenizer) -> Grammars:
    return Grammars.for_tokenizer(tokenizer.backend, vocab_size=49152, stop_token_ids=[2])


@pytest.fixture(scope="module")
def engine() -> Iterator[TorchEngine]:
    engine = tiny_engine(kv_pool_bytes=4 * 2**20)
    yield engine
    engine.close()


def _prompt(tokenizer: Tokenizer, text: str) -> list[int]:
    return tokenizer.encode(text)


@pytest.mark.parametrize("temperature", [0.0, 1.0])
async def test_output_follows_the_schema_and_ends_with_it(
    engine: TorchEngine, tokenizer: Tokenizer, grammars: Grammars, temperature: float
) -> None:
    grammar = grammars.json_schema(PERSON)
    for seed in range(3):
        sampling = SamplingParams(
            max_tokens=200, temperature=temperature, seed=seed, ignore_eos=True, grammar=grammar
        )
        events = await run(
            engine, f"p{temperature}-{seed}", _prompt(tokenizer, "A person:"), sampling
        )
        ids = tokens(events)
        # complete before max_tokens, even with ignore_eos: the grammar ends the request
        assert events[-1].finish_reason == "stop" and len(ids) < 200
        jsonschema.validate(json.loads(tokenizer.decode(ids)), PERSON)


async def test_max_tokens_still_ends_a_constrained_request(
    engine: TorchEngine, tokenizer: Tokenizer, grammars: Grammars
) -> None:
    grammar = grammars.json_schema({"type": "object", "properties": {"text": {"type": "string"}}})
    sampling = SamplingParams(max_tokens=7, temperature=0.0, grammar=grammar)
    events = await run(engine, "cut", _prompt(tokenizer, "Say:"), sampling)
    assert events[-1].finish_reason == "length" and len(tokens(events)) == 7
    assert tokenizer.decode(tokens(events)).startswith("{")


async def test_constrained_rows_leave_the_rest_of_the_batch_as_it_was(
    engine: TorchEngine, tokenizer: Tokenizer, grammars: Grammars
) -> None:
    """A free request decodes the same tokens beside constrained ones as alone."""
    free = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True)
    prompt = _prompt(tokenizer, "Once upon a time")
    alone = tokens(await run(engine, "alone", prompt, free))
    grammar = grammars.json_schema(PERSON)
    together = await run_together(
        engine,
        ("free", prompt, free),
        (
            "json-0",
            _prompt(tokenizer, "A"),
            SamplingParams(max_tokens=200, temperature=0.0, grammar=grammar),
        ),
        (
            "json-1",
            _prompt(tokenizer, "B"),
            SamplingParams(max_tokens=200, seed=1, grammar=grammar),
        ),
    )
    assert tokens(together[0]) == alone
    for events in together[1:]:
        jsonschema.validate(json.loads(tokenizer.decode(tokens(events))), PERSON)


def test_a_schema_that_cannot_compile_says_why(grammars: Grammars) -> None:
    with pytest.raises(GrammarError, match='Unsupported type "colour"'):
        grammars.json_schema({"type": "colour"})
    with pytest.raises(GrammarError, match="nope"):
        grammars.json_schema({"properties": {"a": {"$ref": "#/nope"}}})


@pytest.mark.parametrize(
    ("text", "taken"),
    [('{"a": [1, {"b": null}], "c": "d"}', True), ("{}", True), ("[1, 2]", False), ('"x"', False)],
)
def test_json_object_takes_objects_and_nothing_else(
    tokenizer: Tokenizer, grammars: Grammars, text: str, taken: bool
) -> None:
    state = GrammarState(grammars.json_schema(None))
    assert all(state.accept(t) for t in tokenizer.encode(text)) == taken
    if taken:  # complete: only the end of the sequence is left
        assert state.accept(2) and state.terminated


@pytest.mark.parametrize("rows", [[0, 1, 2, 3], [1, 3]])
def test_the_cpu_mask_is_xgrammars_mask(rows: list[int]) -> None:
    """The numpy mask of :func:`constrain` on CPU forbids exactly the tokens xgrammar's own
    kernel forbids, in the rows named and no others, on a strided view of the logits too."""
    generator = torch.Generator().manual_seed(7)
    vocab = 1000  # not a multiple of 32: the last word is partly padding
    bitmask = torch.randint(
        -(2**31), 2**31 - 1, (4, (vocab + 31) // 32), dtype=torch.int32, generator=generator
    )
    wide = torch.randn(4, vocab + 5, generator=generator)
    ours, theirs = wide[:, :vocab], wide[:, :vocab].clone()
    before = ours.clone()
    _apply_on_cpu(ours, bitmask, rows)
    xgr.apply_token_bitmask_inplace(theirs, bitmask, vocab_size=vocab, indices=rows)
    assert torch.equal(ours, theirs)
    untouched = [r for r in range(4) if r not in rows]
    assert torch.equal(ours[untouched], before[untouched])
    assert bool(torch.isinf(ours[rows]).any())
