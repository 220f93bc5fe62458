"""SpecDec's relaxed verification (Relax in decoders/core/sampling.py) and FREE
(decoders/methods/free.py).

- relaxed verification: β = 1 is the exact rule, β > 1 keeps top-β drafts within τ and marks
  them, greedy only and claiming nothing;
- FREE: never exiting is greedy, exited tokens wait for the next deep token, the parallel catch-up
  gives the deep states of one by one, the β-mixture threshold adapts, and its views.
"""

from __future__ import annotations

import pytest
import torch
from test_calm import (
    exits_of,
    greedy,
    one_torch_thread,  # noqa: F401  (autouse)
)

from conftest import KERNEL_TOL as TOL
from conftest import PROMPTS
from decoders import METHODS, InvalidParameter, generate
from decoders.core.events import CatchUp, Commit, Forward, Verify
from decoders.core.runtime import forward, new_cache
from decoders.core.sampling import Relax
from decoders.core.verify import greedy_chain, greedy_tree

# --- relaxed verification --------------------------------------------------------------------------


def rows(*best: list[float]) -> torch.Tensor:
    """Logit rows over a 6-token vocabulary."""
    return torch.tensor([list(r) for r in best])


def test_beta_one_is_the_exact_rule():
    logits = rows([0, 5, 4.5, 0, 0, 0], [0, 0, 0, 5, 0, 0], [1, 0, 0, 0, 0, 0])
    exact = greedy_chain([2, 3], logits)
    same = greedy_chain([2, 3], logits, Relax(1, 10.0) or None)
    assert exact == same and exact.accepted == () and exact.correction == 1


def test_a_top_beta_draft_within_tolerance_is_kept_and_marked():
    logits = rows([0, 5, 4.5, 0, 0, 0], [0, 0, 0, 5, 0, 0], [1, 0, 0, 0, 0, 0])
    v = greedy_chain([2, 3], logits, Relax(2, 1.0))
    assert v.accepted == (0, 1) and v.relaxed == (0,) and v.tokens == (2, 3, 0)
    assert v.origins == ("relaxed", "draft", "bonus") and v.rule == "relaxed-top-2"
    # outside τ, or outside the top β: rejected as by the exact rule
    assert greedy_chain([2, 3], logits, Relax(2, 0.4)).accepted == ()
    assert greedy_chain([4, 3], logits, Relax(5, 0.1)).accepted == ()


def test_in_a_tree_the_exact_child_wins_then_the_likeliest_allowed_one():
    logits = rows([0, 5, 4.8, 4.9, 0, 0], [0] * 6, [0] * 6, [0] * 6)
    exact_first = greedy_tree([2, 1, 3], [-1, -1, -1], logits, Relax(3, 1.0))
    assert exact_first.accepted == (1,) and exact_first.relaxed == ()
    likeliest = greedy_tree([2, 3, 4], [-1, -1, -1], logits, Relax(3, 1.0))
    assert likeliest.accepted == (1,) and likeliest.relaxed == (1,)


@pytest.mark.parametrize("method", [n for n, m in METHODS.items() if m.relaxable])
def test_relaxed_runs_mark_what_the_exact_rule_would_have_rejected(tiny, method):
    res = generate(tiny, PROMPTS[5], method, 40, chat=False, beta=8, tolerance=20.0)
    relaxed = sum(len(e.relaxed) for e in res.events if isinstance(e, Verify))
    marked = sum(o == "relaxed" for e in res.events if isinstance(e, Commit) for o in e.origins)
    assert relaxed == marked  # (a relaxed node past the budget is not committed: none here)
    exact = generate(tiny, PROMPTS[5], method, 40, chat=False, beta=1)
    assert exact.token_ids == greedy(tiny, PROMPTS[5], 40).token_ids
    if relaxed:
        assert res.token_ids != exact.token_ids


def test_relaxed_verification_is_greedy_only_and_claims_nothing(tiny):
    with pytest.raises(InvalidParameter, match=r"relaxed verification .* greedy"):
        generate(tiny, PROMPTS[0], "speculative", 4, beta=2, temperature=0.7)
    m = METHODS["speculative"]
    assert m.claims_lossless({"beta": 1}) and not m.claims_lossless({"beta": 3})
    # Relaxing is a rule of verification: a method that verifies no draft has nothing to relax.
    for name, method in METHODS.items():
        assert not method.relaxable or "Verify" in method.events, name


# --- FREE ------------------------------------------------------------------------------------------


def test_free_with_a_threshold_that_never_exits_is_greedy(tiny):
    for prompt in PROMPTS[:3]:
        res = generate(tiny, prompt, "free", 20, chat=False, exit_layer="2", threshold=1.0)
        assert res.token_ids == greedy(tiny, prompt, 20).token_ids
        assert not [e for e in res.events if isinstance(e, CatchUp)]
        assert res.stats["layers_per_token"] == 1.0


