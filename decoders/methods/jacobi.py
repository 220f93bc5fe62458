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

from decoders.core.base import Budget, DecodeConfig, Method, TourStop
from decoders.core.events import Draft, Event, JacobiIteration
from decoders.core.models import ModelBundle
from decoders.core.params import Param
from decoders.core.runtime import new_cache
from decoders.core.steps import start, verify_chain
from decoders.core.tree import chain

PARAMS = (Param("block", int, 8, "m: tokens guessed and refined in parallel", 1, 32),)


def decode(bundle: ModelBundle, prompt_ids: list[int], cfg: DecodeConfig) -> Iterator[Event]:
    m = cfg.params["block"]
    budget = Budget(cfg.max_new_tokens, cfg.eos_ids)
    cache = new_cache(bundle)

    sampler = cfg.sampler()  # greedy: Jacobi's fixed point is defined by argmax
    context = yield from start(bundle, cache, prompt_ids, sampler, budget)
    # Initial guess: the tail of the prompt (any tokens work; the fixed point does not depend on it).
    guesses = (list(prompt_ids[-m:]) * m)[:m]
    previous: list[int] | None = None
    step = 0
    while not budget.done:
        step += 1
        block = guesses[: max(0, min(m, budget.remaining - 1))]
        changed = tuple(
            previous is None or i >= len(previous) or g != previous[i] for i, g in enumerate(block)
        )
        # The block guesses output positions len(budget.tokens) onwards (after x, the last commit).
        yield JacobiIteration(step, step, tuple(block), changed, start=len(budget.tokens))
        if block:
            yield Draft(
                step,
                f"Jacobi guess (block of {len(block)})",
                tuple(block),
                chain(len(block)),
                (1.0,) * len(block),
            )
        verdict, logits = yield from verify_chain(
            bundle, cache, context, block, sampler, budget, step
        )
        # The target's outputs after the committed ones are the refined guesses for what follows.
        outputs = logits.argmax(dim=-1).tolist()
        guesses = outputs[len(verdict.accepted) + 1 :]
        previous = block[len(verdict.accepted) + 1 :]  # the old guesses for those same positions
        guesses += [guesses[-1] if guesses else context[-1]] * (m - len(guesses))


# Its stop on the guided tour (ui/tour.py): the narration, what to look at, the telling step.
TOUR = (
    TourStop(
        chapter="no_drafter",
        place=1,
        title="Guessing without a drafter: Jacobi iteration",
        narration=(
            "Jacobi decoding needs no drafter at all. It guesses a whole block of future tokens, "
            "runs the model once over the block, and replaces every guess with the model's "
            "prediction at that position. Tokens at the front become correct first; a guess that "
            "stays the same between iterations has reached a fixed point and can be committed. "
            "Lossless, because each committed token is verified against the model's own choice, "
            "but plain guesses rarely converge more than a token or two ahead."
        ),
        look=("the block's guesses changing between iterations, and which settled."),
        ask=(
            "Each row is one forward over the whole block of guesses, fed the row above. Which "
            "guesses of the last row have settled, so that the target keeps them?"
        ),
    ),
)


# The declaration the registry, the CLI, the UI and trace validation derive from.
METHOD = Method(
    tour=TOUR,
    name="jacobi",
    family="parallel",
    rank=1,
    title="Jacobi decoding (parallel fixed-point iteration)",
    decode=decode,
    params=PARAMS,
    presets={"paper": {"block": 16}},
    sampling=False,
    summary="Refines a block of guessed tokens in parallel; commits the converged prefix.",
    views=("jacobi_trajectory",),
    events=("Draft", "JacobiIteration", "Verify"),
)
