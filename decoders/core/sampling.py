"""Turning logits into a next token: greedy (the lossless reference) or seeded sampling."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch


@dataclass(frozen=True)
class Relax:
    """SpecDec's top-β acceptance with tolerance τ (log-probability, i.e. logit, distance)."""

    beta: int  # no defaults: RELAX_PARAMS holds them (a second copy here once disagreed)
    tolerance: float
    # > 0: no rule at all, each draft token kept with this probability (vLLM's synthetic
    # rejection sampler), drawn from `generator` (the run's seeded one)
    synthetic: float = 0.0
    generator: torch.Generator | None = field(default=None, compare=False, repr=False)

    def __bool__(self) -> bool:
        return self.beta > 1 or self.synthetic > 0

    def coin(self) -> bool:
        """One synthetic acceptance: True with probability `synthetic`."""
        return float(torch.rand(1, generator=self.generator)) < self.synthetic


@dataclass
class Sampler:
    temperature: float = 0.0
    top_p: float = 1.0
    seed: int = 0
    beta: int = 1  # relaxed verification (SpecDec): top-β acceptance; 1 = the exact rule
    tolerance: float = 1.0  # ... within τ of the top log-probability (RELAX_PARAMS' default)
    synthetic: float = 0.0  # > 0: each draft token kept with this probability (a teaching mode)
    generator: torch.Generator = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self.generator = torch.Generator(device="cpu").manual_seed(self.seed)

    @property
    def relax(self) -> Relax | None:
        """The relaxed acceptance rule for greedy verification, None for the exact one."""
        if self.beta <= 1 and self.synthetic <= 0:
            return None
        return Relax(self.beta, self.tolerance, self.synthetic, self.generator)

    @property
    def greedy(self) -> bool:
        return self.temperature <= 0.0

    def distribution(self, logits: torch.Tensor) -> torch.Tensor:
        """The distribution tokens are drawn from: softmax(logits / T), truncated to the top-p nucleus.
        Greedy uses plain softmax (only for reporting probabilities)."""
        if self.greedy:
            return torch.softmax(logits.float(), dim=-1)
        probs = torch.softmax(logits.float() / self.temperature, dim=-1)
        if self.top_p < 1.0:
            probs = top_p_filter(probs, self.top_p)
        return probs

    def pick(self, logits: torch.Tensor, probs: torch.Tensor) -> int:
        """The next token: argmax of the logits (greedy) or a seeded draw from `probs`."""
        if self.greedy:
            return int(torch.argmax(logits))
        return int(torch.multinomial(probs.cpu(), 1, generator=self.generator))

    def choose(self, logits: torch.Tensor) -> tuple[int, float]:
        """Pick the next token from a [vocab] logit row; return it with its probability."""
        probs = self.distribution(logits)
        token = self.pick(logits, probs)
        return token, float(probs[token])


def top_p_filter(probs: torch.Tensor, top_p: float) -> torch.Tensor:
    """Keep the smallest set of most likely tokens whose mass reaches top_p, renormalised."""
    sorted_probs, order = torch.sort(probs, descending=True, dim=-1)
    mass_before = torch.cumsum(sorted_probs, dim=-1) - sorted_probs
    sorted_probs = torch.where(mass_before < top_p, sorted_probs, torch.zeros_like(sorted_probs))
    filtered = torch.zeros_like(probs).scatter(-1, order, sorted_probs)
    return filtered / filtered.sum(dim=-1, keepdim=True)


def top_k(probs: torch.Tensor, k: int) -> tuple[tuple[int, ...], tuple[float, ...]]:
    values, indices = torch.topk(probs, k)
    return tuple(int(i) for i in indices), tuple(round(float(v), 6) for v in values)