def free_run(tiny, **kw):
    """A FREE run where about half the tokens exit (tiny-random's confidences are tiny)."""
    probe = generate(tiny, PROMPTS[0], "free", 30, chat=False, exit_layer="2", threshold=0.0)
    confs = sorted(e.confidences[0] for e in exits_of(probe))
    params = dict(exit_layer="2", threshold=confs[len(confs) // 2], adaptive=False) | kw
    return generate(tiny, PROMPTS[0], "free", 30, chat=False, **params)


def test_free_holds_back_exited_tokens_until_the_next_deep_token_takes_them_along(tiny):
    res = free_run(tiny)
    held: list[int] = []
    caught = {e.step: e for e in res.events if isinstance(e, CatchUp)}
    syncs = {e.step: e for e in res.events if isinstance(e, Forward) and e.kind == "sync"}
    assert caught and syncs
    for e in exits_of(res):
        if e.layer == 2:
            held.append(e.position)
            assert e.step not in syncs
        else:
            assert e.layer == tiny.n_layers and e.step in syncs
            assert syncs[e.step].n_input_tokens == len(held) + 1  # one parallel pass
            assert syncs[e.step].layers == tiny.n_layers - 2
            if held:
                assert list(caught[e.step].positions) == held
            held = []


def test_the_parallel_catch_up_gives_the_deep_states_of_one_by_one(tiny):
    """Three tokens through layers 1..ℓ, then layers ℓ+1..L for all three in one pass: the deep
    keys, values and logits equal those of running each token's deep layers on its own."""
    from decoders.core.runtime import forward_from, forward_shallow

    ids = tiny.encode(PROMPTS[1], chat=False)
    feed = ids[-3:]
    ell = 2

    def prefilled():
        cache = new_cache(tiny)
        forward(tiny, cache, ids[:-3], step=0, kind="prefill")
        return cache

    together = prefilled()
    states = [
        forward_shallow(tiny, together, [t], ell, step=1, kind="target").hidden[ell] for t in feed
    ]
    bulk = forward_from(tiny, together, torch.cat(states), ell, step=1, kind="sync")
    alone = prefilled()
    rows = []
    for t in feed:
        h = forward_shallow(tiny, alone, [t], ell, step=1, kind="target").hidden[ell]
        rows.append(forward_from(tiny, alone, h, ell, step=1, kind="sync").logits[-1])
    torch.testing.assert_close(bulk.logits, torch.stack(rows), **TOL)
    for a, b in zip(together.layers, alone.layers, strict=True):
        torch.testing.assert_close(a.keys, b.keys, **TOL)
        torch.testing.assert_close(a.values, b.values, **TOL)


def test_the_beta_mixture_threshold_sits_between_the_classes():
    from decoders.methods.free import MIN_SAMPLES, bmm_threshold

    with torch.random.fork_rng():  # seeded, and the global generator left as it was
        torch.manual_seed(0)
        right = torch.distributions.Beta(8.0, 1.5).sample((200,)).tolist()
        wrong = torch.distributions.Beta(1.5, 6.0).sample((200,)).tolist()
    samples = [(c, True) for c in right] + [(c, False) for c in wrong]
    lam = bmm_threshold(samples, 0.9, 0.5)
    assert 0.3 < lam < 0.9
    assert bmm_threshold(samples, 0.99, 0.5) > lam  # a stricter ζ, a higher λ
    few = [(0.9, True)] * (MIN_SAMPLES - 1) + [(0.1, False)] * 10
    assert bmm_threshold(few, 0.9, 0.42) == 0.42  # too few of a class: the starting λ


def test_free_adapts_its_threshold_from_what_the_catch_ups_showed(tiny):
    res = free_run(tiny, adaptive=True, zeta=0.6)
    start = exits_of(res)[0].threshold
    thresholds = [e.threshold for e in res.events if isinstance(e, CatchUp)]
    assert thresholds  # and each pass reports the λ the next tokens are weighed against
    later = [e.threshold for e in exits_of(res)]
    assert all(t in (start, *thresholds) for t in later)


def test_free_refuses_an_exit_layer_without_an_adapter(tiny):
    with pytest.raises(InvalidParameter, match=r"no trained exit at layer 4.*1, 2, 3"):
        generate(tiny, PROMPTS[0], "free", 4, exit_layer="4")
    with pytest.raises(InvalidParameter, match=r"'auto', 'shallow' or a layer number"):
        generate(tiny, PROMPTS[0], "free", 4, exit_layer="deep")
    from decoders.methods.free import resolve_exit_layer

    assert resolve_exit_layer(tiny, "auto") == 3 and resolve_exit_layer(tiny, "shallow") == 1


def test_free_views_draw_the_catch_ups(tiny):
    from visualizer.exit_view import catch_ups
    from visualizer.figures import forward_timeline

    res = free_run(tiny)
    texts = {t: tiny.token_text(t) for t in res.token_ids}
    step = next(e.step for e in res.events if isinstance(e, CatchUp))
    fig = catch_ups(res.events, texts, step)
    caught = [e for e in res.events if isinstance(e, CatchUp)]
    total = sum(fig.data[0].y) + sum(fig.data[1].y)
    assert total == sum(len(e.positions) for e in caught)
    # each axis names what it carries: counts on the left, the λ line on the right
    assert fig.layout.yaxis.title.text == "tokens caught up"
    assert fig.layout.yaxis2.title.text == "λ after the pass"
    lanes = {y for t in forward_timeline(res.events).data for y in t.y}
    assert "sync" in lanes
