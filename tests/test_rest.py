"""REST (decoders/methods/rest.py): the capped suffix match and its trie, and lossless drafts from
a datastore of the tiny model's own writing to the budget's edges. The registry's grids run it
too (tests/test_lossless.py: tiny-random and the embedded model; tests/test_concurrency.py; the
page); this file holds what is REST's own."""

from __future__ import annotations

import pytest

from conftest import greedy
from decoders import generate
from decoders.core.events import Draft, StoreMatch, Verify
from decoders.core.suffix_automaton import StaticAutomaton
from decoders.engine import greedy_reference
from decoders.methods import rest

PROMPTS = ["def fibonacci(n):", "Write a haiku about the sea.", "import numpy as np\n\n"]


def continuations(docs: list[list[int]], suffix: list[int]) -> dict[int, int]:
    """Naively: how often each token follows `suffix` in the docs."""
    out: dict[int, int] = {}
    n = len(suffix)
    for doc in docs:
        for i in range(len(doc) - n):
            if doc[i : i + n] == suffix:
                out[doc[i + n]] = out.get(doc[i + n], 0) + 1
    return out


def test_the_match_is_capped_at_max_match_and_drafts_the_most_frequent_continuation():
    docs = [[1, 2, 3, 4, 5], [9, 3, 4, 6], [7, 3, 4, 6], [8, 2, 3, 4, 5]]
    store = StaticAutomaton(docs)
    long = rest.StoreMatcher(store, cap=16)
    long.catch_up([1, 2, 3, 4])
    assert long.capped()[1] == 4  # "1 2 3 4" occurs once: it continues with 5
    tree, found = long.draft(depth=1, width=1, nodes=1)
    assert tree.tokens == [5] and found.occurrences == 1
    short = rest.StoreMatcher(store, cap=2)
    short.catch_up([1, 2, 3, 4])
    _, n = short.capped()
    assert n == 2  # "3 4": four occurrences, followed by 5 twice and 6 twice
    tree, found = short.draft(depth=1, width=2, nodes=2)
    assert found.occurrences == 4 and sorted(tree.tokens) == [5, 6]
    assert dict(zip(tree.tokens, found.counts, strict=True)) == continuations(docs, [3, 4])
    nothing = rest.StoreMatcher(store, cap=16)
    nothing.catch_up([42])
    assert nothing.draft(depth=4, width=2, nodes=4) == (rest.TreeDraft(), None)


@pytest.fixture(scope="module")
def tiny_store(tiny):
    """A datastore of tiny-random's own greedy continuations, so its drafts are often right."""
    docs = []
    for i, prompt in enumerate([*PROMPTS, "class Stack:"]):
        ids = tiny.encode(prompt, chat=False)
        docs.append([*ids, *greedy_reference(tiny, ids, 40 + 8 * i)])
    return StaticAutomaton(docs)


@pytest.mark.parametrize("params", [{}, {"width": 3, "nodes": 20, "max_match": 4}])
def test_retrieved_tries_are_lossless_to_the_budget_edges(tiny, tiny_store, monkeypatch, params):
    monkeypatch.setattr(rest, "load_store", lambda bundle: tiny_store)
    accepted = 0
    for prompt in PROMPTS:
        ids = tiny.encode(prompt, chat=False)
        for budget in (1, 5, 40):  # the budget ends mid-draft, or runs long
            res = generate(tiny, ids, "rest", budget, chat=False, **params)
            assert res.token_ids == greedy(tiny, ids, budget).token_ids, (prompt, budget)
            drafts = [e for e in res.events if isinstance(e, Draft)]
            assert all(d.source.startswith("REST: datastore") for d in drafts)
            assert len(drafts) == sum(isinstance(e, StoreMatch) for e in res.events)
            accepted += sum(len(e.accepted) for e in res.events if isinstance(e, Verify))
    assert accepted > 0  # drafts were right, inside the budget's edges too


def test_without_a_datastore_every_step_is_a_plain_one(tiny, monkeypatch):
    monkeypatch.setattr(rest, "load_store", lambda bundle: None)
    ids = tiny.encode(PROMPTS[0], chat=False)
    res = generate(tiny, ids, "rest", 8, chat=False)
    assert res.token_ids == greedy(tiny, ids, 8).token_ids
    assert not any(isinstance(e, Draft | StoreMatch) for e in res.events)
