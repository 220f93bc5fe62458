"""Speculative decoding (Leviathan et al. 2022; Chen et al. 2023): a cheap drafter proposes γ
tokens one by one, the target checks all of them in ONE forward.

    repeat:
        x = last committed token
        for j in 1..γ: d_j ~ q(· | context, x, d_<j)          # γ cheap draft forwards
        p = target([x, d_1 .. d_γ])                           # one target forward, γ + 1 rows
        greedy:   keep the longest prefix with d_j = argmax p_j, then the target's own token
        sampling: keep d_j with prob min(1, p_j(d_j) / q_j(d_j)); on the first rejection draw from
                  norm(max(0, p_j − q_j)); if all are kept, a bonus token from p_{γ+1}
        adaptive γ: all kept -> γ + 2, a rejection -> γ − 1 (transformers' heuristic schedule)
        cost:       γ is a cap; the draft ends before the first token whose path probability
                    (the product of the draft's p so far) no longer pays for its input in the
                    verifying forward on this machine (`costs.pays`, the token tree's rule)
        stop > 0: the draft also ends after the first token the drafter gives less than `stop`
                  probability: its confidence predicts acceptance (EAGLE-2), so a long γ is spent
                  where the drafter is sure and a short one where it guesses

The drafter is `self:k` (the target's first k layers + its LM head, sharing the target's KV cache,
LayerSkip-style), a trained EAGLE head, or another model with the same tokenizer (e.g.
SmolLM2-135M for SmolLM2-1.7B); the default, `auto`, is the EAGLE head shipped for the model, else
`self`.
"""

from __future__ import annotations

from collections.abc import Iterator

from decoders.core.base import Budget, DecodeConfig, Method, TourStop
from decoders.core.costs import forward_ms, input_cost, pays
from decoders.core.events import DraftStop, Event, Priced
from decoders.core.models import ModelBundle
from decoders.core.params import Param
from decoders.core.runtime import new_cache
from decoders.core.steps import chain_draft, draft_until_unsure, start, verify_chain
from decoders.trained.drafters import DRAFT_HELP, check_draft, make_drafter

PARAMS = (
    Param("draft", str, "auto", DRAFT_HELP),
    Param("gamma", int, 4, "γ: draft tokens per step (the starting value when adaptive)", 1, 16),
    Param(
        "schedule",
        str,
        "adaptive",
        "fixed γ; adaptive = grow on full acceptance, shrink on rejection; cost = γ is a cap, "
        "and the draft ends where its next token's path probability no longer pays for its "
        "input in the verifying forward on this machine (measured once per model)",
        choices=("fixed", "adaptive", "cost"),
    ),
    Param(
        "stop",
        float,
        0.0,
        "end the draft after the first token whose draft probability is below this "
        "(EAGLE-2's confidence as a proxy for acceptance); 0 = off",
        0.0,
        1.0,
    ),
)
MAX_GAMMA = 16


def decode(bundle: ModelBundle, prompt_ids: list[int], cfg: DecodeConfig) -> Iterator[Event]:
    sampler = cfg.sampler()
    budget = Budget(cfg.max_new_tokens, cfg.eos_ids)
    cache = new_cache(bundle)
    drafter = make_drafter(cfg.params["draft"], bundle, cache)
    gamma, adaptive = cfg.params["gamma"], cfg.params["schedule"] == "adaptive"
    stop = cfg.params["stop"]
    cost = input_cost(bundle) if cfg.params["schedule"] == "cost" else None

    context = yield from start(bundle, cache, prompt_ids, sampler, budget, drafter)
    if cost is not None:  # what the drafts are sized by here, for the run's record
        yield Priced(0, round(cost, 5), forward_ms=forward_ms(bundle))
    step = 0
    while not budget.done:
        step += 1
        for catch_up in drafter.begin(context, step):
            yield catch_up.event
        # The target adds one token of its own, so never draft past remaining - 1.
        room = min(gamma, budget.remaining - 1)
        path, total, kept = 1.0, 0.0, 0

        def pays_for(p: float) -> bool:  # schedule=cost: the path's next token pays its input
            nonlocal path, total, kept
            path *= p
            if not pays(path, total, kept, cost):
                return False
            total, kept = total + path, kept + 1
            return True

        drafted = yield from draft_until_unsure(
            lambda j, token, step=step: drafter.forward([token], step, logits_to_keep=1),
            context[-1],
            room,
            gamma,
            sampler,
            threshold=stop,
            confidence="drafted",
            pays_for=pays_for if cost is not None else None,
        )
        draft, q_rows, confidences, reason = (
            drafted.tokens,
            drafted.q_rows,
            drafted.confidences,
            drafted.reason,
        )
        drafter.end()
        if stop > 0 or cost is not None:  # a rule ended the draft: say which
            yield DraftStop(step, stop, tuple(confidences), reason)
        if draft:
            yield chain_draft(step, drafter.label, draft, q_rows)

        verdict, _ = yield from verify_chain(
            bundle, cache, context, draft, sampler, budget, step, q_rows, drafter
        )
        if adaptive and draft:
            full = len(verdict.accepted) == len(draft)
            gamma = min(MAX_GAMMA, gamma + 2) if full else max(1, gamma - 1)


