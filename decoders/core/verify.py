"""Shared verification rules: given a draft and the target's logits over it, what gets committed.

A draft is a tree given as a parent array (a chain is the tree (-1, 0, 1, …)). The target scores
the root (the last committed token) and every node in one forward, so `logits` has one row per
input: `logits[0]` predicts the root's children, `logits[1 + i]` predicts node i's children (for a
chain: `logits[i]` predicts draft position i, and `logits[len(draft)]` is the bonus row).

Four rules, all pure functions of (draft, logits, sampler), and one relaxation:
- greedy_chain / greedy_tree: the longest draft path that matches the target's argmax, then the
  target's own token. Token for token what autoregressive greedy would have produced.
- speculative_chain: Leviathan et al. 2022 / Chen et al. 2023. Draft token d drawn from q is kept
  with probability min(1, p(d) / q(d)); on rejection the target samples from norm(max(0, p − q));
  if all are kept, a bonus token comes from p. The output follows p exactly.
- sample_tree: drafts chosen without randomness (n-gram copies, top-k children) are point masses.
  At each node the children are tried in order: child c is kept with probability p'(c), where p'
  is the target's distribution with the children already rejected removed and renormalised; if
  none is kept the token is drawn from that residual (SpecInfer's multi-draft rule for point-mass
  drafts). Each token still follows p exactly.
- relaxed (SpecDec, Xia et al. 2023), an option of the greedy rules: where the draft's token is
  not the target's argmax, it is still kept when it is among the target's top β and its
  log-probability is within τ of the top one's. Lossy: the output is no longer greedy's; β = 1 is
  the exact rule. The nodes kept only by the relaxation are marked (`Verdict.relaxed`).
- synthetic, the same option's teaching mode (vLLM's synthetic rejection sampler): each draft
  node on the drafter's first-child path is kept with a fixed probability, whatever the target
  says, so the acceptance rate is chosen, not measured. Lossy; its kept nodes the target would
  not have written are marked as relaxed ones are.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

import torch

from decoders.core.sampling import Relax, Sampler
from decoders.core.tree import chain


@dataclass(frozen=True)
class Verdict:
    accepted: tuple[int, ...]  # indices of the accepted draft nodes, root to leaf
    tokens: tuple[int, ...]  # what to commit: the accepted drafts, then the target's own token
    origins: tuple[str, ...]
    probs: tuple[float, ...]  # the target's probability of each committed token
    # the target's token after the accepted path (a bonus when it ends at a leaf); None when an
    # accepted end token ended the output first (steps.ended_at_eos)
    correction: int | None
    rule: str
    target_probs: tuple[float, ...] = ()  # the target's probability of every draft node
    relaxed: tuple[int, ...] = ()  # accepted nodes the exact rule would have rejected
    preferred: tuple[int, ...] = ()  # the target's own token at each relaxed node


def _row(node: int) -> int:
    """The logits row that predicts `node`'s children (-1 = the root = row 0)."""
    return 0 if node == -1 else node + 1


def _children(parents: Sequence[int]) -> dict[int, list[int]]:
    kids: dict[int, list[int]] = {}
    for i, p in enumerate(parents):
        kids.setdefault(p, []).append(i)
    return kids


def _node_probs(tokens: Sequence[int], parents: Sequence[int], probs: torch.Tensor) -> tuple:
    """The target's probability of each draft node given its ancestors (for the views)."""
    if not tokens:
        return ()
    rows = torch.as_tensor([_row(p) for p in parents])
    picked = probs[rows, torch.as_tensor(list(tokens))]
    return tuple(round(float(v), 6) for v in picked)


def _verdict(
    path: list[int],
    tokens: Sequence[int],
    parents: Sequence[int],
    last: int,
    probs: torch.Tensor,
    rule: str,
    relaxed: Sequence[int] = (),
    preferred: Sequence[int] = (),
) -> Verdict:
    """Commit the accepted path, then `last` (drawn from the row after the path's end)."""
    end = path[-1] if path else -1
    at_leaf = bool(tokens) and end not in set(parents)
    committed = (*(tokens[i] for i in path), last)
    rows = [_row(parents[i]) for i in path] + [_row(end)]
    return Verdict(
        accepted=tuple(path),
        tokens=tuple(committed),
        origins=(
            *("relaxed" if i in relaxed else "draft" for i in path),
            "bonus" if at_leaf else "correction" if tokens else "target",
        ),
        probs=tuple(round(float(probs[r, t]), 6) for r, t in zip(rows, committed, strict=True)),
        correction=last,
        rule=rule,
        target_probs=_node_probs(tokens, parents, probs),
        relaxed=tuple(relaxed),
        preferred=tuple(preferred),
    )


def _check(tokens: Sequence[int], parents: Sequence[int], logits: torch.Tensor) -> None:
    assert len(tokens) == len(parents), "one parent per draft token"
    assert logits.shape[0] == len(tokens) + 1, "need one logit row for the root and for each node"


# --- greedy ------------------------------------------------------------------------------------------


