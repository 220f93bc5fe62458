"""Phases every draft-and-verify decoder shares: start (prefill + first token), verify a chain or a
tree in one target forward, and commit the verdict.

Written as generators that yield their events and return their result, so a method reads as its
paper's loop: `context = yield from start(...)`, then per step draft, `yield from verify_chain(...)`
(a chain draft) or `yield from verify_tree(...)` (a token tree, with optional ride-along inputs).
"""

from __future__ import annotations

from collections.abc import Callable, Generator, Sequence
from dataclasses import dataclass, replace
from typing import Protocol

import torch
from transformers import DynamicCache

from decoders.core.base import Budget
from decoders.core.events import AttentionMask, Commit, Draft, Event, Prefill, Verify
from decoders.core.models import ModelBundle
from decoders.core.runtime import ForwardResult, crop_cache, forward, keep_cache
from decoders.core.sampling import Sampler
from decoders.core.tree import chain, depths, tree_mask, tree_positions, with_root
from decoders.core.verify import (
    Verdict,
    greedy_chain,
    greedy_tree,
    sample_deterministic_chain,
    sample_tree,
    speculative_chain,
)


class FeatureReader(Protocol):
    """What the shared steps hand the target's final features to: a feature-level drafter
    (drafters.Drafter, EAGLE) or Medusa's heads (medusa_heads.HeadReader)."""

    needs_features: bool  # (and optionally `feature_layers`: see `feature_layers` below)

    def observe(self, features: torch.Tensor) -> None: ...


def feature_layers(reader: FeatureReader | None) -> tuple[int, ...] | None:
    """What a target forward must hand `reader`: None (nothing), () (the final features), or the
    layers whose states go beside them (an EAGLE-3 head's fused layers: `feature_layers`)."""
    if reader is None or not reader.needs_features:
        return None
    return tuple(getattr(reader, "feature_layers", ()))


def read_features(out: ForwardResult, layers: tuple[int, ...]) -> torch.Tensor:
    """[n, (len(layers) + 1) d]: the states after `layers`, then the final features."""
    if not layers:
        return out.features
    return torch.cat([*(out.hidden[ell] for ell in layers), out.features], -1)


def start(
    bundle: ModelBundle,
    cache: DynamicCache,
    prompt_ids: list[int],
    sampler: Sampler,
    budget: Budget,
    drafter: FeatureReader | None = None,
) -> Generator[Event, None, list[int]]:
    """Prefill the prompt and commit the target's first token; returns the context so far.
    A feature-level `drafter` is handed the prompt's features."""
    yield Prefill(tuple(prompt_ids))
    layers = feature_layers(drafter)
    out = forward(
        bundle,
        cache,
        prompt_ids,
        step=0,
        kind="prefill",
        logits_to_keep=1,
        features=layers is not None,
        hidden_at=layers or (),
    )
    yield out.event
    if layers is not None:
        drafter.observe(read_features(out, layers))
    first = (
        greedy_chain([], out.logits)
        if sampler.greedy
        else sample_deterministic_chain([], out.logits, sampler)
    )
    yield Commit(0, tuple(budget.take(first.tokens)), first.origins, first.probs)
    return [*prompt_ids, *budget.tokens]


@dataclass
class DraftedChain:
    """What one round of chain drafting left: the drafted tokens, the drafter's distribution q
    at each, the confidence each was weighed by, why drafting stopped, and each draft forward."""

    tokens: list[int]
    q_rows: list[torch.Tensor]
    confidences: list[float]
    reason: str  # DraftStop's: "confidence", "max_draft", "budget", "eos" or "cost"
    outs: list[ForwardResult]


def draft_until_unsure(
    propose: Callable[[int, int], ForwardResult],
    first: int,
    room: int,
    gamma: int,
    sampler: Sampler,
    *,
    threshold: float = 0.0,
    confidence: str = "top",
    eos_ids: frozenset[int] = frozenset(),
    pick_top: bool = False,
    pays_for: Callable[[float], bool] | None = None,
) -> Generator[Event, None, DraftedChain]:
    """The stop-when-unsure drafting loop every chain drafter shares (speculative decoding,
    Draft & Verify, Kangaroo and LayerSkip): feed the last token to the drafter (`propose(j,
    token)`: the j-th draft forward), draft the next one from its distribution q, and go on at
    most `room` times (γ, or what the budget leaves: the target adds one token of its own).

    A token whose `confidence` falls below `threshold` is still drafted (its forward is paid;
    the target may accept it) and drafting stops after it: "top" weighs q's top probability
    (Draft & Verify's θ, Kangaroo's η), "drafted" the drafted token's own (EAGLE-2's confidence).
    Drafting also stops after an end token in `eos_ids` (nothing to draft after it), and, with
    `pays_for`, before a token whose path probability no longer pays for its input (it is not
    kept). `pick_top`: draft q's top token even when sampling (point-mass drafts verified by the
    multi-draft rule)."""
    tokens: list[int] = []
    q_rows: list[torch.Tensor] = []
    confidences: list[float] = []
    outs: list[ForwardResult] = []
    reason = "max_draft" if room == gamma else "budget"
    feed = first
    for j in range(room):
        out = propose(j, feed)
        yield out.event
        q = sampler.distribution(out.logits[-1])
        feed = int(q.argmax()) if pick_top else sampler.pick(out.logits[-1], q)
        if pays_for is not None and not pays_for(float(q[feed])):
            reason = "cost"  # drafted, but not worth verifying: the draft ends before it
            break
        tokens.append(feed)
        q_rows.append(q)
        outs.append(out)
        weighed = q.max() if confidence == "top" else q[feed]
        confidences.append(round(float(weighed), 6))
        if confidences[-1] < threshold:
            reason = "confidence"
            break
        if feed in eos_ids:
            reason = "eos"
            break
    return DraftedChain(tokens, q_rows, confidences, reason, outs)


