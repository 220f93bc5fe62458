"""Phases every draft-and-verify decoder shares: start (prefill + first token) and commit a verdict.

Written as generators that yield their events and return their result, so a method reads as its
paper's loop: `context = yield from start(...)`, then per step draft, `yield from verify_chain(...)`.
"""

from __future__ import annotations

from collections.abc import Generator, Sequence

import torch
from transformers import DynamicCache

from .base import Budget
from .drafters import Drafter
from .events import Commit, Event, Prefill, Verify
from .models import ModelBundle
from .runtime import crop_cache, forward
from .sampling import Sampler
from .verify import Verdict, greedy_chain, sample_deterministic_chain, speculative_chain


def start(
    bundle: ModelBundle,
    cache: DynamicCache,
    prompt_ids: list[int],
    sampler: Sampler,
    budget: Budget,
    drafter: Drafter | None = None,
) -> Generator[Event, None, list[int]]:
    """Prefill the prompt and commit the target's first token; returns the context so far.
    A feature-level `drafter` is handed the prompt's features."""
    yield Prefill(tuple(prompt_ids))
    wants = drafter is not None and drafter.needs_features
    out = forward(
        bundle, cache, prompt_ids, step=0, kind="prefill", logits_to_keep=1, features=wants
    )
    yield out.event
    if wants:
        drafter.observe(out.features)
    first = (
        greedy_chain([], out.logits)
        if sampler.greedy
        else sample_deterministic_chain([], out.logits, sampler)
    )
    yield Commit(0, tuple(budget.take(first.tokens)), first.origins, first.probs)
    return [*prompt_ids, *budget.tokens]


def commit(step: int, verdict: Verdict, budget: Budget, context: list[int]) -> Commit:
    """Append the verdict's tokens (as far as the budget and EOS allow) to the context."""
    taken = budget.take(verdict.tokens)
    context.extend(taken)
    return Commit(step, tuple(taken), verdict.origins[: len(taken)], verdict.probs[: len(taken)])


def verify_chain(
    bundle: ModelBundle,
    cache: DynamicCache,
    context: list[int],
    draft: Sequence[int],
    sampler: Sampler,
    budget: Budget,
    step: int,
    q_rows: Sequence[torch.Tensor] | None = None,
    drafter: Drafter | None = None,
) -> Generator[Event, None, tuple[Verdict, torch.Tensor]]:
    """ONE target forward over [x, *draft]; keep the verdict's tokens, crop the rest of the cache.
    `q_rows`: the draft's distributions (speculative sampling); None for point-mass drafts.
    A feature-level `drafter` is handed the features of the kept inputs.
    Returns the verdict and the forward's logits."""
    in_cache = len(context) - 1
    wants = drafter is not None and drafter.needs_features
    out = forward(
        bundle,
        cache,
        [context[-1], *draft],
        step=step,
        kind="verify" if draft else "target",
        features=wants,
    )
    yield out.event
    if sampler.greedy:
        verdict = greedy_chain(draft, out.logits)
    elif q_rows is None:
        verdict = sample_deterministic_chain(draft, out.logits, sampler)
    else:
        q = torch.stack(list(q_rows)) if q_rows else out.logits[:0]
        verdict = speculative_chain(draft, q, out.logits, sampler)
    if draft:
        yield Verify(step, verdict.accepted, verdict.correction, verdict.rule, verdict.target_probs)
    crop_cache(cache, in_cache + 1 + len(verdict.accepted))  # x and the accepted drafts stay
    if wants:
        drafter.observe(out.features[: 1 + len(verdict.accepted)])
    yield commit(step, verdict, budget, context)
    return verdict, out.logits
