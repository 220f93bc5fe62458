"""SAM-Decoding (Hu et al. 2024): draft by retrieval, found with suffix automata.

Two automata answer one question at every step: what is the longest suffix of the context that
occurred before, and what followed it?
- the context's own automaton, grown by one token per committed token (the prompt, the chat
  template, the output so far): the continuation of the suffix's first earlier occurrence is
  copied, as prompt lookup copies, but after the LONGEST match rather than at most 3 tokens;
- a static automaton over a datastore (here: the target's own writing, decoders/trained/datastore.py):
  the suffix's continuations are ranked by how often the datastore continues it, a small tree.
Each match is kept up to date in amortised constant time per token (follow the transition, or
the suffix links until one exists), so retrieval costs no forward at all.

    repeat:
        x = last committed token; feed it to both matches
        the longer match wins (the context on a tie: its own words are the better guess);
        context:   draft = the tokens after the suffix's first earlier occurrence (a chain)
        datastore: draft = the most frequent continuations, a tree (`width` children a node)
        nothing matched (or shorter than min_match): a plain autoregressive step
        p = target([x, *draft]) under a tree mask; keep the target's path, commit
Greedy is token-for-token lossless; sampling uses the multi-draft rule for point-mass drafts.
The paper switches to a model drafter when the match is short: that is `token_tree`'s retrieval
branch (copy=sam), which grafts this draft onto the EAGLE tree.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from decoders.core.base import Budget, DecodeConfig, Method
from decoders.core.events import CopySource, Draft, Event, StoreMatch
from decoders.core.models import ModelBundle
from decoders.core.params import Param
from decoders.core.runtime import new_cache
from decoders.core.steps import start, verify_tree
from decoders.core.suffix_automaton import ContextMatch, StaticAutomaton
from decoders.core.tree import chain
from decoders.trained.datastore import load_store

PARAMS = (
    Param(
        "num_draft",
        int,
        8,
        "tokens drafted per step: the copied chain's length, the tree's depth",
        1,
        32,
    ),
    Param("width", int, 2, "datastore: continuations kept per node (most frequent first)", 1, 8),
    Param("nodes", int, 12, "datastore: nodes of the retrieved tree, at most", 1, 64),
    Param(
        "min_match",
        int,
        1,
        "draft only after a match of at least this many tokens (1: any match; on the tuning "
        "prompts 1 verified 2.03 tokens per forward, 2 verified 1.88)",
        1,
        8,
    ),
    Param(
        "store",
        str,
        "auto",
        "auto = also search the datastore shipped for this model (the context alone when none "
        "ships); none = the context only",
        choices=("auto", "none"),
    ),
)


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
    return Retriever(prompt_ids, load_store(bundle) if store == "auto" else None)


def decode(bundle: ModelBundle, prompt_ids: list[int], cfg: DecodeConfig) -> Iterator[Event]:
    p = cfg.params
    sampler = cfg.sampler()
    budget = Budget(cfg.max_new_tokens, cfg.eos_ids)
    cache = new_cache(bundle)
    found = retriever(bundle, prompt_ids, p["store"])

    context = yield from start(bundle, cache, prompt_ids, sampler, budget)
    step = 0
    while not budget.done:
        step += 1
        found.catch_up(context)
        # The target adds one token after the accepted path: drafts stay within remaining - 1.
        draft = found.retrieve(
            min(p["num_draft"], budget.remaining - 1), p["width"], p["nodes"], p["min_match"]
        )
        tokens, parents = (draft.tokens, draft.parents) if draft else ((), ())
        if draft:
            yield from draft.events(step, len(context))
            yield Draft(
                step, f"SAM: {draft.source} (match of {draft.n})", tokens, parents, draft.probs
            )
        yield from verify_tree(bundle, cache, context, tokens, parents, sampler, budget, step)


# The declaration the registry, the CLI, the UI and trace validation derive from.
METHOD = Method(
    name="sam",
    family="draft and verify",
    rank=2,
    title="SAM-Decoding (suffix-automaton retrieval)",
    decode=decode,
    params=PARAMS,
    # Hu et al. 2024 draft up to 40 retrieved tokens on a GPU (min match as here); no tree there
    presets={"paper": {"num_draft": 32, "width": 1, "nodes": 32, "min_match": 2, "store": "auto"}},
    summary="Finds the longest earlier match of the context's end, in the context or a "
    "datastore, with suffix automata; copies what followed; one forward verifies.",
    relaxable=True,
    views=("retrieval", "token_tree"),
    events=("CopySource", "StoreMatch", "Draft", "Verify"),
)
