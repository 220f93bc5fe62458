"""Retrieval and recycled drafts: the suffix automata against brute force, SAM-Decoding (`sam`),
Token Recycling (`recycling`), token_tree's copy=sam and recycle branches, the datastore file,
their events' checks and their views. (Every lossless method's grid against greedy, the sam and
recycling methods included, is tests/test_lossless.py's; here the datastore paths, which
tiny-random has no shipped datastore for.)"""

from __future__ import annotations

import random

import pytest
import torch

from conftest import greedy
from decoders import generate
from decoders.core.events import Commit, CopySource, Draft, Recycled, StoreMatch
from decoders.core.suffix_automaton import SEPARATOR, ContextMatch, StaticAutomaton
from decoders.drafting import recycled, retrieval
from decoders.engine import greedy_reference
from decoders.trained import datastore

# --- the automata ---------------------------------------------------------------------------------


def longest_earlier(text: list[int]) -> tuple[int, int]:
    """Brute force: the longest suffix of `text` that also ends earlier, and where it first ends."""
    for n in range(len(text) - 1, 0, -1):
        suffix = text[-n:]
        for end in range(n - 1, len(text) - 1):
            if text[end - n + 1 : end + 1] == suffix:
                return n, end
    return 0, -1


def test_the_context_match_is_the_longest_earlier_suffix_and_copies_its_first_occurrence():
    rng = random.Random(0)
    for alphabet in (2, 3, 5):
        text = [rng.randrange(alphabet) for _ in range(160)]
        match = ContextMatch()
        for i, t in enumerate(text):
            match.feed([t])
            n, end = longest_earlier(text[: i + 1])
            assert match.length == n, (alphabet, i)
            got, start = match.continuation(4)
            if n:
                assert start == end - n + 1
                assert got == text[end + 1 : min(end + 5, i + 1)]
            else:
                assert (got, start) == ([], -1)


def occurrences(docs: list[list[int]], s: list[int]) -> int:
    return sum(1 for d in docs for i in range(len(d) - len(s) + 1) if d[i : i + len(s)] == s)


def test_the_static_automaton_counts_occurrences_and_matches_within_documents():
    rng = random.Random(1)
    docs = [[rng.randrange(4) for _ in range(rng.randrange(5, 40))] for _ in range(12)]
    store = StaticAutomaton(docs)
    for _ in range(200):
        d = rng.choice(docs)
        i = rng.randrange(len(d))
        s = d[i : i + rng.randrange(1, 6)]
        state = 0
        for t in s:
            state = store.child(state, t)
        assert state >= 0 and store.count[state] == occurrences(docs, s)
    # streaming a query: the match is the longest suffix occurring in some document
    query = [rng.randrange(4) for _ in range(80)]
    state, n = 0, 0
    for i, t in enumerate(query):
        state, n = store.step(state, n, t)
        best = next(
            (k for k in range(i + 1, 0, -1) if occurrences(docs, query[i + 1 - k : i + 1])), 0
        )
        assert n == best, i
    # the continuation tree: counts are the continuations' occurrences, never the separator
    state = store.child(0, docs[0][0])
    for node in store.tree(state, depth=3, width=2, nodes=8):
        path = [node.token]
        parent = node.parent
        nodes = store.tree(state, depth=3, width=2, nodes=8)
        while parent >= 0:
            path.insert(0, nodes[parent].token)
            parent = nodes[parent].parent
        assert node.token != SEPARATOR
        assert node.count == occurrences(docs, [docs[0][0], *path])


def test_the_datastore_file_round_trips_and_its_cached_automaton_is_the_built_one(
    tmp_path, monkeypatch
):
    monkeypatch.setenv("DECODING_LAB_CACHE", str(tmp_path / "cache"))
    docs = [[5, 6, 7, 5, 6], [7, 7, 5], [60000, 1]]
    from safetensors.torch import save_file

    path = tmp_path / "store.safetensors"
    save_file(datastore.docs_tensors(docs), str(path))
    assert datastore.read_docs(path) == docs
    built = datastore.automaton(path)  # built, then cached
    cached = datastore.automaton(path)  # read back
    for name in datastore.ARRAYS:
        assert (getattr(built, name) == getattr(cached, name)).all(), name
    with pytest.raises(ValueError, match="uint16"):
        datastore.docs_tensors([[70000]])


