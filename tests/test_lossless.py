"""Every lossless method against greedy, driven by the method registry: a method added to
decoders/methods/ is checked here without a line of its own, token for token against
autoregressive greedy (a float near-tie excepted and said: conftest.assert_greedy).

- On tiny-random (the fast tier): each method at its defaults on three prompts, at its paper's
  settings, with the budget ending after 1 and 5 tokens, and with an end token in its output;
  and each method at its defaults on a private tiny-random whose every linear is packed for
  oneDNN, as the embedded model's are. A random model's drafts are seldom accepted (on the first
  prompt, 24 tokens, only self_speculative commits two tokens at once: measured 2026-11-28), so
  the edges inside an accepted draft are checked where drafts are made to be accepted: by each
  method's own file (a fitted or mirrored drafter, a repeating prompt: test_eagle, test_kangaroo,
  test_layerskip, test_lookahead, test_prompt_lookup, test_token_tree, ...).
- On the embedded model (slow), 32 tokens at its paper's settings on a chat turn that copies
  from its prompt (a translation). At its defaults, every method is checked on the embedded
  model by tests/test_tour.py (the guided tour's recordings re-run on code, 48 tokens, against
  greedy), so each setting is decoded once on the embedded model, not twice.

The methods' own test files keep what is particular to them (their knobs' grids, their views,
their drafters)."""

from __future__ import annotations

import pytest
import torch

from conftest import assert_greedy, greedy
from decoders import METHODS, generate
from decoders.core.packing import PackedLinear
from decoders.engine import greedy_reference

BUDGET = 32
COPYING = "Translate to French: The cat sleeps on the warm windowsill, and the dog sleeps too."
LOSSLESS = [name for name, m in METHODS.items() if m.lossless and name != "autoregressive"]


def test_the_grid_covers_every_lossless_method():
    assert set(LOSSLESS) | {"autoregressive"} == {n for n, m in METHODS.items() if m.lossless}
    assert len(LOSSLESS) >= 11


# --- tiny-random: every method, its presets, the budget's and the end token's edges ----------------

TINY_PROMPTS = ["def fibonacci(n):", "Write a haiku about the sea.", "import numpy as np\n\n"]
TINY_BUDGET = 24


@pytest.mark.parametrize("method", LOSSLESS)
def test_every_lossless_method_matches_greedy_on_tiny(tiny, method):
    m = METHODS[method]
    runs = [(prompt, "defaults", TINY_BUDGET) for prompt in TINY_PROMPTS]
    runs += [(TINY_PROMPTS[0], preset, TINY_BUDGET) for preset in m.presets]
    runs += [(TINY_PROMPTS[0], "defaults", budget) for budget in (1, 5)]  # ends mid-draft
    for prompt, preset, budget in runs:
        prompt_ids = tiny.encode(prompt, chat=False)
        expected = greedy(tiny, prompt_ids, budget).token_ids  # decoded once per prompt
        res = generate(tiny, prompt_ids, method, budget, **m.preset(preset))
        assert res.token_ids == expected, (method, preset, prompt, budget)
        assert res.finish_reason == "length"


@pytest.fixture(scope="module")
def tiny_packed():
    """A private tiny-random whose every linear runs through oneDNN's packed kernel, as the
    embedded model's do: the shared one's decoder layers are under packing.MIN_PACKED and run
    through F.linear, so without this the fast tier would check the packed path in the LM head
    alone."""
    from decoders.core import models, packing

    if not packing.available():
        pytest.skip("this torch build has no oneDNN packed linear")
    saved, packing.MIN_PACKED = packing.MIN_PACKED, 0
    try:
        bundle = models._load(
            models.canonical_id("tiny-random"), torch.device("cpu"), torch.float32
        )
    finally:
        packing.MIN_PACKED = saved
    return bundle


def test_every_lossless_method_matches_greedy_on_a_fully_packed_tiny_model(tiny_packed):
    layers = [m for m in tiny_packed.model.modules() if isinstance(m, PackedLinear)]
    assert layers and all(m.packed_weight is not None for m in layers)
    prompt_ids = tiny_packed.encode(TINY_PROMPTS[0], chat=False)
    expected = greedy_reference(tiny_packed, prompt_ids, TINY_BUDGET)
    for method in LOSSLESS:
        assert_greedy(tiny_packed, generate(tiny_packed, prompt_ids, method, TINY_BUDGET), expected)


@pytest.mark.parametrize("method", LOSSLESS)
def test_an_end_token_inside_an_accepted_draft_stops_every_method_there(tiny, method):
    """The end token is one the method accepted as a draft (the second of a multi-token commit)
    where its run has one, else a token in the middle of its output: the run must stop right
    there, as greedy does, not at the draft's end. (On tiny-random most runs have none: see the
    module's docstring.)"""
    import dataclasses

    from decoders.core.events import Commit

    prompt_ids = tiny.encode(TINY_PROMPTS[0], chat=False)
    free = generate(tiny, prompt_ids, method, TINY_BUDGET)
    seen: list[int] = []
    eos = None
    for c in (e for e in free.events if isinstance(e, Commit)):
        if len(c.tokens) >= 2 and c.tokens[1] not in (*seen, c.tokens[0]):
            eos = c.tokens[1]
            break
        seen += c.tokens
    if eos is None:  # no multi-token commit: a token in the middle of the output
        eos = next(
            t for i, t in enumerate(free.token_ids) if i >= 5 and t not in free.token_ids[:i]
        )
    ended = dataclasses.replace(tiny, eos_ids=frozenset({eos}))
    res = generate(ended, prompt_ids, method, TINY_BUDGET)
    expected = greedy_reference(ended, prompt_ids, TINY_BUDGET)
    assert res.token_ids == expected and res.token_ids[-1] == eos, method
    assert res.finish_reason == "eos"


# --- the embedded model ----------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("method", LOSSLESS)
def test_every_lossless_method_matches_greedy_on_the_embedded_model(embedded, method):
    # the paper's settings (else the defaults) on the copying prompt; the defaults: test_tour
    preset = "paper" if "paper" in METHODS[method].presets else "defaults"
    prompt_ids = embedded.encode(COPYING, chat=True)
    res = generate(embedded, prompt_ids, method, BUDGET, **METHODS[method].preset(preset))
    assert_greedy(embedded, res, greedy(embedded, prompt_ids, BUDGET).token_ids)
    assert res.stats["tokens_per_target_forward"] >= 1.0 or method == "self_speculative"


@pytest.mark.parametrize("method", list(METHODS))
def test_every_method_emits_only_the_event_types_it_declares(tiny, method):
    """A method's declaration names the events its runs emit (beyond every run's): the views and
    the trace import rely on it. At its defaults, its presets and (where it samples) sampled."""
    from decoders.core.base import EVERY_RUN

    m = METHODS[method]
    runs = [{}, *(m.preset(p) for p in m.presets)]
    runs += [{"temperature": 1.0, "seed": 1}] if m.sampling else []
    seen: set[str] = set()
    for params in runs:
        seen |= {e.type for e in generate(tiny, TINY_PROMPTS[0], method, 16, **params).events}
    assert seen <= {*EVERY_RUN, *m.events}, sorted(seen - {*EVERY_RUN, *m.events})
    assert set(EVERY_RUN) <= seen
