import dataclasses

import pytest

from decoders.core.events import Commit, Draft, Forward, Verify
from decoders.core.prices import PriceTable
from decoders.core.stats import compute_stats, pooled_acceptance


def test_autoregressive_stats():
    events = [Forward(0, "prefill", 10, 30, 50.0), Commit(0, (1,), ("target",), (0.9,))]
    for step in range(1, 4):
        events += [Forward(step, "target", 1, 30, 20.0), Commit(step, (step,), ("target",), (0.5,))]
    s = compute_stats(events, wall_s=0.2)
    assert s["new_tokens"] == 4
    assert s["target_forwards"] == 4
    assert s["tokens_per_target_forward"] == 1.0
    assert s["mean_acceptance_length"] is None
    # the prefill's 50 ms apart: 4 tokens in the 150 ms after it; the first token's wait alone
    assert s["tokens_per_s"] == round(4 / 0.15, 4)
    assert s["ttft_s"] == 0.05
    assert s["time_ms"] == {"prefill": 50.0, "target": 60.0}
    assert s["work"] is None  # no price table: the work is not priced
    priced = compute_stats(events, 0.2, PriceTable.linear("m", 0.05))
    assert priced["work"] == 3.0 and priced["modelled_speedup"] == 1.0  # one forward a token
    # Where autoregressive's own step was measured dearer or cheaper than a bare forward, it is
    # still 1.00x of itself, per run and pooled (a benchmark's row)
    table = dataclasses.replace(
        PriceTable.linear("m", 0.05), methods={"autoregressive": (0.77, 0.02)}
    )
    mine = compute_stats(events, 0.2, table, "autoregressive")
    assert mine["modelled_speedup"] == 1.0
    assert pooled_acceptance([mine, priced])["modelled_speedup"] == 1.0


def test_work_is_priced_by_the_table_whatever_the_clock_said():
    """A verify forward by its inputs and layers, a trained drafter's forward by its measured
    price, the target's first layers by the depth rule; the prefill not at all; the forwards'
    wall times change nothing."""
    table = dataclasses.replace(
        PriceTable.linear("m", 0.05, fixed_share=0.2), drafters={"eagle": 0.1}
    )
    events = [
        Forward(0, "prefill", 10, 30, 1.0),
        Commit(0, (7,), ("target",), (1.0,)),
        Forward(1, "draft", 1, 1, 1.0),
        Forward(1, "draft", 2, 1, 1.0),
        Draft(1, "eagle (1 trained layer)", (1, 2, 3), (-1, 0, 0), (0.9, 0.8, 0.7)),
        Forward(1, "verify", 4, 30, 1.0),
        Verify(1, (0,), 9, "greedy-tree"),
        Commit(1, (1, 9), ("draft", "correction"), (1.0, 1.0)),
        Forward(2, "draft", 1, 15, 1.0),
        Draft(2, "self:15 (first 15 of 30 layers)", (4,), (-1,), (0.5,)),
        Forward(2, "verify", 2, 30, 1.0),
        Verify(2, (0,), 8, "greedy-chain"),
        Commit(2, (4, 8), ("draft", "correction"), (1.0, 1.0)),
    ]
    s = compute_stats(events, prices=table)
    eagle = 0.1 * 1.0 + 0.1 * 1.05  # its price, times what a forward of that many inputs costs
    verify = 1.15 + 1.05  # 4 inputs, then 2
    self_draft = 0.2 + 0.8 * 15 / 30  # half the layers, and the part outside them
    assert s["work"] == round(eagle + verify + self_draft, 3)
    assert s["modelled_speedup"] == round(4 / (eagle + verify + self_draft), 4)
    slow = [dataclasses.replace(e, wall_ms=99.0) if isinstance(e, Forward) else e for e in events]
    assert compute_stats(slow, prices=table)["work"] == s["work"]
    # what drafting cost a verify step: 3 draft forwards over 2 steps, priced as above
    assert s["draft_work"] == round(eagle + self_draft, 4)
    assert s["draft_forwards_per_step"] == 1.5
    assert s["draft_work_per_step"] == round((eagle + self_draft) / 2, 4)
    pooled = pooled_acceptance([s, s])
    assert pooled["modelled_speedup"] == pytest.approx(8 / (2 * s["work"]), abs=1e-4)
    assert pooled["draft_forwards_per_step"] == 1.5
    assert pooled["draft_work_per_step"] == pytest.approx((eagle + self_draft) / 2, abs=1e-4)
    unpriced = compute_stats(events)
    assert unpriced["draft_forwards_per_step"] == 1.5 and unpriced["draft_work_per_step"] is None


