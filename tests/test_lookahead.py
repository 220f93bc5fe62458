"""Jacobi and Lookahead decoding: token-for-token equal to autoregressive greedy, and the combined
lookahead mask gives every input exactly the logits of its own sequential context."""

import dataclasses
import itertools

import pytest

from conftest import PROMPTS, close
from conftest import matches_greedy as same_as_greedy
from decoders import generate
from decoders.core.events import AttentionMask, Commit, LookaheadWindow, NgramPool
from decoders.core.runtime import forward, new_cache
from decoders.core.tree import ancestors, tree_mask, tree_positions
from decoders.methods.lookahead import NgramStore, trie, window_parents

# --- pieces ------------------------------------------------------------------------------------------


def test_trie_merges_shared_prefixes():
    tokens, parents = trie([(5, 6, 7), (5, 6, 8), (9,), (5, 1)])
    assert tokens == [5, 6, 7, 8, 9, 1]
    assert parents == [-1, 0, 1, 1, -1, 0]


def test_window_parents_climb_columns_over_a_level0_chain():
    levels = [[10, 11, 12], [20, 21, 22], [30, 31, 32]]
    parents = window_parents(levels, offset=1)  # input 0 is x
    # level 0: a chain after x; level j, column i: the token below it
    assert parents == [0, 1, 2, 1, 2, 3, 4, 5, 6]
    full = [-1, *parents]
    # the top token of column 2 sees x, level 0 up to column 2, then column 2's lower levels
    assert ancestors(full, 9) == [0, 1, 2, 3, 6, 9]


def test_ngram_store_caps_per_key_and_returns_newest_first():
    pool = NgramStore(3, cap=2)
    pool.seed([1, 2, 3, 1, 4, 5, 1, 6, 7])
    assert pool.candidates(1, 5) == [(6, 7), (4, 5)]  # (1, 2, 3) dropped by the cap
    assert pool.add((1, 4, 5)) is False  # known: moves to newest
    assert pool.candidates(1, 1) == [(4, 5)]
    assert pool.candidates(99, 3) == [] and len(pool) == 6  # 7 trigrams, one capped out


def test_ngram_store_ranks_candidates_seen_in_the_same_context_first():
    pool = NgramStore(3, cap=4)
    pool.seed([8, 1, 2, 3, 9, 1, 4, 5, 7, 1, 6, 7])  # 1 follows 8, then 9, then 7
    assert pool.candidates(1, 3) == [(6, 7), (4, 5), (2, 3)]  # no context: newest first
    assert pool.candidates(1, 2, before=8) == [(2, 3), (6, 7)]  # seen after 8 first, then newest
    assert pool.candidates(1, 1, before=9) == [(4, 5)]
    assert pool.candidates(1, 3, before=42) == [(6, 7), (4, 5), (2, 3)]  # no match: newest first
    pool.add((1, 6, 7))  # seen again by the window, with no context: keeps the one it had
    assert pool.candidates(1, 1, before=7) == [(6, 7)]
    pool.add((1, 2, 3), before=5)  # seen again after 5: remembers the newest context
    assert pool.candidates(1, 1, before=5) == [(2, 3)]
    assert pool.candidates(1, 3, before=8) == [(2, 3), (6, 7), (4, 5)]  # 8 is forgotten


def test_combined_mask_matches_sequential_forwards(tiny):
    """Every input of a lookahead step (window token or trie node) gets the logits it would get
    from a plain forward over the context plus its own ancestors."""
    context = tiny.encode("def add(a, b):\n    return", chat=False)
    levels = [[101, 102, 103], [201, 202, 203]]
    v_tokens, v_parents = trie([(301, 302), (301, 303), (304,)])
    look = [t for level in levels for t in level]
    v_offset = 1 + len(look)
    parents = [-1, *window_parents(levels, 1), *(v_offset + q if q >= 0 else 0 for q in v_parents)]
    inputs = [context[-1], *look, *v_tokens]
    cache = new_cache(tiny)
    n = len(context) - 1
    forward(tiny, cache, context[:-1], step=0, kind="prefill")
    out = forward(
        tiny,
        cache,
        inputs,
        step=1,
        kind="verify",
        positions=tree_positions(parents, n),
        mask=tree_mask(parents, n),
    )
    for node in range(len(inputs)):
        path = [inputs[a] for a in ancestors(parents, node)]
        ref = forward(tiny, new_cache(tiny), [*context[:-1], *path], step=0, kind="prefill")
        assert close(out.logits[node], ref.logits[-1]), node


# --- lossless ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("block", [1, 2, 5, 8])
@pytest.mark.parametrize("prompt", PROMPTS[:4])
def test_jacobi_lossless_on_tiny(tiny, prompt, block):
    same_as_greedy(tiny, prompt, 30, "jacobi", block=block)


# N × W × G in full; the pool options and the prompt alternate across the grid.
GRID = [
    (N, W, G, i % 2 == 0, i % 3 == 0, i % 4 != 1, PROMPTS[i % 3])
    for i, (N, W, G) in enumerate(itertools.product([2, 3, 4, 5], [0, 1, 3, 8], [0, 2, 8]))
]


@pytest.mark.slow
@pytest.mark.parametrize(("N", "W", "G", "seeded", "own", "ranked", "prompt"), GRID)
def test_lookahead_lossless_grid_on_tiny(tiny, N, W, G, seeded, own, ranked, prompt):
    same_as_greedy(
        tiny,
        prompt,
        20,
        "lookahead",
        N=N,
        W=W,
        G=G,
        pool_from_prompt=seeded,
        pool_from_output=own,
        rank_by_context=ranked,
    )


