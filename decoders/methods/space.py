"""SPACE (Yi et al. 2024, "Generation Meets Verification"): auto-correct decoding. One forward both
verifies the previous step's guesses and makes the next ones, with [MASK] inputs the model was
tuned to fill (decoders/trained/mask_model.py: a frozen base plus an adapter on mask rows only).

    inputs  = x  M·k   c_1 M·k   c_2 M·k  …  c_m M·k        x: the last committed token,
                                                             c_i: last step's guesses, M: a mask
              (fed real inputs first, then the groups: the same attention and positions)
    attention: causal among x, c_1 .. c_m; mask group g (after c_g, or after x for g = 0) sees the
               cache, x, c_1 .. c_g and the masks before it in its own group: every group is hidden
               from every later row, so x and the c_i see exactly what plain decoding would
    positions: each input's position is the number of earlier inputs it can see
    one forward:
        verify c_1 .. c_m against the rows of x, c_1 .. c_{m-1} (greedy: argmax; sampling: the exact
        rejection rule with the mask rows' distributions as q), keep the accepted prefix c_1 .. c_a
        and the target's own token b from the row of c_a (a correction, or a bonus when a = m)
        the next guesses are what group a (the one after the last accepted input) predicted for
        the k positions after b: the group that hands over
    the cache keeps the prefix and the accepted inputs only; masks and rejected guesses go

The prefill runs [prompt, M·k] at once, so the first step already has guesses.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

import torch

from decoders.core.base import Budget, DecodeConfig, Method, TourStop
from decoders.core.errors import InvalidParameter
from decoders.core.events import AttentionMask, Event, MaskGroups, Prefill
from decoders.core.models import ModelBundle
from decoders.core.params import Param
from decoders.core.runtime import new_cache
from decoders.core.sampling import Sampler
from decoders.core.steps import chain_draft, commit, judge_chain, settle_chain, visible_rows
from decoders.trained.mask_model import forward_masked, load_adapter

PARAMS = (
    # Defaults tuned on assets/tuning_prompts.jsonl (CPU): k = 2, 2 groups ran at ~1.1x, while
    # k = 4 with 4 groups (25 inputs a forward) ran at ~0.7x.
    Param(
        "k",
        int,
        2,
        "masks per group = guesses per step, up to the adapter's; 0 = as many as it was trained with",
        0,
        8,
    ),
    Param(
        "groups",
        int,
        2,
        "cap on the candidates verified per step (each brings its own k masks, so the forward "
        "has 1 + k + groups·(k + 1) inputs); 0 = k",
        0,
        8,
    ),
)


def check(bundle: ModelBundle, params: Mapping[str, Any]) -> None:
    adapter = load_adapter(bundle)
    if params["k"] > adapter.k:
        raise InvalidParameter(
            f"k = {params['k']}: the mask adapter for {bundle.model_id} was trained with "
            f"k = {adapter.k} masks per group (use 1..{adapter.k}, or 0 for all of them)"
        )


def layout(m: int, k: int, in_cache: int) -> tuple[list[int], list[int], torch.Tensor, list[int]]:
    """The step's inputs for m candidates and groups of k masks, fed as [x, c_1 .. c_m, group 0,
    .., group m] (the real inputs first: the adapter then acts on one slice of rows, and keeping
    the accepted inputs' KV is a crop; attention and positions, not the order, make the layout).
    Returns the indices of the real inputs, each input's position, the additive attention mask
    [1, 1, n, in_cache + n], and each input's group (-1 for real inputs)."""
    real = list(range(m + 1))
    group = [-1] * (m + 1) + [g for g in range(m + 1) for _ in range(k)]
    positions = [in_cache + i for i in real]
    positions += [in_cache + g + 1 + j for g in range(m + 1) for j in range(k)]
    n = len(group)
    sees = torch.zeros(n, n, dtype=torch.bool)
    for i in real:  # x, c_1 .. c_i: exactly what plain decoding would see
        sees[i, : i + 1] = True
    for g in range(m + 1):
        start = m + 1 + g * k
        for j in range(k):  # the real inputs up to its anchor, its own group up to itself
            sees[start + j, : g + 1] = True
            sees[start + j, start : start + j + 1] = True
    mask = torch.zeros(n, in_cache + n)
    mask[:, in_cache:] = torch.where(sees, 0.0, float("-inf"))
    return real, positions, mask.view(1, 1, n, in_cache + n), group


def decode(bundle: ModelBundle, prompt_ids: list[int], cfg: DecodeConfig) -> Iterator[Event]:
    adapter = load_adapter(bundle)
    k = cfg.params["k"] or adapter.k
    cap = cfg.params["groups"] or k
    sampler = cfg.sampler()
    budget = Budget(cfg.max_new_tokens, cfg.eos_ids)
    cache = new_cache(bundle)

    # Prefill: the prompt, then one group of masks after its last token.
    yield Prefill(tuple(prompt_ids))
    n = len(prompt_ids)
    mask = torch.full((n + k, n + k), float("-inf")).triu(1)
    mask[n:, n:] = torch.full((k, k), float("-inf")).triu(1)  # masks: causal among themselves
    out = forward_masked(
        bundle,
        adapter,
        cache,
        [*prompt_ids, *[0] * k],
        n,
        step=0,
        kind="prefill",
        positions=list(range(n + k)),
        attention=mask.view(1, 1, n + k, n + k),
    )
    yield out.event
    context = list(prompt_ids)
    yield from settle_chain(cache, context, [], out.logits[n - 1 : n], sampler, budget, 0)
    guesses, q_rows = _guesses(out.logits[n:], sampler)
    if cfg.detail:
        top, p = _tops(out.logits[n:])
        yield MaskGroups(0, 0, (), (top,), (p,), 0, tuple(guesses))

    step = 0
    while not budget.done:
        step += 1
        in_cache = len(context) - 1
        # The target adds one token of its own, so never verify past remaining - 1.
        m = min(len(guesses), cap, budget.remaining - 1)
        cands, q_cands = guesses[:m], q_rows[:m]
        real, positions, mask, group = layout(m, k, in_cache)
        inputs = [context[-1], *cands, *[0] * (k * (m + 1))]
        if cfg.detail:
            yield _mask_event(step, inputs, real, group, mask, in_cache, k)
        if cands:
            yield chain_draft(step, "mask guesses", cands, q_cands)
        out = forward_masked(
            bundle,
            adapter,
            cache,
            inputs,
            m + 1,
            step=step,
            kind="verify" if cands else "target",
            positions=positions,
            attention=mask,
        )
        yield out.event
        # x and the accepted guesses stay in the cache; the masks and the rejected guesses go.
        verdict = yield from judge_chain(
            cache, context, cands, out.logits[real], sampler, step, q_cands, eos_ids=budget.eos_ids
        )
        a = len(verdict.accepted)
        groups = [out.logits[m + 1 + g * k : m + 1 + (g + 1) * k] for g in range(m + 1)]
        guesses, q_rows = _guesses(groups[a], sampler)
        if cfg.detail:  # the relay view's: every group's top guesses (a softmax per mask row)
            tops = [_tops(g) for g in groups]
            yield MaskGroups(  # before the Commit: a page drawn at any Commit has this relay
                step,
                len(context) - len(prompt_ids),
                tuple(cands),
                tuple(t for t, _ in tops),
                tuple(p for _, p in tops),
                a,
                tuple(guesses),
            )
        yield commit(step, verdict, budget, context)


def _mask_event(step, inputs, real, group, mask, in_cache, k) -> AttentionMask:
    """The layout's attention mask as the forward received it, labelled for the mask view."""
    labels, branches = [], []
    for i, g in enumerate(group):
        if g >= 0:
            labels.append(f"M{g}·{i - (len(real) + g * k) + 1}")
            branches.append("mask")
        else:
            labels.append("x" if i == 0 else f"c{real.index(i)}")
            branches.append("x" if i == 0 else "verify")
    return AttentionMask(
        step, tuple(labels), visible_rows(mask, in_cache), tuple(inputs), tuple(branches)
    )


def _guesses(rows: torch.Tensor, sampler: Sampler) -> tuple[list[int], list[torch.Tensor]]:
    """A mask group's guesses (argmax, or a draw from each mask's distribution: the q the rejection
    rule divides by) and their distributions."""
    q_rows = [sampler.distribution(r) for r in rows]
    return [sampler.pick(r, q) for r, q in zip(rows, q_rows, strict=True)], q_rows


def _tops(rows: torch.Tensor) -> tuple[tuple[int, ...], tuple[float, ...]]:
    """Each mask's top token and its probability under the mask's plain softmax (what the relay
    shows, whatever the sampler does)."""
    p, t = torch.softmax(rows.float(), -1).max(-1)
    return tuple(t.tolist()), tuple(round(float(x), 6) for x in p)


# Its stop on the guided tour (ui/tour.py): the narration, what to look at, the telling step.
TOUR = (
    TourStop(
        chapter="self",
        place=6,
        title="The model drafts for itself: SPACE",
        narration=(
            "SPACE appends mask tokens to the input, so one forward both verifies the previous "
            "guesses and fills the masks with new ones: semi-autoregressive drafting and "
            "verification in the same pass, the model correcting its own guesses as it goes. The "
            "relay shows it step by step: the guesses a step's masks made are verified by the "
            "next step's forward, which fills new masks at the same time. No drafter, no extra "
            "head: the model was tuned to fill masks."
        ),
        look=("the relay: last step's guesses verified while the masks propose the next."),
    ),
)


# The declaration the registry, the CLI, the UI and trace validation derive from.
METHOD = Method(
    tour=TOUR,
    family_best=True,  # Compare's "each family at its best"
    name="space",
    family="parallel",
    rank=3,
    title="SPACE (auto-correct decoding with mask guesses)",
    decode=decode,
    params=PARAMS,
    # Yi et al. 2024: k = 5 masks per group and a group after every candidate; here every
    # mask the adapter was trained with (k = 0 = all of them) and as many groups.
    # "longer": one more guess and group than the defaults: more tokens per forward (2.12
    # against 1.98 on HumanEval, 2026-11-27) for more inputs, slower on the tuning prompts
    presets={"paper": {"k": 0, "groups": 0}, "longer": {"k": 3, "groups": 3}},
    check=check,
    summary="Mask tokens guess the next k tokens; one forward verifies last step's guesses and makes the next ones.",
    relaxable=True,
    # the relay of guesses, then the layout's real mask: every group hidden from later rows
    views=(
        "relay",
        "attention_mask",
    ),
    events=("AttentionMask", "Draft", "MaskGroups", "Verify"),
)
