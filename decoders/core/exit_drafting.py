"""Self-speculation from an early exit: the loop Kangaroo and LayerSkip share.

The target's first ℓ layers draft, through an exit head, and the rest of the model verifies,
resuming from the layer-ℓ states the drafts computed, so no layer runs twice for a token:

    prefill: the prompt through every layer (its layer-ℓ states to the exit head, if it reads
             them); the first token from the full model
    repeat:
        x = last committed token
        drafting: feed x, then each draft token, through layers 1..ℓ (the target's own KV cache)
                  and the exit head: d_j = argmax (or a draw) of q_j; stop after the first d_j
                  whose top-1 probability is below η (it is kept), at γ tokens, at an end token,
                  or where the budget ends
        runners-up (siblings = s > 0): beside each d_j, the next s tokens of q_j as leaves of a
                  small tree: s inputs per draft token, no draft forward
        p = layers ℓ+1..L([h_ℓ(x), h_ℓ(d_1) .. h_ℓ(d_{n-1}), h_ℓ(d_n), h_ℓ(runners-up)])
                  # ONE forward; only d_n and the runners-up run layers 1..ℓ there first
        keep the longest prefix the target agrees with (greedy) / the rejection rule with q
                  (sampling; with runners-up the drafts are q's top tokens, kept as point masses
                  by the multi-draft residual rule); a path may end on a runner-up
        roll the caches back to what was committed

The exit head is what differs: Kangaroo's trained adapter (an attention layer with its own cache,
then the LM head) or LayerSkip's shared final norm and LM head on a model tuned to be read early.
"""

from __future__ import annotations

from collections.abc import Callable, Generator, Iterator, Sequence
from typing import Protocol

import torch
from transformers import DynamicCache

from decoders.core.base import Budget, DecodeConfig
from decoders.core.events import Draft, DraftStop, Event, Forward, Prefill
from decoders.core.models import ModelBundle
from decoders.core.runtime import (
    ForwardResult,
    forward,
    forward_from,
    forward_shallow,
    new_cache,
)
from decoders.core.sampling import Sampler
from decoders.core.steps import DraftedChain, draft_until_unsure, settle_chain, settle_tree
from decoders.core.tree import chain, tree_mask, tree_positions, with_root


class ExitHead(Protocol):
    """How drafts leave the model at layer ℓ."""

    label: str  # the Draft events' source

    def prefill(self, states: torch.Tensor) -> Forward | None:
        """The prompt's layer-ℓ states [n, d]; a Forward event if the head ran on them."""

    def head(self, position: int) -> Callable[[torch.Tensor], torch.Tensor]:
        """The exit head for the draft input at absolute `position`: layer-ℓ state [1, d] in,
        full-vocabulary logits of the next token out ([1, vocab])."""

    def settle(self, in_cache: int, n_draft: int, path: Sequence[int], states: torch.Tensor):
        """After the verdict: `path` = the accepted draft nodes, `states` = the verify pass's
        layer-ℓ states (row 0 = x, row 1 + i = node i)."""


def decode(
    bundle: ModelBundle, prompt_ids: list[int], cfg: DecodeConfig, exit_layer: int, head: ExitHead
) -> Iterator[Event]:
    """The loop above, drafting through `head` after layer `exit_layer` (ℓ), with the method's
    η (`eta`), γ (`gamma`) and runners-up (`siblings`) from `cfg.params`."""
    eta, gamma, siblings = (cfg.params[k] for k in ("eta", "gamma", "siblings"))
    sampler = cfg.sampler()
    budget = Budget(cfg.max_new_tokens, cfg.eos_ids)
    # The target's cache, every layer: drafting fills 1..ℓ; the verify pass fills ℓ+1..L, and
    # 1..ℓ for the inputs no draft forward fed (the last draft token, the runners-up)
    cache = new_cache(bundle)
    context = list(prompt_ids)
    no_states = yield from _prefill(bundle, cache, context, exit_layer, head, sampler, budget)

    step = 0
    while not budget.done:
        step += 1
        in_cache = len(context) - 1
        # Early exit: layers 1..ℓ, then the exit head; the token below η is still drafted and
        # drafting stops after it, as in Kangaroo's code. With runners-up the tree is verified
        # as point masses (the multi-draft rule), where a draw from q would be wasted: draft q's
        # top token, its runners-up after it.
        drafted = yield from draft_until_unsure(
            _shallow_draft(bundle, cache, exit_layer, head, step, in_cache),
            context[-1],
            min(gamma, budget.remaining - 1),  # the target adds one token of its own
            gamma,
            sampler,
            threshold=eta,
            eos_ids=budget.eos_ids,
            pick_top=bool(siblings),
        )
        draft, q_rows = drafted.tokens, drafted.q_rows
        yield DraftStop(step, eta, tuple(drafted.confidences), drafted.reason)
        tokens, parents, probs = with_runners_up(draft, q_rows, siblings)
        if tokens:
            source = head.label + (" + runners-up" if len(tokens) > len(draft) else "")
            yield Draft(step, source, tuple(tokens), tuple(parents), probs)
        v_out = _verify(
            bundle, cache, context, exit_layer, step, drafted, tokens, parents, no_states
        )
        yield v_out.event
        if siblings:  # a tree of point-mass drafts (a chain where no runner-up was left)
            verdict = yield from settle_tree(
                cache, context, tokens, parents, v_out.logits, sampler, budget, step
            )
        else:
            verdict = yield from settle_chain(
                cache, context, draft, v_out.logits, sampler, budget, step, q_rows
            )
        head.settle(in_cache, len(draft), verdict.accepted, v_out.hidden[exit_layer])