def chain_draft(
    step: int, source: str, draft: Sequence[int], q_rows: Sequence[torch.Tensor]
) -> Draft:
    """A drafted chain as its trace event: each token with the probability its drafter gave it."""
    probs = tuple(round(float(q[d]), 6) for q, d in zip(q_rows, draft, strict=True))
    return Draft(step, source, tuple(draft), chain(len(draft)), probs)


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
    drafter: FeatureReader | None = None,
) -> Generator[Event, None, tuple[Verdict, torch.Tensor]]:
    """ONE target forward over [x, *draft]; keep the verdict's tokens, crop the rest of the cache.
    `q_rows`: the draft's distributions (speculative sampling); None for point-mass drafts.
    A feature-level `drafter` is handed the features of the kept inputs.
    Returns the verdict and the forward's logits."""
    layers = feature_layers(drafter)
    out = forward(
        bundle,
        cache,
        [context[-1], *draft],
        step=step,
        kind="verify" if draft else "target",
        features=layers is not None,
        hidden_at=layers or (),
    )
    yield out.event
    verdict = yield from settle_chain(
        cache, context, draft, out.logits, sampler, budget, step, q_rows
    )
    if layers is not None:
        drafter.observe(read_features(out, layers)[: 1 + len(verdict.accepted)])
    return verdict, out.logits


def settle_chain(
    cache: DynamicCache,
    context: list[int],
    draft: Sequence[int],
    logits: torch.Tensor,
    sampler: Sampler,
    budget: Budget,
    step: int,
    q_rows: Sequence[torch.Tensor] | None = None,
) -> Generator[Event, None, Verdict]:
    """The verdict on a chain draft from the target's `logits` over [x, *draft] (a forward the
    caller ran, e.g. one resumed at an exit layer): the Verify event, the cache cropped to x and
    the accepted drafts, and the Commit. Returns the verdict."""
    verdict = yield from judge_chain(
        cache, context, draft, logits, sampler, step, q_rows, eos_ids=budget.eos_ids
    )
    yield commit(step, verdict, budget, context)
    return verdict


def judge_chain(
    cache: DynamicCache,
    context: list[int],
    draft: Sequence[int],
    logits: torch.Tensor,
    sampler: Sampler,
    step: int,
    q_rows: Sequence[torch.Tensor] | None = None,
    *,
    eos_ids: frozenset[int],  # required: a caller that forgot it would count drafts past EOS
) -> Generator[Event, None, Verdict]:
    """`settle_chain` up to its Commit (the Verify event and the crop), for a method with more
    to record about the step before its tokens land (SPACE's relay). Returns the verdict, ended
    at the first end token it accepted (`ended_at_eos`)."""
    in_cache = len(context) - 1
    if sampler.greedy:
        verdict = greedy_chain(draft, logits, sampler.relax)
    elif q_rows is None:
        verdict = sample_deterministic_chain(draft, logits, sampler)
    else:
        q = torch.stack(list(q_rows)) if q_rows else logits[:0]
        verdict = speculative_chain(draft, q, logits, sampler)
    verdict = ended_at_eos(verdict, eos_ids)
    if draft:
        yield verify_event(step, verdict)
    crop_cache(cache, in_cache + 1 + len(verdict.accepted))  # x and the accepted drafts stay
    return verdict


def ended_at_eos(verdict: Verdict, eos_ids: frozenset[int]) -> Verdict:
    """The verdict as the output can take it: an accepted draft token that ends the output (EOS)
    ends the accepted path too, with no correction after it. The drafts the verifier accepted
    past it are never written, so no event or metric may count them as accepted."""
    for i, t in enumerate(verdict.tokens[: len(verdict.accepted)]):
        if t in eos_ids:
            kept = verdict.accepted[: i + 1]
            return replace(
                verdict,
                accepted=kept,
                tokens=verdict.tokens[: i + 1],
                origins=verdict.origins[: i + 1],
                probs=verdict.probs[: i + 1],
                correction=None,
                relaxed=tuple(r for r in verdict.relaxed if r in kept),
                preferred=tuple(
                    t for r, t in zip(verdict.relaxed, verdict.preferred, strict=False) if r in kept
                ),
            )
    return verdict


