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

from collections.abc import Iterator

from decoders.core.base import Budget, DecodeConfig, Method, TourStop
from decoders.core.events import Event
from decoders.core.models import ModelBundle
from decoders.core.params import Param
from decoders.core.runtime import new_cache
from decoders.core.steps import start, verify_tree
from decoders.drafting.retrieval import RetrievalProposer, retriever
from decoders.drafting.trees import TreeDraft, draft_event

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


def decode(bundle: ModelBundle, prompt_ids: list[int], cfg: DecodeConfig) -> Iterator[Event]:
    p = cfg.params
    sampler = cfg.sampler()
    budget = Budget(cfg.max_new_tokens, cfg.eos_ids)
    cache = new_cache(bundle)
    store = retriever(bundle, prompt_ids, p["store"])
    found = RetrievalProposer(store, p["num_draft"], p["width"], p["nodes"], p["min_match"])

    context = yield from start(bundle, cache, prompt_ids, sampler, budget)
    step = 0
    while not budget.done:
        step += 1
        # The target adds one token after the accepted path: drafts stay within remaining - 1.
        tree = found.propose(context, step, budget.remaining - 1) or TreeDraft()
        if found.last is not None:
            yield from found.last.events(step, len(context))
            label = f"SAM: {found.last.source} (match of {found.last.n})"
            yield draft_event(step, label, tree)
        yield from verify_tree(
            bundle, cache, context, tree.tokens, tree.parents, sampler, budget, step
        )


# Its stop on the guided tour (ui/tour.py): the narration, what to look at, the telling step.
TOUR = (
    TourStop(
        chapter="guess",
        place=2,
        title="Copy the longest match, from the text or a datastore: SAM",
        narration=(
            "Prompt lookup copies after a match of at most three tokens. SAM-Decoding keeps two "
            "suffix automata, structures that find the longest suffix of a growing text seen "
            "before in constant time per token: one over the prompt and output, one over a "
            "datastore of the model's own writing. The longer match wins: a context match is "
            "copied as a chain, a datastore match drafts its most frequent continuations as a "
            "small tree. Still no draft model, and the target still decides every token."
        ),
        look=("where the draft came from, the matched suffix, and how much of it the target kept."),
    ),
)


# The declaration the registry, the CLI, the UI and trace validation derive from.
METHOD = Method(
    tour=TOUR,
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
