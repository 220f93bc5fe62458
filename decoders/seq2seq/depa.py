"""DePA, the dependency-aware decoder (Zhan et al. 2023), on the NAT of `models.NAT`.

A vanilla NAT's decoder never learns how target tokens depend on one another: each position sees
the copied *source* and predicts its word on its own. DePA changes two things:

1. **Input transformation.** The copied source is moved into the target language's space before
   the decoder reads it: each position attends over the target vocabulary's embeddings and takes
   their weighted mean (`transform`).
2. **Forward-backward pre-training.** The decoder is first trained with each position attending
   only to the positions at or left of it (left to right), then only to those at or right of it
   (right to left), and only then to every position (the NAT), `PHASES` in order: it learns to
   read its neighbours one side at a time before it reads both.

Here every phase reads the same transformed inputs; only the attention mask changes. Feeding the
pre-training phases the shifted target tokens instead (an autoregressive decoder's inputs, each
position reading its neighbour's word) left a decoder that the NAT phase could not bring back
from expecting the previous word at each position: 7–12% valid on `modes`, against 63% trained
cold, in probes of the same budget (docs/TRANSLATION.md).

`cold` is the same decoder, with the same input transformation, trained as a NAT only.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from .models import DEFAULT, NAT, Config, pad, uniform_copy
from .tasks import N_WORDS, PAD, REG, TAIL

PHASES = ("l2r", "r2l", "nat")
ATTEND = {"l2r": "left", "r2l": "right", "nat": "all"}
TARGET_WORDS = slice(REG[0], TAIL + N_WORDS)  # the target language's tokens


class DePA(NAT):
    name = "depa"

    def __init__(self, cfg: Config = DEFAULT) -> None:
        super().__init__(cfg, inputs="uniform")
        self.query = nn.Linear(cfg.d, cfg.d)
        self.phase = "nat"

    def transform(self, copied: torch.Tensor) -> torch.Tensor:
        """The copied source's embeddings moved into the target's: attention over the target
        vocabulary's embeddings."""
        targets = self.embed.weight[TARGET_WORDS]
        q = self.query(self.embed(copied))
        weights = torch.softmax(q @ targets.T / math.sqrt(self.cfg.d), -1)
        return weights @ targets

    def logits(self, src: torch.Tensor, lengths, attend: str = "all") -> torch.Tensor:
        memory, mmask = self.encode(src)
        copied = uniform_copy(src, lengths)
        return self.decode(self.transform(copied), memory, mmask, copied == PAD, attend=attend)

    def loss(self, src: torch.Tensor, tgt: list[tuple[int, ...]]) -> torch.Tensor:
        if self.phase not in PHASES:
            raise ValueError(f"unknown DePA phase {self.phase!r}: one of {', '.join(PHASES)}")
        memory, mmask = self.encode(src)
        lengths = [len(t) for t in tgt]
        copied = uniform_copy(src, lengths)
        logits = self.decode(
            self.transform(copied), memory, mmask, copied == PAD, attend=ATTEND[self.phase]
        )
        out = pad(list(tgt), copied.shape[1])
        token = nn.functional.cross_entropy(logits.transpose(1, 2), out, ignore_index=PAD)
        length = nn.functional.cross_entropy(self.length(memory, mmask), torch.tensor(lengths))
        return token + 0.1 * length
