"""Every lossless method against greedy on the embedded model, driven by the method registry: a
method added to decoders/methods/ is checked here without a line of its own. Each method runs at
its defaults on three kinds of prompt (code, chat, a translation that copies from its prompt)
and at its paper's settings on the code prompt, token for token against autoregressive greedy
(a float near-tie excepted and said: conftest.assert_greedy). The methods' own test files keep
the edges (an end token inside a draft, the budget reached mid-draft, empty pools) on
tiny-random, where a grid is cheap; LayerSkip, lossless against the exit-tuned model's own
greedy, has its test in test_layerskip.py."""

from __future__ import annotations

import pytest
from test_prompt_lookup import humaneval

from conftest import assert_greedy
from decoders import METHODS, generate
from decoders.engine import greedy_reference

pytestmark = pytest.mark.slow

BUDGET = 48
PROMPTS = {
    "code": humaneval(0),
    "chat": "Give me three tips for writing clear emails.",
    "copy": "Translate to French: The cat sleeps on the warm windowsill, and the dog sleeps too.",
}
# Lossless on the embedded model as it is (LayerSkip is lossless against the tuned model's greedy)
LOSSLESS = [
    name
    for name, m in METHODS.items()
    if m.lossless and name not in ("autoregressive", "layerskip")
]
# These draft well enough on code to verify more than one token per forward at their defaults.
DRAFTING_ON_CODE = {"prompt_lookup", "speculative", "token_tree", "lookahead", "kangaroo", "space"}


_references: dict[tuple[int, str], tuple[list[int], list[int]]] = {}


def reference(bundle, kind: str) -> tuple[list[int], list[int]]:
    """The prompt's ids and greedy's tokens for it (once per prompt for the whole grid)."""
    key = (id(bundle.model), kind)
    if key not in _references:
        prompt_ids = bundle.encode(PROMPTS[kind], chat=True)
        _references[key] = prompt_ids, greedy_reference(bundle, prompt_ids, BUDGET)
    return _references[key]


def test_the_grid_covers_every_lossless_method():
    assert set(LOSSLESS) | {"autoregressive", "layerskip"} == {
        n for n, m in METHODS.items() if m.lossless
    }
    assert len(LOSSLESS) >= 11


@pytest.mark.parametrize("method", LOSSLESS)
def test_every_lossless_method_matches_greedy_on_the_embedded_model(embedded, method):
    runs = [(kind, "defaults") for kind in PROMPTS]
    if "paper" in METHODS[method].presets:
        runs.append(("code", "paper"))
    for kind, preset in runs:
        prompt_ids, expected = reference(embedded, kind)
        params = METHODS[method].preset(preset)
        res = generate(embedded, prompt_ids, method, BUDGET, **params)
        assert_greedy(embedded, res, expected)
        assert res.stats["tokens_per_target_forward"] >= 1.0 or method == "self_speculative"
        if kind == "code" and preset == "defaults" and method in DRAFTING_ON_CODE:
            assert res.stats["tokens_per_target_forward"] > 1.0, (method, res.stats)
