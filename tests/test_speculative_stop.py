"""Speculative decoding's draft stops: the confidence stop (EAGLE-2's confidence as a proxy for
acceptance) is lossless, stops where it says and samples the target's distribution; the cost
schedule (schedule=cost) is lossless and keeps drafting only while the next token pays for its
input; a run without a stop records no stop events.
"""

import pytest
from test_speculative import (
    CHI2_9DOF_1E3,
    bin_counts,
    by_step,
    next_token_probs,
    one_torch_thread,  # noqa: F401  (autouse)
    pit,
    same_as_greedy,
    uniformity_chi2,
)

from conftest import PROMPTS
from decoders import generate, load_model
from decoders.core import costs
from decoders.core.events import Draft, DraftStop
from decoders.core.prices import PriceTable

# --- the confidence stop (EAGLE-2's confidence as a proxy for acceptance) ---------------------------


@pytest.mark.slow
@pytest.mark.parametrize(
    ("draft", "stop", "gamma"),
    [("self:1", 0.3, 6), ("self:2", 0.6, 8), ("tiny-random-2", 0.5, 4), ("eagle", 0.95, 6)],
)
def test_the_confidence_stop_is_lossless_and_stops_where_it_says(tiny, draft, stop, gamma):
    for prompt in PROMPTS[:3]:
        res = same_as_greedy(tiny, prompt, 40, draft=draft, gamma=gamma, stop=stop)
        stops = [e for e in res.events if isinstance(e, DraftStop)]
        drafts = {e.step: e for e in res.events if isinstance(e, Draft)}
        assert stops and all(s.threshold == stop for s in stops)
        for s in stops:
            d = drafts.get(s.step)
            assert len(s.confidences) == (len(d.tokens) if d else 0)
            # Every token but the last was confident enough to draft after it.
            assert all(c >= stop for c in s.confidences[:-1])
            assert (s.reason == "confidence") == (bool(s.confidences) and s.confidences[-1] < stop)
        assert any(s.reason == "confidence" for s in stops)


# --- schedule=cost: draft while the next token pays for its input -------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("draft", ["self:2", "tiny-random", "tiny-random-2", "eagle"])
@pytest.mark.parametrize("cost", [0.0, 0.05, 0.3, 10.0])
def test_the_cost_schedule_is_lossless_and_keeps_only_paying_tokens(tiny, monkeypatch, draft, cost):
    # The measured per-input cost, pinned for this model so each case is deterministic.
    monkeypatch.setitem(costs._tables, id(tiny.model), PriceTable.linear(tiny.model_id, cost))
    gamma, budget = 6, 30
    for prompt in PROMPTS[:3]:
        res = same_as_greedy(tiny, prompt, budget, draft=draft, gamma=gamma, schedule="cost")
        stops = {e.step: e for e in res.events if isinstance(e, DraftStop)}
        done = 0
        for step, ev in by_step(res).items():
            cap = min(gamma, budget - done - 1)
            if step:  # why each draft ended: the cost rule whenever it ended short of the cap
                kept = len(ev["draft"].tokens) if "draft" in ev else 0
                assert len(stops[step].confidences) == kept
                assert (stops[step].reason == "cost") == (kept < cap), (kept, cap)
            if step and "draft" in ev:
                d = ev["draft"]
                assert 1 <= len(d.tokens) <= cap
                path, total = 1.0, 0.0
                for n, q in enumerate(d.probs):  # each kept token paid, given those before it
                    path *= q
                    assert costs.pays(path, total, n, cost) or cost == 0.0, (path, total, n)
                    total += path
                if cost == 0.0:  # free inputs: the full cap, as schedule=fixed
                    assert len(d.tokens) == cap
            elif step and cap > 0:  # nothing paid: one target token
                assert cost > 0 and ev["commit"].origins == ("target",)
            done += len(ev["commit"].tokens)
        if cost == 10.0:  # an input dearer than a forward: never a draft
            assert not any(isinstance(e, Draft) for e in res.events)


def test_without_a_stop_no_stop_events_are_recorded(tiny):
    res = same_as_greedy(tiny, PROMPTS[0], 16, draft="self:2")
    assert not any(isinstance(e, DraftStop) for e in res.events)


@pytest.mark.slow
def test_sampling_with_the_confidence_stop_follows_the_target_distribution(tiny):
    """The stop decides how many drafted tokens are verified from the draft alone, so every
    kept token still follows the target: the third token (verified inside a draft that the stop
    may cut) is tested against the target's exact distribution given the first two."""
    prompt_ids = tiny.encode(PROMPTS[1], chat=False)
    runs = [
        generate(
            tiny,
            prompt_ids,
            "speculative",
            4,
            temperature=1.0,
            seed=s,
            draft="tiny-random-2",
            gamma=3,
            schedule="fixed",
            stop=0.2,
        )
        for s in range(240)
    ]
    assert all(len(r.token_ids) == 4 for r in runs)
    reasons = {s.reason for r in runs for s in r.events if isinstance(s, DraftStop)}
    assert "confidence" in reasons and reasons - {"confidence"}  # the stop both cuts and not
    contexts = [[*prompt_ids, *r.token_ids[:2]] for r in runs]
    p = next_token_probs(tiny, contexts, 1.0)
    q = next_token_probs(load_model("tiny-random-2"), contexts, 1.0)
    thirds = [r.token_ids[2] for r in runs]
    u = pit(thirds, p, (q / p.clamp_min(1e-300)).log(), seed=5)
    assert uniformity_chi2(u) < CHI2_9DOF_1E3, bin_counts(u)
