"""Prompt lookup decoding (Saxena 2023): draft by copying what followed the last n-gram before.

No draft model at all: the draft is found in the text itself. Code edits, summaries and RAG answers
repeat long spans of their context, so the tokens that followed an earlier occurrence of the
current suffix are a good guess.

    repeat:
        x = last committed token (not yet in the KV cache)
        for n = N .. 1: find the earliest (or latest) earlier occurrence of the last n tokens;
                        draft = the k tokens after it
        logits = target([x] + draft)                 # ONE forward verifies the whole draft
        commit the longest matching prefix + the target's own next token (shared verifier)
        crop the cache to the committed tokens
An empty pool (no match) is a plain autoregressive step. Greedy is token-for-token lossless;
sampling uses the deterministic-draft rejection rule, lossless in distribution.
"""

from __future__ import annotations

from collections.abc import Iterator

from decoders.core.base import Budget, DecodeConfig, Method, TourStop
from decoders.core.events import CopySource, Event
from decoders.core.models import ModelBundle
from decoders.core.params import Param
from decoders.core.runtime import new_cache
from decoders.core.steps import start, verify_chain
from decoders.drafting.ngram import NgramProposer
from decoders.drafting.trees import draft_event

PARAMS = (
    Param("max_ngram", int, 3, "N: longest suffix n-gram to look up (tries N, N-1, …, 1)", 1, 8),
    Param("num_draft", int, 10, "k: tokens copied into each draft", 1, 32),
    Param(
        "match",
        str,
        "earliest",
        "which earlier occurrence to copy from: the first (usually the prompt) or the latest",
        choices=("earliest", "latest"),
    ),
)


def decode(bundle: ModelBundle, prompt_ids: list[int], cfg: DecodeConfig) -> Iterator[Event]:
    sampler = cfg.sampler()
    budget = Budget(cfg.max_new_tokens, cfg.eos_ids)
    cache = new_cache(bundle)
    ngram = NgramProposer(cfg.params["max_ngram"], cfg.params["num_draft"], cfg.params["match"])

    context = yield from start(bundle, cache, prompt_ids, sampler, budget)
    step = 0
    while not budget.done:
        step += 1
        # The correction token x comes with this step's forward, so at most remaining - 1 drafts.
        draft = ngram.propose(context, step, budget.remaining - 1)
        if draft:
            yield CopySource(step, ngram.start, ngram.n, len(context))
            yield draft_event(step, f"prompt lookup (n={ngram.n})", draft)
        tokens = draft.tokens if draft else []
        yield from verify_chain(bundle, cache, context, tokens, sampler, budget, step)


# Its stop on the guided tour (ui/tour.py): the narration, what to look at, the telling step.
TOUR = (
    TourStop(
        chapter="guess",
        place=1,
        title="Guess by copying from the prompt",
        narration=(
            "The cheapest guess costs nothing: code and edits repeat what is already written. "
            "Prompt lookup finds the last few tokens earlier in the context and proposes whatever "
            "followed them there. The target model then runs once over the guess: it keeps the "
            "longest prefix that matches what it would have written itself and adds one token of "
            "its own. A wrong guess costs only a slightly wider forward; the output is exactly "
            "greedy's."
        ),
        look=("where the copy came from in the context, and how much of it the target kept."),
        ask=(
            "The text's last tokens (dotted blue) also occur earlier (solid blue); the drafter "
            "copied what followed them there. How many of the copied tokens will the target keep?"
        ),
    ),
)


# The declaration the registry, the CLI, the UI and trace validation derive from.
METHOD = Method(
    tour=TOUR,
    name="prompt_lookup",
    family="draft and verify",
    rank=1,
    title="Prompt lookup (n-gram copy drafts)",
    decode=decode,
    params=PARAMS,
    presets={"paper": {"max_ngram": 3, "num_draft": 10, "match": "earliest"}},
    summary="Drafts by copying what followed the last matching n-gram; one forward verifies.",
    relaxable=True,
    # the copy's source, then the draft against what was kept
    views=(
        "copy_source",
        "draft_panel",
    ),
    events=("CopySource", "Draft", "Verify"),
)
