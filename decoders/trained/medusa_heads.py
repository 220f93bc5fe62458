"""Medusa-1 heads (Cai et al. 2024), shared by `medusa` (a static tree of their top-k) and
`blockwise` (Stern et al. 2018: their top-1 chain).

Head i (i = 1..k) reads the target's final features at position t and guesses the token at t + i + 1
(the LM head itself guesses t + 1): one residual block, then the target's own LM head.

    head_i(f) = lm_head(f + SiLU(W_i f + b_i))

W_i starts at zero, so before training every head repeats the LM head's guess. The heads are
trained by `python -m decoders.train medusa` and ship as `assets/medusa/<model>.safetensors`.

Published heads (FasterDecoding/Medusa's layout, `PublishedMedusaHeads`) are the same residual
blocks, each head ending in an LM head of its own over the whole vocabulary:

    head_i(f) = lm_head_i(ResBlock_i^depth(f))

The methods' `heads` parameter picks the heads (`heads_for`): ours, or published ones (read by
published.py).
"""

from __future__ import annotations

import time
from collections.abc import Generator
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from decoders.core.events import Event, Forward, HeadProposals
from decoders.core.models import ModelBundle
from decoders.core.runtime import elapsed_ms
from decoders.trained.artifacts import artifact_path, load_artifact

KIND = "medusa"


