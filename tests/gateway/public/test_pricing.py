"""The pricing page: per-token prices from the billing configuration, and the estimator of a
conversation's cost with and without the cache, checked against sums done by hand."""

from __future__ import annotations

import re
from decimal import Decimal

import asyncpg
from starlette.datastructures import QueryParams

from gateway.billing.config import BillingConfig, TokenPrices
from gateway.public import estimate
from tests.support.accounts import browser
from tests.support.site import site_app

PRICES = TokenPrices(input=Decimal("2"), cached_input=Decimal("0.2"), output=Decimal("8"))


def test_a_three_turn_conversation_costs_what_adding_up_its_turns_by_hand_gives() -> None:
    conv = estimate.Conversation(turns=3, history=1000, message=100, answer=200)
    got = estimate.estimate(conv, PRICES)
    # turn 1 sends 1000 + 100; turn 2 adds the first answer and a message: 1000 + 300 + 100,
    # of which 1300 are cached; turn 3: 1000 + 600 + 100, of which 1600 are cached.
    assert got.input_tokens == 1100 + 1400 + 1700
    assert got.cached_tokens == 1300 + 1600
    assert got.output_tokens == 3 * 200
    # without: 4200 input at $2/M + 600 output at $8/M = $0.0084 + $0.0048
    assert got.without_cache == Decimal("0.0132")
    # with: 1300 uncached at $2/M + 2900 cached at $0.2/M + 600 output at $8/M
    assert got.with_cache == Decimal("0.0026") + Decimal("0.00058") + Decimal("0.0048")
    assert round(got.saved_share, 4) == round(1 - 0.00798 / 0.0132, 4)


def test_one_turn_has_nothing_to_reuse() -> None:
    got = estimate.estimate(estimate.Conversation(1, 500, 50, 0), PRICES)
    assert got.cached_tokens == 0 and got.with_cache == got.without_cache
    assert got.saved_share == 0.0


def test_the_form_names_what_to_fix_and_keeps_the_defaults_for_it() -> None:
    conv, errors = estimate.parse(QueryParams("turns=0&history=-5&message=1e3&answer=7"))
    assert conv == estimate.Conversation(answer=7)
    assert set(errors) == {"turns", "history", "message"}
    assert "from 1 to 1,000" in errors["turns"]
    _, errors = estimate.parse(QueryParams("turns=" + "9" * 5000))
    assert "turns" in errors  # not a ValueError from int() of a huge string


async def test_pricing_shows_the_configured_per_token_prices_and_the_estimate(
    pg_pool: asyncpg.Pool,
) -> None:
    app = site_app(pg_pool, {"billing": BillingConfig(token_prices=PRICES)})
    async with browser(app) as client:
        page = await client.get("/pricing?turns=3&history=1000&message=100&answer=200")
        bad = await client.get("/pricing?turns=lots")
    html = page.text
    assert page.status_code == 200
    team = re.search(r'<tr data-plan="team">(.*?)</tr>', html, re.S)
    assert team is not None
    assert re.findall(r'data-price="(\w+)">([^<]+)<', team.group(1)) == [
        ("input", "$2.00"),
        ("cached_input", "$0.20"),
        ("output", "$8.00"),
    ]
    free = re.search(r'<tr data-plan="free">(.*?)</tr>', html, re.S)
    assert free is not None and "data-price" not in free.group(1)
    assert '<td id="cost-without">$0.0132</td>' in html
    assert '<td id="cost-with">$0.0080</td>' in html
    assert '<td id="cached-tokens">2,900</td>' in html
    assert bad.status_code == 400 and "Turns: a whole number from 1 to 1,000." in bad.text
    assert 'id="cost-with"' in bad.text  # the defaults are still estimated
