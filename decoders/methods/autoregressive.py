"""Autoregressive decoding: one target forward per token. The reference every method is checked against.

prefill(prompt) -> logits
repeat: x_t = choose(logits); commit x_t; stop at EOS or budget; logits = forward(x_t)
"""

from __future__ import annotations

from collections.abc import Iterator

from decoders.core.base import Budget, DecodeConfig, Method
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


# The declaration the registry, the CLI, the UI and trace validation derive from.
METHOD = Method(
    name="autoregressive",
    family="baseline",
    title="Autoregressive (baseline)",
    decode=decode,
    summary="One target forward per token: the reference every other method must match.",
    views=("topk_panel",),
    events=("TopK",),
    in_default_compare=False,  # the reference every comparison runs first
)
