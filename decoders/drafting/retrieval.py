"""SAM-Decoding's retrieval (Hu et al. 2024): the longest earlier match of the context's end, in
the context itself or in a datastore, found with suffix automata, and what followed it.

The context's automaton is grown by one token per committed token; the datastore's is static
(decoders/trained/datastore.py). Each match is kept up to date in amortised constant time per
token, so retrieval costs no forward at all.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from decoders.core.events import CopySource, Event, StoreMatch
from decoders.core.models import ModelBundle
from decoders.core.suffix_automaton import ContextMatch, StaticAutomaton
from decoders.core.tree import chain
from decoders.drafting.trees import TreeDraft
from decoders.trained.datastore import load_store

if TYPE_CHECKING:
    import torch


@dataclass(frozen=True)
class Retrieved:
    """A retrieved draft: from the `context` (a chain copied after the match at `start`) or the
    `datastore` (a frequency-ranked tree; `counts` per node, the suffix occurring `occurrences`
    times). `n`: the matched suffix's length."""

    source: str
    n: int
    tokens: tuple[int, ...]
    parents: tuple[int, ...]
    probs: tuple[float, ...]
    start: int = -1
    occurrences: int = 0
    counts: tuple[int, ...] = ()

    def events(self, step: int, context_len: int, first: int = 0) -> list[Event]:
        """Where it came from, as the trace records it (the Draft is the caller's)."""
        if self.source == "context":
            return [CopySource(step, self.start, self.n, context_len)]
        return [StoreMatch(step, self.n, self.occurrences, self.counts, first)]


class Retriever:
    """Both matches for one run: fed every committed token, asked for a draft at each step."""

    def __init__(self, prompt_ids: Sequence[int], store: StaticAutomaton | None) -> None:
        self.context = ContextMatch()
        self.store = store
        self.state, self.length = 0, 0
        self.fed = 0
        self.feed(prompt_ids)

    def feed(self, tokens: Sequence[int]) -> None:
        self.context.feed(tokens)
        self.fed += len(tokens)
        if self.store is not None:
            for t in tokens:
                self.state, self.length = self.store.step(self.state, self.length, t)

    def catch_up(self, context: Sequence[int]) -> None:
        """Feed what the context gained since the last call."""
        self.feed(context[self.fed :])

    def retrieve(
        self, k: int, width: int = 2, nodes: int = 12, min_match: int = 1, chain_only: bool = False
    ) -> Retrieved | None:
        """The draft of the longer match (the context's on a tie), or None. `chain_only`: a
        datastore draft is its single most frequent path."""
        if k <= 0:
            return None
        n_ctx = self.context.length
        n_store = self.length if self.store is not None else 0
        if n_ctx >= max(n_store, min_match):
            tokens, at = self.context.continuation(k)
            if tokens:
                return Retrieved(
                    "context", n_ctx, tuple(tokens), chain(len(tokens)), (1.0,) * len(tokens), at
                )
        if self.store is None or n_store < min_match:
            return None
        tree = self.store.tree(
            self.state, k, 1 if chain_only else width, k if chain_only else nodes
        )
        if not tree:
            return None
        return Retrieved(
            "datastore",
            n_store,
            tuple(c.token for c in tree),
            tuple(c.parent for c in tree),
            tuple(round(c.share, 6) for c in tree),
            occurrences=int(self.store.count[self.state]),
            counts=tuple(c.count for c in tree),
        )


def retriever(bundle: ModelBundle, prompt_ids: Sequence[int], store: str) -> Retriever:
    """A run's retriever: the context's automaton, and the datastore's when `store` is "auto"
    and one ships for the model."""
    return Retriever(prompt_ids, load_store(bundle) if store == "auto" else None)


class RetrievalProposer:
    """A Retriever as a Proposer: the longer match's draft (up to k tokens deep; a tree of
    `width` children a node and at most `nodes` from the datastore). `last`: what the last
    proposal retrieved, for its events."""

    def __init__(
        self, found: Retriever, k: int, width: int = 2, nodes: int = 12, min_match: int = 1
    ) -> None:
        self.found, self.k = found, k
        self.width, self.nodes, self.min_match = width, nodes, min_match
        self.last: Retrieved | None = None

    def propose(self, context: Sequence[int], step: int, budget_left: int) -> TreeDraft | None:
        self.found.catch_up(context)
        self.last = self.found.retrieve(
            min(self.k, budget_left), self.width, self.nodes, self.min_match
        )
        got = self.last
        return TreeDraft.from_nodes(got.tokens, got.parents, got.probs) if got else None

    def accepted(
        self, tree: TreeDraft, accepted_nodes: Sequence[int], logits: torch.Tensor
    ) -> None:
        """Nothing to learn here: the next proposal feeds the automata what was committed."""