def test_acceptance_metrics_follow_the_serving_definitions():
    events = [
        Forward(0, "prefill", 10, 30, 1.0),
        Commit(0, (7,), ("target",), (1.0,)),
        # step 1: 3 chained drafts, 2 accepted + correction
        Forward(1, "draft", 1, 8, 1.0),
        Draft(1, "self:8", (1, 2, 3), (-1, 0, 1), (0.9, 0.8, 0.7)),
        Forward(1, "verify", 4, 30, 1.0),
        Verify(1, (0, 1), 9, "greedy-chain"),
        Commit(1, (1, 2, 9), ("draft", "draft", "correction"), (1.0, 1.0, 1.0)),
        # step 2: a tree of depth 2 (4 nodes), nothing accepted
        Draft(2, "self:8", (4, 5, 6, 7), (-1, -1, 0, 1), (0.5, 0.4, 0.3, 0.2), copied=(1, 3)),
        Forward(2, "verify", 5, 30, 1.0),
        Verify(2, (), 8, "greedy-tree"),
        Commit(2, (8,), ("correction",), (1.0,)),
    ]
    s = compute_stats(events)
    assert s["new_tokens"] == 5
    assert s["target_forwards"] == 3
    assert s["draft_forwards"] == 1
    assert s["verify_steps"] == 2
    assert s["accepted_drafts"] == 2
    assert s["mean_acceptance_length"] == 2.0  # 1 + 2 accepted / 2 verify steps
    assert s["draft_acceptance_rate"] == round(2 / 7, 4)
    # position 0 drafted in both steps, accepted once; 1 drafted twice, accepted once; 2 once, never
    assert s["acceptance_by_position"] == [0.5, 0.5, 0.0]
    assert s["acceptance_histogram"] == [1, 0, 1]
    # vLLM's per-position acceptance: steps that accepted at least i + 1 drafts, of all steps
    assert s["acceptance_per_position"] == [0.5, 0.5]
    assert s["acceptance_histogram_by_draft_length"] == {"3": [0, 0, 1], "4": [1]}
    assert s["draft_sources"] == {
        "copied": {"drafted": 2, "accepted": 0, "draft_acceptance_rate": 0.0, "draft_ms": 0.0},
        "self:8": {"drafted": 5, "accepted": 2, "draft_acceptance_rate": 0.4, "draft_ms": 1.0},
    }
    assert s["origins"] == {"target": 1, "draft": 2, "correction": 2}


def _accepted_then_end(bundle, method, params):
    """A run whose end token is a draft token accepted with more accepted drafts after it: the
    first step that committed two or more drafts, rerun with its first draft token as the EOS."""
    import dataclasses

    from decoders import generate

    prompt = "def fibonacci(n):"
    plain = generate(bundle, prompt, method, 24, chat=False, **params)
    for c in (e for e in plain.events if isinstance(e, Commit) and e.step > 0):
        drafted = [t for t, o in zip(c.tokens, c.origins, strict=True) if o == "draft"]
        if len(drafted) >= 2:
            ended = dataclasses.replace(bundle, eos_ids=frozenset({drafted[0]}))
            return generate(ended, prompt, method, 24, chat=False, **params), drafted[0]
    raise AssertionError(f"{method}: no step committed two drafts")


from decoders import METHODS  # noqa: E402


@pytest.mark.parametrize(
    ("method", "params"),
    [  # the chain and the tree verifiers (steps.judge_chain, steps.verify_tree)
        ("speculative", {"draft": "tiny-random"}),  # the target drafting for itself
        ("token_tree", {"draft": "tiny-random", "shape": "static"}),
    ],
)
def test_an_accepted_end_token_ends_the_accepted_drafts_too(tiny, method, params):
    """Drafts the verifier accepted after an end token are never written: the Verify event stops
    at the end token, with no correction, and every acceptance metric counts what was written."""
    res, eos = _accepted_then_end(tiny, method, params)
    assert res.finish_reason == "eos" and res.token_ids[-1] == eos
    last = [e for e in res.events if isinstance(e, Verify)][-1]
    draft = next(e for e in res.events if isinstance(e, Draft) and e.step == last.step)
    assert draft.tokens[last.accepted[-1]] == eos and last.correction is None
    written = sum(o == "draft" for e in res.events if isinstance(e, Commit) for o in e.origins)
    assert res.stats["accepted_drafts"] == written
    assert sum(i * n for i, n in enumerate(res.stats["acceptance_histogram"])) == written
    # The views draw the drafts after it as never written, not as accepted or rejected.
    from visualizer.panels import method_panel

    if len(draft.tokens) > len(last.accepted):
        drawn = method_panel(METHODS[method].views, res.events, {}, last.step).to_json()
        assert "never written" in drawn