# --- sam and recycling on tiny-random, with a datastore ---------------------------------------------

PROMPTS = ["def fibonacci(n):", "Write a haiku about the sea.", "import numpy as np\n\n"]


@pytest.fixture(scope="module")
def tiny_store(tiny):
    """A datastore of tiny-random's own greedy continuations (what the shipped one is to the
    embedded model), so its matches are long and its drafts often right."""
    docs = []
    for i, prompt in enumerate([*PROMPTS, "class Stack:", "The weather today"]):
        ids = tiny.encode(prompt, chat=False)
        docs.append([*ids, *greedy_reference(tiny, ids, 40 + 8 * i)])
    return StaticAutomaton(docs)


@pytest.fixture()
def with_store(monkeypatch, tiny_store):
    monkeypatch.setattr(retrieval, "load_store", lambda bundle: tiny_store)
    monkeypatch.setattr(recycled, "load_store", lambda bundle: tiny_store)
    recycled._warm.clear()
    yield tiny_store
    recycled._warm.clear()


@pytest.mark.parametrize(
    "method, params",
    [
        ("sam", {}),
        ("sam", {"min_match": 1, "width": 3, "nodes": 20}),
        ("recycling", {}),
        ("recycling", {"size": "fixed"}),
        ("token_tree", {"draft": "eagle", "copy": "sam", "recycle": 6}),
        ("token_tree", {"draft": "eagle", "copy": "sam", "trust": 2, "size": "fixed"}),
    ],
)
def test_retrieved_and_recycled_drafts_are_lossless_to_the_budget_edges(
    tiny, with_store, method, params
):
    sources = set()
    for prompt in PROMPTS:
        ids = tiny.encode(prompt, chat=False)
        for budget in (1, 5, 40):  # the budget ends mid-draft, or runs long
            res = generate(tiny, ids, method, budget, chat=False, **params)
            assert res.token_ids == greedy(tiny, ids, budget).token_ids, (prompt, budget)
            sources |= {
                e.type for e in res.events if isinstance(e, StoreMatch | CopySource | Recycled)
            }
            sources |= {e.source for e in res.events if isinstance(e, Draft)}
    if method == "sam":
        assert "StoreMatch" in sources  # the datastore drafted
        assert any(s.startswith("SAM: datastore") for s in sources)
    if method == "recycling":
        assert "Recycled" in sources
    if method == "token_tree" and "recycle" in params:
        assert any("token recycling" in s for s in sources)


def test_an_end_token_inside_a_retrieved_draft_stops_there(tiny, with_store):
    import dataclasses

    ids = tiny.encode(PROMPTS[0], chat=False)
    free = generate(tiny, ids, "sam", 40, chat=False, min_match=1)
    multi = next(c for c in free.events if isinstance(c, Commit) and len(c.tokens) >= 3)
    eos = multi.tokens[1]
    ended = dataclasses.replace(tiny, eos_ids=frozenset({eos}))
    for method in ("sam", "recycling"):
        res = generate(ended, ids, method, 40, chat=False)
        assert res.token_ids == greedy_reference(ended, ids, 40), method
        assert res.finish_reason == "eos"


def test_sam_drafts_what_the_datastore_continues_most_often(tiny, with_store):
    ids = tiny.encode(PROMPTS[1], chat=False)
    res = generate(tiny, ids, "sam", 30, chat=False, width=2, nodes=6)
    steps = [e for e in res.events if isinstance(e, StoreMatch)]
    assert steps
    for match in steps:
        draft = next(e for e in res.events if isinstance(e, Draft) and e.step == match.step)
        assert len(match.counts) == len(draft.tokens) and max(match.counts) <= match.occurrences
        # siblings come most frequent first
        for parent in set(draft.parents):
            kids = [match.counts[i] for i, p in enumerate(draft.parents) if p == parent]
            assert kids == sorted(kids, reverse=True)