@dataclass(frozen=True)
class RideAlong:
    """Inputs a method runs in the verify forward beside the tree, whose logits it reads back
    (lookahead's Jacobi window). They sit between x and the tree; `parents` index the whole forward
    (0 = x, the ride-along inputs from 1), parents first. `labels` name each input for the attention
    mask view and `branch` names the group. Their KV is discarded after the forward."""

    tokens: Sequence[int]
    parents: Sequence[int]
    labels: Sequence[str]
    branch: str


def verify_tree(
    bundle: ModelBundle,
    cache: DynamicCache,
    context: list[int],
    tokens: Sequence[int],
    parents: Sequence[int],
    sampler: Sampler,
    budget: Budget,
    step: int,
    *,
    ride: RideAlong | None = None,
    drafter: FeatureReader | None = None,
    record_mask: bool = False,
) -> Generator[Event, None, tuple[Verdict, torch.Tensor]]:
    """ONE target forward over [x, *ride-along inputs, *tree] with a tree attention mask (each node
    sees the cache and its ancestors, at position cache + depth); follow the target down the tree
    (greedy: its argmax; sampling: the multi-draft residual rule); keep the KV of x and the accepted
    path only (compacted), and commit path + the target's own token.
    `tokens`/`parents`: the draft tree (parents[i] = -1 for children of x). `record_mask`: also emit
    the mask as an AttentionMask event (before the forward). A feature-level `drafter` is handed
    the features of x and the accepted path. Returns the verdict and the forward's logits (all rows:
    row 0 = x, rows 1.. = the ride-along inputs, then the tree's nodes)."""
    in_cache, x = len(context) - 1, context[-1]
    extra = list(ride.tokens) if ride is not None else []
    offset = 1 + len(extra)  # the tree's first node in the forward
    forward_parents = with_root(parents, ride.parents if ride is not None else ())
    mask = tree_mask(forward_parents, in_cache)
    if record_mask:
        labels = [
            "x",
            *(ride.labels if ride is not None else ()),
            *(f"verify n{i}·d{d}" for i, d in enumerate(depths(parents))),
        ]
        branches = ["x", *[ride.branch] * len(extra), *["verify"] * len(tokens)]
        yield AttentionMask(
            step,
            tuple(labels),
            visible_rows(mask, in_cache),
            input_ids=(x, *extra, *tokens),
            branches=tuple(branches),
        )
    layers = feature_layers(drafter)
    out = forward(
        bundle,
        cache,
        [x, *extra, *tokens],
        step=step,
        kind="verify" if tokens else "target",
        positions=tree_positions(forward_parents, in_cache),
        mask=mask,
        features=layers is not None,
        hidden_at=layers or (),
    )
    yield out.event
    rows = torch.cat([out.logits[:1], out.logits[offset:]]) if extra else out.logits
    verdict = yield from settle_tree(
        cache, context, tokens, parents, rows, sampler, budget, step, offset
    )
    if layers is not None:
        drafter.observe(read_features(out, layers)[[0, *(offset + i for i in verdict.accepted)]])
    return verdict, out.logits


def settle_tree(
    cache: DynamicCache,
    context: list[int],
    tokens: Sequence[int],
    parents: Sequence[int],
    logits: torch.Tensor,
    sampler: Sampler,
    budget: Budget,
    step: int,
    offset: int = 1,
) -> Generator[Event, None, Verdict]:
    """The verdict on a tree draft from the target's `logits` over [x, *tree] (a forward the
    caller ran, e.g. one resumed at an exit layer; greedy: follow its argmax; sampling: the
    multi-draft residual rule): the Verify event, the cache compacted to x and the accepted path
    (the tree's first node sat at input `offset` of that forward), and the Commit."""
    if sampler.greedy:
        verdict = greedy_tree(tokens, parents, logits, sampler.relax)
    else:
        verdict = sample_tree(tokens, parents, logits, sampler)
    verdict = ended_at_eos(verdict, budget.eos_ids)
    if tokens:
        yield verify_event(step, verdict)
    # x and the accepted path stay; the rest of the KV goes
    keep_cache(cache, len(context) - 1, [0, *(offset + i for i in verdict.accepted)])
    yield commit(step, verdict, budget, context)
    return verdict


def verify_event(step: int, verdict: Verdict) -> Verify:
    return Verify(
        step,
        verdict.accepted,
        verdict.correction,
        verdict.rule,
        verdict.target_probs,
        verdict.relaxed,
        verdict.preferred,
    )


def visible_rows(mask: torch.Tensor, in_cache: int) -> tuple[tuple[int, ...], ...]:
    """Read the mask tensor actually passed to the model back into lists of visible inputs."""
    new = mask[0, 0, :, in_cache:] == 0
    return tuple(tuple(int(j) for j in row.nonzero().flatten()) for row in new)
