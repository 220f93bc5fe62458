"""Draft & Verify (Zhang et al. 2023): self-speculative decoding by skipping intermediate layers.

The draft is the target itself with a fixed set of attention and MLP sublayers left out, so it
needs no extra weights and shares the target's KV cache. The set is searched offline with
Bayesian optimisation (`python -m decoders.search_skip`) and ships in `assets/skip_sets/`
(read by decoders/trained/skip_sets.py).

    repeat:
        x = last committed token
        drafting: feed x, then each draft token, through the skipping model; stop after the
                  first token whose top probability falls below the threshold θ (it is kept:
                  its forward is paid), or at max_draft tokens
        p = target([x, d_1 .. d_n])                  # ONE full forward verifies the draft
        keep the longest prefix the target agrees with (greedy) / the rejection rule (sampling)
        adapt θ to the acceptance rate (the paper's rule):
            AR ← β1·AR + (1 − β1)·accepted/drafted
            θ' = θ + ε if AR ≤ α else θ − ε;   θ ← β2·θ + (1 − β2)·θ'
A low acceptance rate raises θ (draft less, stop earlier); a high one lowers it (draft further).
"""

from __future__ import annotations

from collections.abc import Iterator

from decoders.core.base import Budget, DecodeConfig, Method, TourStop
from decoders.core.events import DraftStop, Event
from decoders.core.models import ModelBundle
from decoders.core.params import Param
from decoders.core.runtime import crop_cache, forward, new_cache, require_layers
from decoders.core.steps import chain_draft, draft_until_unsure, start, verify_chain
from decoders.trained.skip_sets import resolve_skip

ALPHA, EPSILON, BETA1, BETA2 = 0.85, 0.01, 0.5, 0.9  # target acceptance rate and update rates

PARAMS = (
    Param(
        "skip",
        str,
        "searched",
        "sublayers the draft leaves out: 'searched' (the optimised set shipped for this model) "
        "or e.g. 'attn:10,12 mlp:11,13'",
    ),
    # θ = 0.6, the paper's start. On SmolLM2-135M a draft forward reads 91 % of the weights and
    # each extra draft is accepted ~55 % of the time, so drafting less pays: modelled speedups on
    # held-out prompts 0.62 / 0.72 / 0.76 / 0.78 / 0.79 at θ = 0.3 / 0.4 / 0.5 / 0.6 / 0.7.
    Param(
        "threshold",
        float,
        0.6,
        "θ: the draft ends with the first token whose top probability is below θ",
        0.0,
        1.0,
    ),
    Param("adaptive", bool, True, "adapt θ to the acceptance rate (Draft & Verify's rule)"),
    Param("max_draft", int, 10, "most draft tokens per step", 1, 32),
)


def check(bundle: ModelBundle, params) -> None:
    require_layers(bundle, "skipping layers")
    resolve_skip(bundle, params["skip"])


def update_threshold(
    threshold: float, rate: float, accepted: int, drafted: int
) -> tuple[float, float]:
    """The paper's adaptive rule after one verified draft: returns the new (θ, smoothed rate)."""
    rate = BETA1 * rate + (1 - BETA1) * accepted / drafted
    nudged = threshold + EPSILON if rate <= ALPHA else threshold - EPSILON
    return min(1.0, max(0.0, BETA2 * threshold + (1 - BETA2) * nudged)), rate


def decode(bundle: ModelBundle, prompt_ids: list[int], cfg: DecodeConfig) -> Iterator[Event]:
    p = cfg.params
    skip = resolve_skip(bundle, p["skip"])
    label = f"skip {len(skip.attn)} attn + {len(skip.mlp)} MLP of {bundle.n_layers} layers"
    sampler = cfg.sampler()
    budget = Budget(cfg.max_new_tokens, cfg.eos_ids)
    cache = new_cache(bundle)
    threshold, rate = p["threshold"], ALPHA

    context = yield from start(bundle, cache, prompt_ids, sampler, budget)
    step = 0
    while not budget.done:
        step += 1
        in_cache = len(context) - 1
        # The target's own token comes with the verify forward: at most remaining - 1 drafts. As
        # in the authors' code, the token that falls below θ is still drafted and drafting stops
        # after it.
        drafted = yield from draft_until_unsure(
            lambda j, token, step=step, at=in_cache: forward(
                bundle, cache, [token], step=step, kind="draft", positions=[at + j], skip=skip
            ),
            context[-1],
            min(p["max_draft"], budget.remaining - 1),
            p["max_draft"],
            sampler,
            threshold=threshold,
            eos_ids=budget.eos_ids,
        )
        draft, q_rows, confidences, reason = (
            drafted.tokens,
            drafted.q_rows,
            drafted.confidences,
            drafted.reason,
        )
        crop_cache(cache, in_cache)  # drop the draft's KV from the layers it ran
        yield DraftStop(step, round(threshold, 6), tuple(confidences), reason, round(rate, 6))
        if draft:
            yield chain_draft(step, label, draft, q_rows)

        verdict, _ = yield from verify_chain(
            bundle, cache, context, draft, sampler, budget, step, q_rows
        )
        if p["adaptive"] and draft:
            threshold, rate = update_threshold(threshold, rate, len(verdict.accepted), len(draft))


# Its stop on the guided tour (ui/tour.py): the narration, what to look at, the telling step.
TOUR = (
    TourStop(
        chapter="self",
        place=2,
        title="The model drafts for itself: Draft & Verify",
        narration=(
            "Draft & Verify drafts with the full model minus some of its layers (a skip set "
            "searched once for this model). No training, nothing extra to load. Whether it wins "
            "depends on how much cheaper the skipping draft is than a full forward, and how many "
            "of its tokens survive: a draft forward here skips only a few layers, so a step must "
            "accept several tokens to pay for itself. The verdict under the figure does that sum."
        ),
        look=(
            "the drafted tokens' confidence against θ (the last one, below it, ended the draft "
            "and was still verified) and the sentence under the bars: did drafting pay?"
        ),
    ),
)


# The declaration the registry, the CLI, the UI and trace validation derive from.
METHOD = Method(
    tour=TOUR,
    name="self_speculative",
    family="self-drafting",
    rank=1,
    title="Draft & Verify (self-speculative, skipped layers)",
    decode=decode,
    params=PARAMS,
    # Zhang et al. 2024, the authors' evaluation: θ starts at 0.6 and adapts, 12 drafts at most
    presets={"paper": {"threshold": 0.6, "adaptive": True, "max_draft": 12}},
    check=check,
    summary="The model drafts for itself with searched attention/MLP sublayers skipped.",
    relaxable=True,
    views=("self_speculative_panel",),
    events=("Draft", "DraftStop", "Verify"),
)
