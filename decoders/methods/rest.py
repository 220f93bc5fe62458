"""REST (He et al. 2023): retrieval-based speculative decoding from a datastore alone.

No draft model and no copy from the context: the draft is what a datastore of text continues the
context's end with. REST looks up the longest suffix of the context, up to n_max tokens, that
occurs in the datastore, gathers the continuations of all its occurrences into a trie, keeps the
most frequent nodes, and verifies the whole trie in one forward with a tree attention mask.

    repeat:
        x = last committed token; advance the datastore match by it
        s = the longest suffix of the context (at most n_max tokens) that occurs in the datastore
        draft = the trie of s's continuations: the most frequent first, `width` children a node,
                `nodes` in all, `num_draft` deep
        nothing occurs: a plain autoregressive step
        p = target([x, *draft]) under a tree mask; keep the target's path, commit
Greedy is token-for-token lossless; sampling uses the multi-draft rule for point-mass drafts.

Here the datastore is the target's own writing (decoders/trained/datastore.py, shared with SAM),
and the suffix match is a suffix automaton's (decoders/core/suffix_automaton.py): the longest
suffix is found in amortised constant time per token rather than by REST's suffix array search
from n_max down. A state holds every suffix with the same occurrences, so capping the match at
n_max moves to a shorter state only when a shorter suffix occurs more often.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

from decoders.core.base import Budget, DecodeConfig, Method
from decoders.core.events import Event, StoreMatch
from decoders.core.models import ModelBundle
from decoders.core.params import Param
from decoders.core.runtime import new_cache
from decoders.core.steps import start, verify_tree
from decoders.core.suffix_automaton import StaticAutomaton
from decoders.drafting.trees import TreeDraft, draft_event
from decoders.trained.datastore import load_store

PARAMS = (
    Param("num_draft", int, 8, "tokens drafted per step, at most: the trie's depth", 1, 32),
    Param("width", int, 2, "continuations kept per node (most frequent first)", 1, 8),
    Param("nodes", int, 12, "nodes of the retrieved trie, at most", 1, 64),
    Param("max_match", int, 16, "n_max: the longest suffix looked up, in tokens", 1, 64),
)


class StoreMatcher:
    """The context's longest suffix that occurs in the datastore, kept up to date token by token
    (the automaton's state and the match's length), capped at n_max tokens."""

    def __init__(self, store: StaticAutomaton, cap: int) -> None:
        self.store, self.cap = store, cap
        self.state, self.length, self.fed = 0, 0, 0

    def catch_up(self, context: Sequence[int]) -> None:
        for t in context[self.fed :]:
            self.state, self.length = self.store.step(self.state, self.length, t)
        self.fed = len(context)

    def capped(self) -> tuple[int, int]:
        """(state, length) of the longest occurring suffix of at most `cap` tokens: a shorter
        state is taken only when the state's shortest suffix is still longer than the cap."""
        state, length = self.state, self.length
        while state and int(self.store.length[self.store.link[state]]) >= self.cap:
            state = int(self.store.link[state])
            length = int(self.store.length[state])
        return state, min(length, self.cap)

    def draft(self, depth: int, width: int, nodes: int) -> tuple[TreeDraft, StoreMatch | None]:
        """The trie of the match's continuations, and where it came from (for the trace)."""
        state, n = self.capped()
        if depth <= 0 or n == 0:
            return TreeDraft(), None
        tree = self.store.tree(state, depth, width, nodes)
        if not tree:
            return TreeDraft(), None
        draft = TreeDraft.from_nodes(
            tuple(c.token for c in tree),
            tuple(c.parent for c in tree),
            tuple(round(c.share, 6) for c in tree),
        )
        occurrences = int(self.store.count[state])
        return draft, StoreMatch(0, n, occurrences, tuple(c.count for c in tree))


def decode(bundle: ModelBundle, prompt_ids: list[int], cfg: DecodeConfig) -> Iterator[Event]:
    p = cfg.params
    sampler = cfg.sampler()
    budget = Budget(cfg.max_new_tokens, cfg.eos_ids)
    cache = new_cache(bundle)
    store = load_store(bundle)  # None where no datastore ships: every step is a plain one
    matcher = StoreMatcher(store, p["max_match"]) if store is not None else None

    context = yield from start(bundle, cache, prompt_ids, sampler, budget)
    step = 0
    while not budget.done:
        step += 1
        tree = TreeDraft()
        if matcher is not None:
            matcher.catch_up(context)
            # The target adds one token after the accepted path: drafts stay within remaining - 1.
            depth = min(p["num_draft"], budget.remaining - 1)
            tree, found = matcher.draft(depth, p["width"], p["nodes"])
            if found is not None:
                yield StoreMatch(step, found.n, found.occurrences, found.counts)
                yield draft_event(step, f"REST: datastore (match of {found.n})", tree)
        yield from verify_tree(
            bundle, cache, context, tree.tokens, tree.parents, sampler, budget, step
        )


# The declaration the registry, the CLI, the UI and trace validation derive from.
METHOD = Method(
    name="rest",
    family="draft and verify",
    rank=2,
    title="REST (retrieval from a datastore)",
    decode=decode,
    params=PARAMS,
    summary="Drafts the datastore's most frequent continuations of the context's longest "
    "occurring suffix, as a trie; one tree-masked forward verifies.",
    relaxable=True,
    views=("retrieval", "token_tree"),
    events=("StoreMatch", "Draft", "Verify"),
)
