"""The "why faster or slower" lab: the chain theory on a price table (its rule on given numbers),
the synthetic-acceptance mode (a coin keeps each draft, marked not exact) and the lab's figures
and real runs wired together."""

from __future__ import annotations

import pytest

from decoders import generate
from decoders.core.prices import PriceTable
from decoders.core.sampling import Relax
from decoders.core.verify import greedy_tree
from visualizer.speed_lab import price_curve, speed_lab

FREE_WIDTH = PriceTable.linear("m", 0.0)  # every forward costs one, whatever its inputs


def test_the_chain_theory_on_given_numbers():
    # α = 0: the target's own token only; nothing drafted pays (free drafts, free width: 1x)
    assert FREE_WIDTH.chain_speedup(0.0, 4, 0.0) == pytest.approx((1.0, 1.0))
    # α = 1 with free drafts and width: every step commits γ + 1
    assert FREE_WIDTH.chain_speedup(1.0, 4, 0.0) == pytest.approx((5.0, 5.0))
    # α = 0.5, γ = 2: (1 − 0.125) / 0.5 = 1.75 tokens; two drafts at 0.1 and a 3-input verify
    # at 1 + 2 x 0.05 cost 1.3: 1.75 / 1.3
    table = PriceTable.linear("m", 0.05)
    tokens, speedup = table.chain_speedup(0.5, 2, 0.1)
    assert tokens == pytest.approx(1.75) and speedup == pytest.approx(1.75 / 1.3)
    # a dearer drafter is slower at the same acceptance; more acceptance is faster
    assert table.chain_speedup(0.5, 2, 0.9)[1] < speedup < table.chain_speedup(0.8, 2, 0.1)[1]
    with pytest.raises(ValueError):
        table.chain_speedup(1.5, 2, 0.1)


def test_synthetic_acceptance_keeps_a_draft_by_a_coin():
    import torch

    logits = torch.zeros(4, 10)
    logits[:, 9] = 5.0  # the target wants token 9 everywhere; the draft says 1, 2, 3
    coin = torch.Generator().manual_seed(0)
    always = greedy_tree([1, 2, 3], [-1, 0, 1], logits, Relax(1, 1.0, 1.0, coin))
    assert always.accepted == (0, 1, 2) and always.relaxed == (0, 1, 2)
    assert always.tokens == (1, 2, 3, 9) and always.rule == "synthetic-1"
    never = greedy_tree([1, 2, 3], [-1, 0, 1], logits, Relax(1, 1.0, 1e-9, coin))
    assert never.accepted == () and never.tokens == (9,)
    # the exact rule on the same draft keeps nothing
    assert greedy_tree([1, 2, 3], [-1, 0, 1], logits).accepted == ()


def test_a_synthetic_run_is_lossy_and_follows_its_rate(tiny):
    ids = tiny.encode("def add(a, b):", chat=False)
    ref = generate(tiny, ids, "autoregressive", 40)
    rates = []
    for p in (0.2, 0.9):
        r = generate(
            tiny, ids, "speculative", 40, draft="self:1", synthetic=p, schedule="fixed", gamma=4
        )
        assert r.token_ids != ref.token_ids  # lossy, and so not claimed lossless
        rates.append(r.stats["mean_acceptance_length"])
    assert rates[0] < rates[1]
    from decoders import METHODS

    assert not METHODS["speculative"].claims_lossless({"synthetic": 0.5})
    assert METHODS["speculative"].claims_lossless({"synthetic": 0.0})


def test_synthetic_acceptance_is_greedy_only(tiny):
    from decoders import InvalidParameter

    with pytest.raises(InvalidParameter, match="synthetic"):
        generate(tiny, "hi", "speculative", 4, synthetic=0.5, temperature=0.7)


def test_the_lab_figures_draw_the_curve_the_runs_and_the_crosses():
    table = PriceTable.linear("m", 0.05)
    fig = price_curve(table, "a stated table")
    assert "stated table" in fig.layout.title.text
    rows = [
        {
            "method": "sam",
            "tokens_per_target_forward": 3.0,
            "speedup": 2.5,
            "modelled_speedup": 2.6,
        },
        {"method": "calm", "tokens_per_target_forward": 1.0, "speedup": 0.9, "lossy": True},
    ]
    crosses = [{"synthetic": 0.6, "tokens_per_target_forward": 2.2, "speedup": 1.7}]
    fig = speed_lab(table, 0.6, 4, 0.05, rows, crosses)
    names = [t.name for t in fig.data]
    theory = fig.data[0]
    assert theory.name.startswith("theory: γ = 4")
    assert theory.y[-1] == pytest.approx(table.chain_speedup(1.0, 4, 0.05)[1])
    assert any("synthetic acceptance" in n for n in names)
    assert any("lossy" in n for n in names) and any("lossless" in n for n in names)


@pytest.mark.slow  # six real runs through Compare, the drafter loaded
def test_the_labs_real_runs_are_synthetic_and_marked(tiny):
    from ui.learn_tab import LAB, SWEEP, learn, sweep

    assert "{{" not in learn(LAB)["text"]
    *_, (rows, said) = list(sweep("def add(a, b):", 2, model="tiny-random"))
    assert [r["synthetic"] for r in rows] == list(SWEEP)
    assert all("lossy" in str(r["lossless"]) or "differs" in str(r["lossless"]) for r in rows)
    assert "Not exact" in said
