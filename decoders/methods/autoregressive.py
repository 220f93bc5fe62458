"""Autoregressive decoding: one target forward per token. The reference every method is checked against.

prefill(prompt) -> logits
repeat: x_t = choose(logits); commit x_t; stop at EOS or budget; logits = forward(x_t)
"""

from __future__ import annotations

from collections.abc import Iterator

from decoders.core.base import Budget, DecodeConfig, Method, TourStop
from decoders.core.events import Commit, Event, Prefill, TopK
from decoders.core.models import ModelBundle
from decoders.core.runtime import forward, new_cache
from decoders.core.sampling import top_k


def decode(bundle: ModelBundle, prompt_ids: list[int], cfg: DecodeConfig) -> Iterator[Event]:
    sampler = cfg.sampler()
    budget = Budget(cfg.max_new_tokens, cfg.eos_ids)
    cache = new_cache(bundle)

    yield Prefill(tuple(prompt_ids))
    out = forward(bundle, cache, prompt_ids, step=0, kind="prefill", logits_to_keep=1)
    yield out.event
    step = 0
    while True:
        logits = out.logits[-1]
        probs = sampler.distribution(logits)
        token = sampler.pick(logits, probs)
        if cfg.detail:
            yield TopK(step, len(budget.tokens), *top_k(probs, cfg.top_k))
        budget.take([token])
        yield Commit(step, (token,), ("target",), (round(float(probs[token]), 6),))
        if budget.done:
            return
        step += 1
        out = forward(bundle, cache, [token], step=step, kind="target", logits_to_keep=1)
        yield out.event


# Its stop on the guided tour (ui/tour.py): the narration, what to look at, the telling step.
TOUR = (
    TourStop(
        chapter="bottleneck",
        place=1,
        title="The bottleneck: one token per forward",
        narration=(
            "A language model writes by predicting one token, appending it and running again. "
            "Each forward pass reads every weight of the model to produce a single token, so on "
            "most hardware the time goes into moving weights, not into arithmetic, and the "
            "machine could have checked several tokens for nearly the same price. Every method in "
            "this tour attacks that: it guesses tokens cheaply and lets one forward check many of "
            "them. This run is the reference every other stop is measured against."
        ),
        look=(
            "the model's top candidates at one step: it was unsure, and still it spent a whole "
            "forward to write one token."
        ),
        rule="least_sure",
    ),
)


# The declaration the registry, the CLI, the UI and trace validation derive from.
METHOD = Method(
    tour=TOUR,
    name="autoregressive",
    family="baseline",
    title="Autoregressive (baseline)",
    decode=decode,
    summary="One target forward per token: the reference every other method must match.",
    views=("topk_panel",),
    events=("TopK",),
    in_default_compare=False,  # the reference every comparison runs first
)