def test_the_adjacency_matrix_recycles_each_input_s_top_successors():
    matrix = recycled.Adjacency(10, None)
    assert matrix.succ[3].tolist() == [3] * recycled.K  # nothing known: the token itself
    logits = torch.full((3, 10), -10.0)
    for row, best in enumerate((4, 6, 2)):
        logits[row, best] = 5.0
        logits[row, (best + 1) % 10] = 4.0
    matrix.update([3, 4, 3], logits)  # token 3 fed twice: its last row wins
    assert matrix.succ[3, :2].tolist() == [2, 3] and matrix.succ[4, :2].tolist() == [6, 7]
    assert bool(matrix.fresh[3]) and not bool(matrix.fresh[5])
    tree = matrix.draft(3, [(0,), (1,), (0, 0)], depth=4)
    assert tree.tokens == [2, 3, int(matrix.succ[2, 0])] and tree.parents == [-1, -1, 0]


def test_a_template_rank_beyond_the_matrix_is_refused_by_name(tiny):
    from decoders.core.errors import InvalidParameter

    with pytest.raises(InvalidParameter, match=r"template: ranks must be in 0\.\.7"):
        generate(tiny, "hi", "recycling", 4, template="0 8")


# --- events and views ------------------------------------------------------------------------------


def test_a_retrieval_event_with_impossible_counts_is_refused(tiny, with_store):
    import copy
    import json

    from decoders.core.tracefile import TraceError
    from ui.traces import read_trace

    res = generate(tiny, PROMPTS[1], "sam", 20, chat=False)
    data = json.loads(json.dumps(res.trace()))
    assert read_trace(json.dumps(data)).events  # as recorded: valid
    bad = copy.deepcopy(data)
    match = next(e for e in bad["events"] if e["type"] == "StoreMatch")
    match["counts"][0] = match["occurrences"] + 1
    with pytest.raises(TraceError, match="count must be in"):
        read_trace(json.dumps(bad))


def test_the_views_name_where_each_draft_came_from(tiny, with_store):
    from visualizer.panels import VIEWS

    texts = {i: f"t{i}" for i in range(tiny.model.config.vocab_size)}
    res = generate(tiny, PROMPTS[0] * 3, "sam", 30, chat=False, min_match=1)
    kinds = {}
    for e in res.events:
        if isinstance(e, StoreMatch | CopySource):
            kinds.setdefault(type(e).__name__, e.step)
    assert set(kinds) == {"StoreMatch", "CopySource"}
    store_fig = VIEWS["retrieval"](res.events, texts, kinds["StoreMatch"])
    assert "from the datastore" in store_fig.layout.title.text
    assert "occur" in store_fig.layout.title.subtitle.text
    assert sum(len(t.x) for t in store_fig.data) == len(
        next(e for e in res.events if isinstance(e, StoreMatch)).counts
    )
    context_fig = VIEWS["retrieval"](res.events, texts, kinds["CopySource"])
    assert "from the prompt" in context_fig.layout.title.text or "from the output" in (
        context_fig.layout.title.text
    )
    assert "prefill" in VIEWS["retrieval"](res.events, texts, 0).layout.annotations[0].text

    rec = generate(tiny, PROMPTS[0], "recycling", 20, chat=False)
    step = next(e.step for e in rec.events if isinstance(e, Recycled))
    fig = VIEWS["adjacency"](rec.events, texts, step)
    draft = next(e for e in rec.events if isinstance(e, Draft) and e.step == step)
    assert f"{len(draft.tokens)} drafted" in fig.layout.title.subtitle.text.replace("<br>", " ")
    drafted = [c for c in fig.data[0].marker.color if c != "#ffffff"]
    assert len(drafted) >= 1
    assert any("·warm" in t for t in fig.layout.yaxis.ticktext)  # the datastore's rows, unread
    cold = generate(tiny, PROMPTS[0], "recycling", 20, chat=False, warm="none")
    fig = VIEWS["adjacency"](cold.events, texts, step)
    assert any("·empty" in t for t in fig.layout.yaxis.ticktext)
    assert not any("·warm" in t for t in fig.layout.yaxis.ticktext)
