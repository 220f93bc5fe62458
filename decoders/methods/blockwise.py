"""Blockwise parallel decoding (Stern et al. 2018) with the Medusa heads as proposal models.

Stern's p_1 is the model itself and p_2..p_k guess one more token ahead each; here the heads are
those proposal models: head i reads the final features where the target chose x and guesses the
token i positions after it. Predict, verify, accept, with the verify forward also giving the next
block's features ("combined scoring and proposal": one target forward per step).

    f = the target's final features where it chose x           # prefill, then each verify forward
    repeat:
        predict: d_i = argmax head_i(f), i = 1..k               # no decoder layer runs
        verify:  p, F = target([x, d_1 .. d_k])                 # ONE forward: logits and features
        accept:  greedy: the longest prefix with d_i = argmax p_i, then the target's own token
                 sampling: keep d_i with probability p_i(d_i) (a point mass: d_i was not sampled);
                 on a rejection draw from p_i with d_i removed (the exact rule, verify.py)
        f = F at the last accepted position                     # where the target chose the next x

With k heads a step commits at most k + 1 tokens: Stern's block size k + 1 (their p_1 is the
target's own token, here the correction or bonus that ends each step).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

from decoders.core.base import Budget, DecodeConfig, Method, TourStop
from decoders.core.errors import InvalidParameter
from decoders.core.events import Draft, Event
from decoders.core.models import ModelBundle
from decoders.core.params import Param
from decoders.core.runtime import new_cache
from decoders.core.steps import start, verify_chain
from decoders.core.tree import chain
from decoders.trained.medusa_heads import HEADS_HELP, HeadReader, Heads, heads_for

MAX_K = 10  # Stern et al. go up to a block of 10

PARAMS = (
    Param(
        "k",
        int,
        4,
        "heads used: the block is x plus each head's top token (Stern's block size k + 1); at most "
        "the heads shipped for the model",
        1,
        MAX_K,
    ),
    Param("heads", str, "", HEADS_HELP),
)


def check(bundle: ModelBundle, params: Mapping[str, Any]) -> None:
    n = heads_for(bundle, params["heads"]).n_heads
    if params["k"] > n:
        named = params["heads"].strip()
        where = f"the heads {named!r} are" if named else f"{bundle.model_id} ships"
        raise InvalidParameter(
            f"k = {params['k']}: {where} {n} Medusa heads, so k must be in 1..{n}"
        )


def decode(bundle: ModelBundle, prompt_ids: list[int], cfg: DecodeConfig) -> Iterator[Event]:
    yield from decode_with(bundle, prompt_ids, cfg, heads_for(bundle, cfg.params["heads"]))


def decode_with(
    bundle: ModelBundle, prompt_ids: list[int], cfg: DecodeConfig, heads: Heads
) -> Iterator[Event]:
    """`decode` with the given heads (the shipped ones, or a file being evaluated)."""
    k = cfg.params["k"]
    sampler = cfg.sampler()
    budget = Budget(cfg.max_new_tokens, cfg.eos_ids)
    cache = new_cache(bundle)
    reader = HeadReader(bundle, heads)  # is handed the features of every forward's kept inputs

    context = yield from start(bundle, cache, prompt_ids, sampler, budget, reader)
    step = 0
    while not budget.done:
        step += 1
        # Predict: each head's top token. The target adds one token after the accepted prefix,
        # so the block stops at remaining - 1 drafts.
        n = min(k, budget.remaining - 1)
        draft: list[int] = []
        if n:
            # The heads' top few are recorded for the view (where the right token ranked).
            top = cfg.top_k if cfg.detail else 1
            proposal = yield from reader.read(n, top, step, len(budget.tokens), cfg.detail)
            draft = [row[0] for row in proposal.tokens]
            probs = tuple(row[0] for row in proposal.probs)
            yield Draft(step, "blockwise", tuple(draft), chain(n), probs)

        # Verify and accept (and score the next block): ONE target forward over [x, *draft].
        yield from verify_chain(
            bundle, cache, context, draft, sampler, budget, step, drafter=reader
        )


# Its stop on the guided tour (ui/tour.py): the narration, what to look at, the telling step.
TOUR = (
    TourStop(
        chapter="self",
        place=5,
        title="The model drafts for itself: Blockwise parallel decoding",
        narration=(
            "Blockwise parallel decoding is Medusa's ancestor: k heads, each guessing one "
            "position ahead, but only their top token, as one chain. The target verifies the "
            "chain and keeps the longest prefix it agrees with. Simple, and weaker than a tree: "
            "one wrong head ends the step, and a head far ahead is right less often than the one "
            "before it. Its guesses come from the same forward that verified the last ones, as "
            "Medusa's do."
        ),
        look=("the chain of head guesses and where the target first disagreed."),
        head_drafted=True,
    ),
)


# The declaration the registry, the CLI, the UI and trace validation derive from.
METHOD = Method(
    tour=TOUR,
    name="blockwise",
    family="draft and verify",
    rank=5,
    title="Blockwise parallel decoding (the Medusa heads' top-1 chain)",
    decode=decode,
    params=PARAMS,
    # Stern et al. 2018 sweep blocks of 2-10 tokens; the shipped heads allow 4 + 1
    presets={"paper": {"k": 4}},
    check=check,
    summary="Each head guesses one token further ahead; their top picks are verified as one chain.",
    relaxable=True,
    # the chain, then each head's top few: where the right token ranked
    views=(
        "blockwise_chain",
        "heads_grid",
    ),
    events=("Draft", "HeadProposals", "Verify"),
)