class ResBlock(nn.Module):
    def __init__(self, d: int) -> None:
        super().__init__()
        self.linear = nn.Linear(d, d)
        nn.init.zeros_(self.linear.weight)
        nn.init.zeros_(self.linear.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + nn.functional.silu(self.linear(x))


class MedusaHeads(nn.Module):
    """k heads of `depth` residual blocks each on the final features; `lm_head` (the target's, cut
    to the draft vocabulary) is attached at load time."""

    def __init__(self, config, n_heads: int, vocab: torch.Tensor, depth: int = 1) -> None:
        super().__init__()
        d = config.hidden_size
        self.heads = nn.ModuleList(
            nn.Sequential(*(ResBlock(d) for _ in range(depth))) for _ in range(n_heads)
        )
        self.register_buffer("vocab", vocab.long())

    @property
    def n_heads(self) -> int:
        return len(self.heads)

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        """[..., d] final features -> [..., k, d]: what head i hands the LM head."""
        return torch.stack([head(features) for head in self.heads], dim=-2)

    def rows(self, feature: torch.Tensor, n_heads: int) -> torch.Tensor:
        """[d] -> [n_heads, |vocab|]: the first heads' logits over the draft vocabulary."""
        return self.lm_head(torch.stack([head(feature) for head in self.heads[:n_heads]]))


class PublishedMedusaHeads(nn.Module):
    """Medusa heads in the official layout: `medusa_head.{i}` = `depth` ResBlocks (`.{j}.linear`)
    then head i's own LM head (`.{depth}`, Linear(d, vocab) without bias). Each scores the whole
    vocabulary."""

    def __init__(self, d: int, vocab_size: int, n_heads: int, depth: int) -> None:
        super().__init__()
        self.medusa_head = nn.ModuleList(
            nn.Sequential(
                *(ResBlock(d) for _ in range(depth)), nn.Linear(d, vocab_size, bias=False)
            )
            for _ in range(n_heads)
        )
        self.register_buffer("vocab", torch.arange(vocab_size), persistent=False)

    @property
    def n_heads(self) -> int:
        return len(self.medusa_head)

    def rows(self, feature: torch.Tensor, n_heads: int) -> torch.Tensor:
        """[d] -> [n_heads, vocab]: the first heads' logits."""
        return torch.stack([head(feature) for head in self.medusa_head[:n_heads]])


Heads = MedusaHeads | PublishedMedusaHeads


def heads_path(model_id: str) -> Path:
    return artifact_path(KIND, model_id)


def load_heads(bundle: ModelBundle, path: Path | None = None) -> MedusaHeads:
    """The trained Medusa heads for `bundle`'s model (cached per process)."""

    def build(state: dict[str, torch.Tensor]) -> MedusaHeads:
        n = 1 + max(int(k.split(".")[1]) for k in state if k.startswith("heads."))
        depth = 1 + max(int(k.split(".")[2]) for k in state if k.startswith("heads.0."))
        return MedusaHeads(bundle.model.config, n, state["vocab"], depth)

    return load_artifact(
        bundle,
        path or heads_path(bundle.model_id),
        build,
        "Medusa heads",
        f"python -m decoders.train medusa --model {bundle.model_id}",
        drafts=True,
    )


# The `heads` parameter's help, shared by the methods that read the heads (medusa, blockwise).
HEADS_HELP = (
    "which Medusa heads: empty = the ones trained for this model; a file `python -m "
    "decoders.train medusa --out FILE` wrote; or published heads in FasterDecoding/Medusa's "
    "layout (their own LM heads): a folder, a medusa_lm_head.pt/.safetensors file, or a hub id"
)


def heads_for(bundle: ModelBundle, spec: str) -> Heads:
    """The heads a `heads` parameter names: empty = the ones trained for this model; a file
    `python -m decoders.train medusa` wrote; else published heads (a folder, a weights file or a
    hub id in FasterDecoding/Medusa's layout: published.load_medusa)."""
    from decoders.trained import published

    spec = spec.strip()
    if not spec:
        return load_heads(bundle)
    if published.is_our_artifact(spec, "heads.0.0.linear.weight"):
        return load_heads(bundle, Path(spec).expanduser())
    return published.load_medusa(bundle, spec)


# --- decoding with the heads (medusa.py, blockwise.py) ---------------------------------------------


class HeadReader:
    """The heads' side of the decoding loop. The shared steps (`steps.start`, `verify_tree`,
    `verify_chain`) hand it the target's final features of the inputs they keep, as they would a
    feature-level drafter (`needs_features`, `observe`); it keeps the last one: the position whose
    LM-head output is the root x, the token the target chose there. `propose` reads the heads on it:
    no decoder layer runs, so the target's verify forward is also the proposal's (Stern et al.'s
    "combined scoring and proposal")."""

    needs_features = True

    def __init__(self, bundle: ModelBundle, heads: Heads) -> None:
        self.bundle, self.heads = bundle, heads
        self.feature: torch.Tensor | None = None  # [d] at the root's position

    def observe(self, features: torch.Tensor) -> None:
        self.feature = features[-1]

    @torch.inference_mode()
    def propose(self, n_heads: int, top_k: int, step: int) -> Proposal:
        """The first `n_heads` heads' `top_k` tokens (best first) and their probabilities, with
        the Forward event that timed them (kind "draft", 0 decoder layers, 1 input: the feature)."""
        assert self.feature is not None, "the heads read the features of a target forward"
        start = time.perf_counter()
        f = self.feature.to(next(self.heads.parameters()).dtype)  # bundle.draft_dtype
        rows = self.heads.rows(f, n_heads)
        # Softmax over the draft vocabulary = the full vocabulary's with -inf outside it.
        probs, index = torch.topk(torch.softmax(rows.float(), dim=-1), top_k, dim=-1)
        tokens = self.heads.vocab[index]
        wall_ms = elapsed_ms(self.bundle, start)
        event = Forward(step, "draft", n_input_tokens=1, layers=0, wall_ms=wall_ms)
        return Proposal(
            tuple(tuple(int(t) for t in row) for row in tokens.tolist()),
            tuple(tuple(round(float(p), 6) for p in row) for row in probs.tolist()),
            event,
        )

    def read(
        self, n_heads: int, top_k: int, step: int, position: int, detail: bool
    ) -> Generator[Event, None, Proposal]:
        """`propose`, recorded: the Forward that timed the heads and, with `detail`, their top-k
        rows as HeadProposals (`position`: tokens committed so far), where the view finds which
        rank the right token had. Returns the proposal."""
        proposal = self.propose(n_heads, top_k, step)
        yield proposal.event
        if detail:
            yield HeadProposals(step, position, proposal.tokens, proposal.probs)
        return proposal


@dataclass(frozen=True)
class Proposal:
    """tokens[i][r]: head i + 1's rank-r token (it guesses the token i + 1 after the root x)."""

    tokens: tuple[tuple[int, ...], ...]
    probs: tuple[tuple[float, ...], ...]
    event: Forward
