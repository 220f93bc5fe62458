"""The reference decoder: token-for-token equal to transformers' generate(do_sample=False)."""

import dataclasses
from collections import Counter

import pytest
import torch

from conftest import PROMPTS, assert_greedy
from decoders import check_lossless, compare_tokens, generate
from decoders.core.events import Commit, Done, Forward, Prefill, TopK
from decoders.core.sampling import Sampler, top_p_filter


def hf_greedy(bundle, prompt_ids, max_new_tokens, **kwargs):
    ids = torch.tensor([prompt_ids], device=bundle.device)
    with torch.inference_mode():
        out = bundle.model.generate(
            ids,
            attention_mask=torch.ones_like(ids),
            do_sample=False,
            max_new_tokens=max_new_tokens,
            pad_token_id=bundle.tokenizer.eos_token_id,
            **kwargs,
        )
    return out[0, len(prompt_ids) :].tolist()


@pytest.mark.parametrize("prompt", PROMPTS)
def test_greedy_matches_transformers_generate_tiny(tiny, prompt):
    res = generate(tiny, prompt, max_new_tokens=24, chat=False)
    assert res.token_ids == hf_greedy(tiny, res.prompt_ids, 24)
    assert len(res.token_ids) == 24 and res.finish_reason == "length"


@pytest.mark.slow
@pytest.mark.parametrize("prompt", PROMPTS[:2])
def test_greedy_matches_transformers_generate_embedded(embedded, prompt):
    res = generate(embedded, prompt, max_new_tokens=32)
    assert res.prompt_ids[-3:] == embedded.encode("x")[-3:]  # chat template applied
    assert_greedy(embedded, res, hf_greedy(embedded, res.prompt_ids, 32))  # near-ties aside
    assert check_lossless(embedded, res).identical


def test_eos_stops_and_is_kept(tiny):
    free = generate(tiny, PROMPTS[0], max_new_tokens=12, chat=False).token_ids
    stop = free[5]
    first = free.index(stop)
    bundle = dataclasses.replace(tiny, eos_ids=frozenset({stop}))
    res = generate(bundle, PROMPTS[0], max_new_tokens=12, chat=False)
    assert res.token_ids == free[: first + 1]
    assert res.finish_reason == "eos"
    assert res.token_ids == hf_greedy(tiny, res.prompt_ids, 12, eos_token_id=stop)


def test_budget_of_one_token(tiny):
    res = generate(tiny, PROMPTS[1], max_new_tokens=1, chat=False)
    assert len(res.token_ids) == 1
    assert res.stats["target_forwards"] == 1  # the prefill alone decides the token


def test_event_stream_shape(tiny):
    res = generate(tiny, PROMPTS[2], max_new_tokens=5, chat=False)
    kinds = [type(e).__name__ for e in res.events]
    assert kinds[0] == "Prefill" and kinds[-1] == "Done"
    assert isinstance(res.events[0], Prefill) and list(res.events[0].prompt_ids) == res.prompt_ids
    commits = [e for e in res.events if isinstance(e, Commit)]
    assert [t for c in commits for t in c.tokens] == res.token_ids
    assert all(c.origins == ("target",) for c in commits)
    forwards = [e for e in res.events if isinstance(e, Forward)]
    assert [f.kind for f in forwards] == ["prefill"] + ["target"] * 4
    topks = [e for e in res.events if isinstance(e, TopK)]
    assert len(topks) == 5 and all(
        t.tokens[0] == c.tokens[0] for t, c in zip(topks, commits, strict=True)
    )
    assert isinstance(res.events[-1], Done) and res.stats["tokens_per_target_forward"] == 1.0


def test_record_off_keeps_only_done(tiny):
    res = generate(tiny, PROMPTS[2], max_new_tokens=6, chat=False, record=False)
    assert [type(e).__name__ for e in res.events] == ["Done"]
    assert res.stats["new_tokens"] == 6
    assert res.token_ids == generate(tiny, PROMPTS[2], max_new_tokens=6, chat=False).token_ids


def test_sampling_is_seeded(tiny):
    kw = dict(max_new_tokens=16, chat=False, temperature=1.0)
    a = generate(tiny, PROMPTS[0], seed=1, **kw).token_ids
    assert a == generate(tiny, PROMPTS[0], seed=1, **kw).token_ids
    assert any(generate(tiny, PROMPTS[0], seed=s, **kw).token_ids != a for s in range(2, 6))


def test_a_nucleus_smaller_than_the_top_token_is_greedy():
    logits = torch.tensor([3.0, 1.0, 0.5, 0.0])  # top token holds ~0.8 of the mass
    sampler = Sampler(temperature=1.0, top_p=0.5, seed=0)
    assert {sampler.choose(logits)[0] for _ in range(200)} == {0}


def test_sampler_draws_follow_the_distribution():
    """Chi-square goodness of fit over a 5-token vocabulary: temperature and top-p are applied exactly."""
    logits = torch.tensor([2.0, 1.0, 0.5, 0.0, -1.0])
    for temperature, top_p in [(1.0, 1.0), (0.7, 1.0), (1.3, 0.8)]:
        sampler = Sampler(temperature, top_p, seed=123)
        expected = (
            top_p_filter(torch.softmax(logits / temperature, -1), top_p)
            if top_p < 1
            else torch.softmax(logits / temperature, -1)
        )
        n = 20000
        counts = Counter(sampler.choose(logits)[0] for _ in range(n))
        chi2 = 0.0
        dof = -1
        for token, p in enumerate(expected.tolist()):
            if p == 0:
                assert counts[token] == 0  # outside the nucleus: never drawn
                continue
            chi2 += (counts[token] - n * p) ** 2 / (n * p)
            dof += 1
        assert chi2 < 18.5, (temperature, top_p, chi2)  # p ≈ 0.001 for dof ≤ 4


def test_compare_tokens_reports_first_divergence():
    assert compare_tokens([1, 2, 3], [1, 2, 3]).identical
    assert compare_tokens([1, 2, 3], [1, 5, 3]).first_divergence == 1
    assert compare_tokens([1, 2, 3], [1, 2]).first_divergence == 2
