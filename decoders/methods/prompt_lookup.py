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

from collections.abc import Iterator, Sequence

from decoders.core.base import Budget, DecodeConfig, Method
from decoders.core.events import CopySource, Draft, Event
from decoders.core.models import ModelBundle
from decoders.core.params import Param
from decoders.core.runtime import new_cache
from decoders.core.steps import start, verify_chain
from decoders.core.tree import chain

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


def find(
    context: Sequence[int], max_ngram: int, k: int, match: str = "earliest"
) -> tuple[list[int], int, int]:
    """The k tokens that followed an earlier occurrence of the longest matching suffix (the first
    occurrence, or the latest). Returns (draft, n, start): n the matched n-gram's length and start
    the index of its earlier occurrence in the context; ([], 0, -1) when nothing matches."""
    size = len(context)
    for n in range(min(max_ngram, size - 1), 0, -1):
        suffix = list(context[size - n :])
        # A match must leave at least one token after it, before the suffix itself.
        starts = range(size - n) if match == "earliest" else range(size - n - 1, -1, -1)
        for at in starts:
            if context[at : at + n] == suffix:
                return list(context[at + n : at + n + k]), n, at
    return [], 0, -1


def lookup(
    context: Sequence[int], max_ngram: int, k: int, match: str = "earliest"
) -> tuple[list[int], int]:
    """`find` without the position: (draft, n), ([], 0) when nothing matches."""
    draft, n, _ = find(context, max_ngram, k, match)
    return draft, n


def decode(bundle: ModelBundle, prompt_ids: list[int], cfg: DecodeConfig) -> Iterator[Event]:
    sampler = cfg.sampler()
    budget = Budget(cfg.max_new_tokens, cfg.eos_ids)
    cache = new_cache(bundle)
    max_ngram, k, match = cfg.params["max_ngram"], cfg.params["num_draft"], cfg.params["match"]

    context = yield from start(bundle, cache, prompt_ids, sampler, budget)
    step = 0
    while not budget.done:
        step += 1
        # The correction token x comes with this step's forward, so at most remaining - 1 drafts.
        draft, n, at = find(context, max_ngram, min(k, budget.remaining - 1), match)
        if draft:
            yield CopySource(step, at, n, len(context))
            yield Draft(
                step, f"prompt lookup (n={n})", tuple(draft), chain(len(draft)), (1.0,) * len(draft)
            )
        yield from verify_chain(bundle, cache, context, draft, sampler, budget, step)


# The declaration the registry, the CLI, the UI and trace validation derive from.
METHOD = Method(
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