def _prefill(
    bundle: ModelBundle,
    cache: DynamicCache,
    context: list[int],
    exit_layer: int,
    head: ExitHead,
    sampler: Sampler,
    budget: Budget,
) -> Generator[Event, None, torch.Tensor]:
    """The prompt (`context`) through every layer, its layer-ℓ states to the exit head, and the
    first token from the full model, committed to `context`. Returns an empty [0, d] block of
    layer-ℓ states, for a verify pass with nothing drafted."""
    yield Prefill(tuple(context))
    out = forward(
        bundle, cache, context, step=0, kind="prefill", logits_to_keep=1, hidden_at=(exit_layer,)
    )
    yield out.event
    read = head.prefill(out.hidden[exit_layer])
    if read is not None:
        yield read
    yield from settle_chain(cache, context, [], out.logits, sampler, budget, 0)
    return out.hidden[exit_layer][:0]


def _shallow_draft(
    bundle: ModelBundle,
    cache: DynamicCache,
    exit_layer: int,
    head: ExitHead,
    step: int,
    in_cache: int,
) -> Callable[[int, int], ForwardResult]:
    """The j-th draft forward of this step: one token through layers 1..ℓ and the exit head, at
    the position after the `in_cache` committed ones and the j drafts before it."""

    def propose(j: int, token: int) -> ForwardResult:
        return forward_shallow(
            bundle,
            cache,
            [token],
            exit_layer,
            step=step,
            kind="draft",
            positions=[in_cache + j],
            exit_head=head.head(in_cache + j),
        )

    return propose


def _verify(
    bundle: ModelBundle,
    cache: DynamicCache,
    context: list[int],
    exit_layer: int,
    step: int,
    drafted: DraftedChain,
    tokens: list[int],
    parents: list[int],
    no_states: torch.Tensor,
) -> ForwardResult:
    """The verify pass: layers ℓ+1..L only, on the states drafting left (h_ℓ of x, d_1 ..
    d_{n-1}); the last draft token (x when nothing was drafted) and the runners-up have not been
    through layers 1..ℓ yet and run them first. A chain is causal; a tree puts each input at its
    depth, seeing its ancestors only."""
    draft = drafted.tokens
    states = [d.hidden[exit_layer] for d in drafted.outs]
    leaves = tokens[len(draft) :]
    shape = {}
    if leaves:
        in_cache = len(context) - 1
        tree = with_root(parents)
        shape = dict(positions=tree_positions(tree, in_cache), mask=tree_mask(tree, in_cache))
    return forward_from(
        bundle,
        cache,
        torch.cat(states) if states else no_states,
        exit_layer,
        step=step,
        kind="verify" if draft else "target",
        tokens=[draft[-1] if draft else context[-1], *leaves],
        **shape,
    )


def with_runners_up(
    draft: list[int], q_rows: list[torch.Tensor], siblings: int
) -> tuple[list[int], list[int], tuple[float, ...]]:
    """The tree to verify: the drafted chain d_1..d_n, then beside each d_j (a leaf under d_{j-1})
    the `siblings` next most likely tokens of the same draft distribution q_j, so the runners-up
    cost inputs but no extra draft forward (0 = a chain). Returns the tokens, their parents and
    each one's draft probability."""
    tokens, parents = list(draft), list(chain(len(draft)))
    probs = [float(q[d]) for q, d in zip(q_rows, draft, strict=True)]
    for j, q in enumerate(q_rows if siblings else ()):
        for t in runners_up(q, draft[j], siblings):
            tokens.append(t)
            parents.append(j - 1)
            probs.append(float(q[t]))
    return tokens, parents, tuple(round(v, 6) for v in probs)


def runners_up(q: torch.Tensor, drafted: int, n: int) -> list[int]:
    """The n most likely tokens of the draft distribution q after `drafted`, skipping those q
    gives no probability (outside the draft vocabulary, or cut by top-k / top-p when sampling)."""
    values, ids = torch.topk(q, n + 1)
    return [int(t) for v, t in zip(values, ids, strict=True) if v > 0 and int(t) != drafted][:n]
