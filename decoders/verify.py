"""Shared verification rules: given a draft and the target's logits over it, what gets committed.

Layout convention: `logits[i]` is the target's prediction for draft position i, i.e. the logits
computed after the root (the last committed token) and draft[:i]; `logits[len(draft)]` predicts
the token after the whole draft (the bonus position).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from .sampling import Sampler


@dataclass(frozen=True)
class Verdict:
    accepted: tuple[int, ...]  # indices of the accepted draft nodes, in order
    tokens: tuple[int, ...]  # what to commit: the accepted drafts, then the target's own token
    origins: tuple[str, ...]
    probs: tuple[float, ...]  # the target's probability of each committed token
    correction: int  # the target's token after the accepted prefix (a bonus when all were accepted)
    rule: str


def greedy_chain(draft: Sequence[int], logits: torch.Tensor) -> Verdict:
    """Longest prefix of the draft that matches the target's argmax, then the target's own token.
    Exactly what autoregressive greedy would have produced, one forward instead of n + 1."""
    assert logits.shape[0] == len(draft) + 1, (
        "need one logit row per draft token, plus the bonus row"
    )
    predicted = logits.argmax(dim=-1).tolist()
    n = 0
    while n < len(draft) and draft[n] == predicted[n]:
        n += 1
    probs = torch.softmax(logits[: n + 1].float(), dim=-1)
    tokens = (*draft[:n], predicted[n])
    origin = "bonus" if n == len(draft) and draft else "correction" if draft else "target"
    return Verdict(
        accepted=tuple(range(n)),
        tokens=tuple(tokens),
        origins=("draft",) * n + (origin,),
        probs=tuple(round(float(probs[i, t]), 6) for i, t in enumerate(tokens)),
        correction=predicted[n],
        rule="greedy-chain",
    )


def sample_deterministic_chain(
    draft: Sequence[int], logits: torch.Tensor, sampler: Sampler
) -> Verdict:
    """Speculative sampling for a draft that came with no distribution (n-grams, lookups): q is a
    point mass on the draft token, so accept d with probability p(d); on rejection sample from the
    residual max(0, p - q) normalised, which is p with d removed. The output follows p exactly."""
    assert logits.shape[0] == len(draft) + 1
    tokens: list[int] = []
    probs_out: list[float] = []
    for i, d in enumerate(draft):
        p = sampler.distribution(logits[i])
        u = float(torch.rand((), generator=sampler.generator))
        if u < float(p[d]):
            tokens.append(d)
            probs_out.append(round(float(p[d]), 6))
            continue
        residual = p.clone()
        residual[d] = 0.0
        residual /= residual.sum()
        t = int(torch.multinomial(residual.cpu(), 1, generator=sampler.generator))
        return Verdict(
            tuple(range(i)),
            (*tokens, t),
            ("draft",) * i + ("correction",),
            (*probs_out, round(float(p[t]), 6)),
            t,
            "sample-deterministic",
        )
    p = sampler.distribution(logits[len(draft)])
    t = sampler.pick(logits[len(draft)], p)
    origin = "bonus" if draft else "target"
    return Verdict(
        tuple(range(len(draft))),
        (*tokens, t),
        ("draft",) * len(draft) + (origin,),
        (*probs_out, round(float(p[t]), 6)),
        t,
        "sample-deterministic",
    )
