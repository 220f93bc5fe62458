"""SPACE (Yi et al. 2024, "Generation Meets Verification"): auto-correct decoding. One forward both
verifies the previous step's guesses and makes the next ones, with [MASK] inputs the model was
tuned to fill (decoders/mask_model.py: a frozen base plus an adapter on mask rows only).

    inputs  = x  M·k   c_1 M·k   c_2 M·k  …  c_m M·k        x: the last committed token,
                                                             c_i: last step's guesses, M: a mask
    attention: causal among x, c_1 .. c_m; mask group g (after c_g, or after x for g = 0) sees the
               cache, x, c_1 .. c_g and the masks before it in its own group: every group is hidden
               from every later row, so x and the c_i see exactly what plain decoding would
    positions: each input's position is the number of inputs it can see
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

from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import torch

from .base import Budget, DecodeConfig
from .events import AttentionMask, Commit, Draft, Event, MaskGroups, Prefill, Verify
from .mask_model import forward_masked, load_adapter
from .models import ModelBundle
from .params import Param
from .runtime import keep_cache, new_cache
from .sampling import Sampler
from .steps import _visible, commit
from .tree import chain
from .verify import greedy_chain, sample_deterministic_chain, speculative_chain

PARAMS = (
    Param(
        "k",
        int,
        0,
        "masks per group = guesses per step; 0 = as many as the adapter was trained with",
        0,
        8,
    ),
    Param(
        "groups",
        int,
        0,
        "cap on the candidates verified per step (each brings its own k masks, so the forward "
        "has 1 + k + groups·(k + 1) inputs); 0 = k",
        0,
        8,
    ),
)


def check(bundle: ModelBundle, params: Mapping[str, Any]) -> None:
    load_adapter(bundle)


def layout(m: int, k: int, in_cache: int) -> tuple[list[int], list[int], torch.Tensor, list[int]]:
    """The step's input layout for m candidates and groups of k masks: the indices of the real
    inputs (x, c_1 .. c_m), each input's position, the additive attention mask
    [1, 1, n, in_cache + n], and each mask's group (-1 for real inputs)."""
    real, group, positions = [], [], []
    for g in range(m + 1):
        real.append(len(group))
        group.append(-1)
        positions.append(in_cache + g)
        for j in range(k):
            group.append(g)
            positions.append(in_cache + g + 1 + j)
    n = len(group)
    sees = torch.zeros(n, n, dtype=torch.bool)
    for row in range(n):
        g = group[row]
        anchor = real.index(row) if g < 0 else g  # the last real input this row sees
        sees[row, real[: anchor + 1]] = True
        if g >= 0:  # its own group, up to itself
            first = real[g] + 1
            sees[row, first : row + 1] = True
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
        [False] * n + [True] * k,
        step=0,
        kind="prefill",
        positions=list(range(n + k)),
        attention=mask.view(1, 1, n + k, n + k),
    )
    yield out.event
    rows = out.logits[n - 1 : n]
    first = (
        greedy_chain([], rows) if sampler.greedy else sample_deterministic_chain([], rows, sampler)
    )
    yield Commit(0, tuple(budget.take(first.tokens)), first.origins, first.probs)
    keep_cache(cache, 0, range(n))
    context = [*prompt_ids, *budget.tokens]
    guesses, q_rows = _guesses(out.logits[n:], sampler)
    top = out.logits[n:].argmax(-1).tolist()
    yield MaskGroups(0, 0, (), (tuple(top),), (_probs(q_rows, top),), 0, tuple(guesses))

    step = 0
    while not budget.done:
        step += 1
        in_cache = len(context) - 1
        # The target adds one token of its own, so never verify past remaining - 1.
        m = min(len(guesses), cap, budget.remaining - 1)
        cands, q_cands = guesses[:m], q_rows[:m]
        real, positions, mask, group = layout(m, k, in_cache)
        inputs = [context[-1]]
        for c in cands:
            inputs += [0] * k + [c]
        inputs += [0] * k
        if cfg.detail:
            yield _mask_event(step, inputs, real, group, mask, in_cache)
        if cands:
            yield Draft(step, "mask guesses", tuple(cands), chain(m), _probs(q_cands, cands))
        out = forward_masked(
            bundle,
            adapter,
            cache,
            inputs,
            [g >= 0 for g in group],
            step=step,
            kind="verify" if cands else "target",
            positions=positions,
            attention=mask,
        )
        yield out.event
        verdict = _verify(cands, q_cands, out.logits[real], sampler)
        if cands:
            yield Verify(
                step, verdict.accepted, verdict.correction, verdict.rule, verdict.target_probs
            )
        a = len(verdict.accepted)
        keep_cache(cache, in_cache, real[: a + 1])  # x and the accepted guesses stay
        groups = [out.logits[real[g] + 1 : real[g] + 1 + k] for g in range(m + 1)]
        guesses, q_rows = _guesses(groups[a], sampler)
        tops = [g.argmax(-1).tolist() for g in groups]
        yield MaskGroups(
            step,
            len(context) - len(prompt_ids),
            tuple(cands),
            tuple(tuple(t) for t in tops),
            tuple(
                _probs([torch.softmax(r, -1) for r in g], t)
                for g, t in zip(groups, tops, strict=True)
            ),
            a,
            tuple(guesses),
        )
        yield commit(step, verdict, budget, context)


def _mask_event(step, inputs, real, group, mask, in_cache) -> AttentionMask:
    """The layout's attention mask as the forward received it, labelled for the mask view."""
    labels, branches = [], []
    for i, g in enumerate(group):
        if g >= 0:
            labels.append(f"M{g}·{i - real[g]}")
            branches.append("mask")
        else:
            labels.append("x" if i == 0 else f"c{real.index(i)}")
            branches.append("x" if i == 0 else "verify")
    return AttentionMask(
        step, tuple(labels), _visible(mask, in_cache), tuple(inputs), tuple(branches)
    )


def _verify(
    cands: Sequence[int], q_rows: Sequence[torch.Tensor], logits: torch.Tensor, sampler: Sampler
):
    if sampler.greedy:
        return greedy_chain(cands, logits)
    q = torch.stack(list(q_rows)) if q_rows else logits[:0]
    return speculative_chain(cands, q, logits, sampler)


def _guesses(rows: torch.Tensor, sampler: Sampler) -> tuple[list[int], list[torch.Tensor]]:
    """A mask group's guesses (argmax, or a draw from each mask's distribution: the q the rejection
    rule divides by) and their distributions."""
    q_rows = [sampler.distribution(r) for r in rows]
    return [sampler.pick(r, q) for r, q in zip(rows, q_rows, strict=True)], q_rows


def _probs(q_rows: Sequence[torch.Tensor], tokens: Sequence[int]) -> tuple[float, ...]:
    return tuple(round(float(q[t]), 6) for q, t in zip(q_rows, tokens, strict=True))
