"""Jacobi decoding (Santilli et al. 2023): guess a block of m tokens, refine all of them in parallel.

Greedy decoding is the solution of a triangular nonlinear system y_i = argmax p(· | x, y_<i).
Jacobi iteration solves all m equations at once from a guess, and a fixed point is exactly the
greedy output. Each iteration is ONE forward over the last committed token and the m guesses:

    guesses g_1 .. g_m  (initially: copies of the last prompt tokens)
    repeat:
        o = argmax target([x, g_1 .. g_m])            # o_0 is always right: it follows x
        the guesses that already equal the target's output (g_1 = o_0, g_2 = o_1, …) have
        converged: commit them and the next output (≥ 1 token per iteration, so never slower in
        forwards than autoregressive)
        the remaining outputs become the next guesses; pad the block back to m

Greedy only: the fixed point is defined by argmax. Lossless token for token (shared verifier).
"""

from __future__ import annotations

from collections.abc import Iterator

from .base import Budget, DecodeConfig
from .events import Commit, Draft, Event, JacobiIteration, Prefill, Verify
from .models import ModelBundle
from .params import Param
from .runtime import crop_cache, forward, new_cache
from .tree import chain
from .verify import greedy_chain

PARAMS = (Param("block", int, 8, "m: tokens guessed and refined in parallel", 1, 32),)


def decode(bundle: ModelBundle, prompt_ids: list[int], cfg: DecodeConfig) -> Iterator[Event]:
    m = cfg.params["block"]
    budget = Budget(cfg.max_new_tokens, cfg.eos_ids)
    cache = new_cache(bundle)

    yield Prefill(tuple(prompt_ids))
    out = forward(bundle, cache, prompt_ids, step=0, kind="prefill", logits_to_keep=1)
    yield out.event
    first = greedy_chain([], out.logits)
    yield Commit(0, tuple(budget.take(first.tokens)), first.origins, first.probs)
    context = [*prompt_ids, *budget.tokens]
    # Initial guess: the tail of the prompt (any tokens work; the fixed point does not depend on it).
    guesses = (list(prompt_ids[-m:]) * m)[:m]
    previous: list[int] | None = None
    step = 0
    while not budget.done:
        step += 1
        in_cache = len(context) - 1
        block = guesses[: max(0, min(m, budget.remaining - 1))]
        changed = tuple(
            previous is None or i >= len(previous) or g != previous[i] for i, g in enumerate(block)
        )
        yield JacobiIteration(step, step, tuple(block), changed)
        if block:
            yield Draft(
                step,
                f"Jacobi guess (block of {len(block)})",
                tuple(block),
                chain(len(block)),
                (1.0,) * len(block),
            )
        out = forward(
            bundle, cache, [context[-1], *block], step=step, kind="verify" if block else "target"
        )
        yield out.event
        verdict = greedy_chain(block, out.logits)
        if block:
            yield Verify(
                step, verdict.accepted, verdict.correction, verdict.rule, verdict.target_probs
            )
        crop_cache(cache, in_cache + 1 + len(verdict.accepted))
        taken = budget.take(verdict.tokens)
        yield Commit(step, tuple(taken), verdict.origins[: len(taken)], verdict.probs[: len(taken)])
        context.extend(taken)
        # The target's outputs after the committed ones are the refined guesses for what follows.
        outputs = out.logits.argmax(dim=-1).tolist()
        guesses = outputs[len(verdict.accepted) + 1 :]
        previous = block[len(verdict.accepted) + 1 :]  # the old guesses for those same positions
        guesses += [guesses[-1] if guesses else context[-1]] * (m - len(guesses))