def greedy_tree(
    tokens: Sequence[int],
    parents: Sequence[int],
    logits: torch.Tensor,
    relax: Relax | None = None,
) -> Verdict:
    """Follow the target's argmax down the tree as far as the draft has that child (with `relax`:
    or, failing that, a child the relaxed rule allows)."""
    _check(tokens, parents, logits)
    predicted = logits.argmax(dim=-1).tolist()
    logp = torch.log_softmax(logits.float(), dim=-1) if relax else None
    kids = _children(parents)
    path: list[int] = []
    relaxed: list[int] = []
    preferred: list[int] = []  # the target's own token where the relaxed rule took another
    node = -1
    while True:
        row = _row(node)
        want = predicted[row]
        if relax and relax.synthetic > 0:  # a coin, not the target: the drafter's first child
            first = kids.get(node, [None])[0]
            match = first if first is not None and relax.coin() else None
            if match is not None and tokens[match] != want:
                relaxed.append(match)
                preferred.append(want)
            if match is None:
                break
            path.append(match)
            node = match
            continue
        match = next((c for c in kids.get(node, ()) if tokens[c] == want), None)
        if match is None and logp is not None:
            match = _relaxed_child(kids.get(node, ()), tokens, logp[row], relax)
            relaxed += [] if match is None else [match]
            preferred += [] if match is None else [want]
        if match is None:
            break
        path.append(match)
        node = match
    probs = torch.softmax(logits.float(), dim=-1)
    rule = "greedy-tree"
    if relax:
        rule = (
            f"synthetic-{relax.synthetic:g}" if relax.synthetic > 0 else f"relaxed-top-{relax.beta}"
        )
    return _verdict(path, tokens, parents, want, probs, rule, relaxed, preferred)


def _relaxed_child(
    children: Sequence[int], tokens: Sequence[int], logp: torch.Tensor, relax: Relax
) -> int | None:
    """The most likely child whose token is among the target's top β and within τ of its best."""
    top = torch.topk(logp, relax.beta)
    allowed = {
        int(t): float(v)
        for t, v in zip(top.indices, top.values, strict=True)
        if float(top.values[0] - v) <= relax.tolerance
    }
    fits = [c for c in children if tokens[c] in allowed]
    return max(fits, key=lambda c: allowed[tokens[c]], default=None)


def greedy_chain(draft: Sequence[int], logits: torch.Tensor, relax: Relax | None = None) -> Verdict:
    """Longest prefix of the draft that matches the target's argmax, then the target's own token.
    Exactly what autoregressive greedy would have produced, one forward instead of n + 1."""
    v = greedy_tree(draft, chain(len(draft)), logits, relax)
    return v if relax else replace(v, rule="greedy-chain")


# --- sampling ----------------------------------------------------------------------------------------


def speculative_chain(
    draft: Sequence[int], q: torch.Tensor, logits: torch.Tensor, sampler: Sampler
) -> Verdict:
    """Speculative sampling. `q[i]` is the draft's distribution that draft[i] was sampled from
    (already tempered and truncated the same way as the target's)."""
    parents = chain(len(draft))
    _check(draft, parents, logits)
    p = sampler.distribution(logits)
    for i, d in enumerate(draft):
        u = float(torch.rand((), generator=sampler.generator))
        if u * float(q[i, d]) < float(p[i, d]):  # u < p/q without dividing by a tiny q
            continue
        residual = (p[i] - q[i].to(p.dtype)).clamp_min(0.0)
        if float(residual.sum()) <= 0.0:  # p == q up to rounding: nothing to correct towards
            residual = p[i].clone()
        t = _draw(residual / residual.sum(), sampler)
        return _verdict(list(range(i)), draft, parents, t, p, "speculative-sampling")
    t = _draw(p[len(draft)], sampler)
    return _verdict(list(range(len(draft))), draft, parents, t, p, "speculative-sampling")


def sample_tree(
    tokens: Sequence[int], parents: Sequence[int], logits: torch.Tensor, sampler: Sampler
) -> Verdict:
    """Several point-mass drafts per position, kept with the residual rule (see module doc)."""
    _check(tokens, parents, logits)
    p = sampler.distribution(logits)
    kids = _children(parents)
    path: list[int] = []
    node = -1
    while True:
        residual = p[_row(node)].clone()
        kept = None
        for c in kids.get(node, ()):
            mass = float(residual[tokens[c]])
            u = float(torch.rand((), generator=sampler.generator))
            if u * float(residual.sum()) < mass:
                kept = c
                break
            residual[tokens[c]] = 0.0  # rejected: the target's token is not this one
        if kept is None:
            t = _draw(residual / residual.sum(), sampler)
            rule = (
                "sample-deterministic" if all(len(v) <= 1 for v in kids.values()) else "sample-tree"
            )
            return _verdict(path, tokens, parents, t, p, rule)
        path.append(kept)
        node = kept


def sample_deterministic_chain(
    draft: Sequence[int], logits: torch.Tensor, sampler: Sampler
) -> Verdict:
    """A single point-mass draft (prompt lookup): keep d with probability p(d); on rejection sample
    from p with d removed. The output follows p exactly."""
    return sample_tree(draft, chain(len(draft)), logits, sampler)


def _draw(probs: torch.Tensor, sampler: Sampler) -> int:
    return int(torch.multinomial(probs.cpu(), 1, generator=sampler.generator))