@pytest.mark.parametrize(("N", "W", "G"), [(6, 1, 3), (8, 1, 2), (12, 1, 3), (8, 2, 2), (6, 5, 5)])
@pytest.mark.parametrize("prompt", PROMPTS[:3])
def test_lookahead_lossless_deep_windows_on_tiny(tiny, N, W, G, prompt):
    # The CPU defaults (N=6, W=1, G=3) and deeper n-grams, up to N's maximum, with the output's
    # own n-grams in the pool so long candidates exist.
    same_as_greedy(tiny, prompt, 24, "lookahead", N=N, W=W, G=G, pool_from_output=True)


@pytest.mark.slow
def test_lookahead_accepts_ngrams_on_code_and_emits_its_views(embedded):
    # Code repeats its prompt (names, signatures): the seeded pool's n-grams get accepted. The
    # random tiny model never repeats itself, so this needs the real one.
    from test_prompt_lookup import humaneval

    res = same_as_greedy(embedded, humaneval(0), 40, "lookahead", N=3, W=3, G=4)
    origins = [o for e in res.events if isinstance(e, Commit) for o in e.origins]
    assert "draft" in origins  # the pool's n-grams were accepted
    masks = [e for e in res.events if isinstance(e, AttentionMask)]
    windows = [e for e in res.events if isinstance(e, LookaheadWindow)]
    pools = [e for e in res.events if isinstance(e, NgramPool)]
    assert masks and windows and pools
    assert all(len(m.labels) == len(m.visible) for m in masks)
    assert all(0 in v for m in masks for v in m.visible)  # every input sees x
    assert len(windows[-1].levels) == 2 and len(windows[-1].outputs) == 3  # N - 1 levels × W


def test_events_carry_what_the_views_need(tiny):
    """The mask names each input's token and branch (x, the window level by level, the trie) as
    fed to the model; the pool event records N; each Jacobi block records where it starts."""
    res = generate(tiny, PROMPTS[5], "lookahead", 24, N=3, W=4, G=3, pool_from_output=True)
    by_step = {}
    for e in res.events:
        by_step.setdefault(getattr(e, "step", None), []).append(e)
    committed = [t for e in res.events if isinstance(e, Commit) for t in e.tokens]
    done = 1  # the prefill's token
    for e in res.events:
        if isinstance(e, AttentionMask):
            window = next(w for w in by_step[e.step] if isinstance(w, LookaheadWindow))
            drafts = [d for d in by_step[e.step] if type(d).__name__ == "Draft"]
            trie_tokens = list(drafts[0].tokens) if drafts else []
            look = [t for level in window.levels for t in level]
            x = committed[done - 1]
            assert e.input_ids == (x, *look, *trie_tokens)
            assert e.branches == ("x", *["lookahead"] * len(look), *["verify"] * len(trie_tokens))
            assert len(e.labels) == len(e.visible) == len(e.input_ids)
        elif isinstance(e, Commit) and e.step > 0:
            done += len(e.tokens)
    pools = [e for e in res.events if isinstance(e, NgramPool)]
    assert pools and all(p.n == 3 for p in pools)

    jac = generate(tiny, PROMPTS[0], "jacobi", 20, block=4)
    starts = [e.start for e in jac.events if type(e).__name__ == "JacobiIteration"]
    before = 0
    expected = []
    for e in jac.events:
        if type(e).__name__ == "JacobiIteration":
            expected.append(before)
        elif isinstance(e, Commit):
            before += len(e.tokens)
    assert starts == expected and starts[0] == 1


@pytest.mark.parametrize("budget", [1, 2, 3, 5])
def test_budget_edge_cases(tiny, budget):
    for prompt in PROMPTS[:3]:
        same_as_greedy(tiny, prompt, budget, "lookahead", N=4, W=3, G=8)
        same_as_greedy(tiny, prompt, budget, "jacobi", block=8)


def test_eos_inside_an_accepted_ngram(tiny):
    """Treat a token that greedy emits mid-way as EOS: both methods stop right after it."""
    ref = generate(tiny, PROMPTS[0], "autoregressive", 30, record=False)
    eos = ref.token_ids[7]
    fake = dataclasses.replace(tiny, eos_ids=frozenset({eos}))
    ref_eos = generate(fake, PROMPTS[0], "autoregressive", 30, record=False)
    assert ref_eos.finish_reason == "eos"
    prompt_ids = [*tiny.encode(PROMPTS[0], chat=False), *ref.token_ids]  # pool holds the answer
    for method, params in [
        ("lookahead", dict(N=3, W=2, G=4, pool_from_output=True)),
        ("jacobi", dict(block=6)),
    ]:
        a = generate(fake, prompt_ids, method, 30, **params)
        b = generate(fake, prompt_ids, "autoregressive", 30, record=False)
        assert a.token_ids == b.token_ids and a.finish_reason == b.finish_reason


def test_sampling_is_reproducible(tiny):
    a = generate(tiny, PROMPTS[1], "lookahead", 20, temperature=1.0, seed=3)
    b = generate(tiny, PROMPTS[1], "lookahead", 20, temperature=1.0, seed=3)
    assert a.token_ids == b.token_ids


@pytest.mark.slow
@pytest.mark.parametrize(
    ("method", "params"),
    [
        # the defaults and the paper's settings: test_lossless.py
        ("jacobi", dict(block=6)),
        ("lookahead", dict(N=3, W=2, G=2, pool_from_output=True)),
    ],
)
def test_lossless_on_the_embedded_model(embedded, method, params):
    from test_prompt_lookup import humaneval

    same_as_greedy(embedded, humaneval(2), 48, method, **params)  # humaneval(0): test_lossless