# Its stop on the guided tour (ui/tour.py): the narration, what to look at, the telling step.
TOUR = (
    TourStop(
        chapter="guess",
        place=3,
        title="Guess and check: speculative decoding",
        narration=(
            "A small drafter (here a one-layer head trained on this model's features) proposes a "
            "few tokens; the target verifies them all in one forward. Each draft token is kept "
            "while it equals the target's own choice; at the first mismatch the target's token "
            "replaces it, so nothing the target would not write ever survives. The gain is the "
            "accepted length per forward minus what drafting cost. Under sampling, the same "
            "accept/reject rule keeps the output distribution exactly the target's."
        ),
        look=("the drafted tokens the target accepted (green) and the one it corrected."),
        head_drafted=True,
        ask=(
            "The drafter proposed the tokens in the top row. Which of them will the target keep, "
            "and where will it write its own token instead?"
        ),
        conceal=("target",),
    ),
    TourStop(
        chapter="lossy",
        place=4,
        title="Accepting more than the target would: relaxed verification",
        narration=(
            "Speculative decoding's exact rule keeps only what the target itself would write. "
            "Relaxed verification (SpecDec's β and τ) also accepts a draft token that is among "
            "the target's top β candidates and within τ of its best score. More tokens per "
            "forward ({{tour.relaxed.tpf}} here, against the exact rule's "
            "{{tour.speculative.tpf}}), and an output that drifts from greedy: the lab marks "
            "every token only the relaxed rule accepted, and reports how much of the output "
            "agrees with greedy."
        ),
        look=("the tokens only the relaxed rule accepted, beside the target's own choice."),
        rule="most_relaxed",
        key="relaxed",
        params={"draft": "eagle", "beta": 4, "tolerance": 2},
        head_drafted=True,
    ),
)


# The declaration the registry, the CLI, the UI and trace validation derive from.
METHOD = Method(
    tour=TOUR,
    name="speculative",
    family="draft and verify",
    rank=2,
    title="Speculative decoding (EAGLE head, a draft model, or self:k)",
    decode=decode,
    params=PARAMS,
    # Leviathan et al.: a fixed γ; the drafter stays ours (no smaller sibling model offline)
    presets={"paper": {"gamma": 4, "schedule": "fixed"}},
    check=check_draft,
    summary="A cheap drafter proposes γ tokens; the target accepts a prefix in one forward.",
    relaxable=True,
    views=("draft_panel",),
    events=("Draft", "DraftStop", "Priced", "Verify"),
    compare={
        # Who drafts matters more than how: the trained head against the model's first layers.
        "drafters: trained head vs the model's first layers": (
            "speculative:draft=eagle",
            "speculative:draft=self:8",
            "token_tree:draft=eagle",
            "token_tree:draft=self:8",
            # Kangaroo's first two layers + its trained adapter against the same two layers alone
            "kangaroo:exit_layer=2",
            "speculative:draft=self:2",
            "medusa",
        ),
        # SpecDec's relaxed acceptance on the EAGLE drafter: β = 1 is exact, larger β and τ keep
        # more drafts and drift from greedy.
        "relaxed verification: SpecDec's β and τ": (
            "speculative:draft=eagle",
            "speculative:draft=eagle:beta=2:tolerance=1",
            "speculative:draft=eagle:beta=4:tolerance=2",
            "speculative:draft=eagle:beta=8:tolerance=4",
        ),
    },
)
