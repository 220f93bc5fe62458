"""The drafter protocol: who writes a draft (the target's own first k layers, a smaller model, a
trained EAGLE head: drafters.py, eagle.py) is hidden behind it.

All speak one small protocol so `speculative` (chains) and `token_tree` (trees) do not care:

    drafter.begin(context, step)           # the draft's cache now holds context[:-1]; returns
                                           # any catch-up forwards it ran to get there
    out = drafter.forward(tokens, ...)     # score new tokens (chain or tree) against that cache
    drafter.end()                          # forget everything drafted this step
    drafter.observe(features)              # (feature-level drafters) what the target just kept

How each drafter keeps its cache (a shared one for `self:k`, its own for a draft model): drafters.py.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from transformers import DynamicCache

from decoders.core.models import ModelBundle
from decoders.core.runtime import ForwardResult, crop_cache, forward


class Drafter:
    """Runs draft forwards on `bundle` against `cache`. After `begin(context)` the cache holds
    context[:-1] (`prefix` tokens); `end()` crops back to it, forgetting this step's drafts."""

    needs_features = False  # True: hand it the target's final features of every kept input
    feature_layers: tuple[int, ...] = ()  # and the states after these layers beside them
    # A parallel drafter's depths per step, all from its first forward (growing deeper is free);
    # None: one forward per depth
    reach: int | None = None

    def __init__(self, bundle: ModelBundle, cache: DynamicCache, depth: int | None, label: str):
        self.bundle, self.cache, self.depth, self.label = bundle, cache, depth, label
        self.prefix = 0

    def begin(self, context: Sequence[int], step: int) -> list[ForwardResult]:
        raise NotImplementedError

    def forward(
        self,
        tokens: Sequence[int],
        step: int,
        positions: Sequence[int] | None = None,
        mask: torch.Tensor | None = None,
        logits_to_keep: int = 0,
        parents: Sequence[int] | None = None,
    ) -> ForwardResult:
        """`parents[i]`: which earlier input of this step (0 = x) token i continues; token-level
        drafters read that from the mask, feature-level ones (EAGLE) need it to pick a feature."""
        return forward(
            self.bundle,
            self.cache,
            tokens,
            step=step,
            kind="draft",
            positions=positions,
            mask=mask,
            layers=self.depth,
            logits_to_keep=logits_to_keep,
        )

    def end(self) -> None:
        crop_cache(self.cache, self.prefix)

    def observe(self, features: torch.Tensor) -> None:
        """The target's final features for the inputs it just kept; token-level drafters ignore them."""

    @property
    def cache_length(self) -> int:
        return self.prefix
