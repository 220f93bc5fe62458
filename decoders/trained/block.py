"""A block drafter (the DFlash line: Chen et al. 2026, arXiv 2602.06036; PARD): one forward fills a
whole block of draft positions, conditioned on the target's features from a low, a middle and a
high layer.

    context entry j = fc([embed(t_{j+1}) ; fuse(h_low_j, h_mid_j, f_j)])    real target features
    block           = the entry of x (the last committed token), then k - 1 masks: x's entry
                      plus a learned vector per offset
    one forward:    entries attend causally (their keys and values stay cached), the masks
                    attend to every entry and to each other
    q(t_n)     = softmax(lm_head(out_0))                 out_0: the layer's output at x's entry
    q(t_{n+i}) = softmax(lm_head(ahead_i(out_i)))       mask i's, through its own residual block

So the first position is an EAGLE-3 head's first draft step, and the masks guess the tokens after
it without waiting for it: a chain drafter pays one head forward per draft token (the EAGLE chain:
γ forwards in a row), the block drafter one forward per step, whatever its length. Every entry is
built from the target's real features (the features of what verification kept), so nothing the
drafter guessed is ever fed back into it, and training needs no unrolling: entries teacher-forced,
each mask at its offset from an anchor (`decoders.train.block`).

One layer over the target's width and the target's own embedding and LM head (cut to a draft
vocabulary), as the EAGLE head; a block head starts from one (`--init`), its fusion as the identity
on the final features and its masks fresh. Trained by `python -m decoders.train block`, shipped as
`assets/block/<model>.safetensors`.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn
from transformers import DynamicCache

from decoders.core.drafter import Drafter
from decoders.core.events import Forward
from decoders.core.models import ModelBundle
from decoders.core.runtime import ForwardResult, cache_arg, crop_cache, elapsed_ms
from decoders.trained.artifacts import artifact_path, full_logits, load_artifact
from decoders.trained.eagle import EagleHead
from decoders.trained.medusa_heads import ResBlock

KIND = "block"  # assets/block/<model>.safetensors


class BlockHead(EagleHead):
    """The EAGLE head's fc and layer (EAGLE-3's fused input) plus `block - 1` mask entries: the
    layer's inputs for the positions after x, x's entry plus one learned vector per offset."""

    SAVE_INT8 = True  # its matrices ship as int8 per row (artifacts.to_int8)

    def __init__(self, config, vocab: torch.Tensor, fuse: Sequence[int], block: int) -> None:
        super().__init__(config, vocab, fuse)
        if block < 2:
            raise ValueError(f"block: at least 2 positions (x's and one mask), got {block}")
        d = config.hidden_size
        self.masks = nn.Parameter(torch.zeros(block - 1, d))
        # Mask i's output goes through its own residual block before the LM head (a Medusa head
        # on the layer's features: zero at first, so it starts as x's entry's guess).
        self.ahead = nn.ModuleList(ResBlock(d) for _ in range(block - 1))
        # What a warm start from an EAGLE head lacks (they keep their initialization).
        self.GROWN = (
            *EagleHead.GROWN,
            "masks",
            *(k for k in self.state_dict() if k.startswith("ahead.")),
        )

    def outputs(self, out: torch.Tensor) -> torch.Tensor:
        """[..., k, d] the layer's outputs at x's entry and the masks -> the features the LM head
        reads: x's as they are, mask i's through its residual block."""
        ahead = [block(out[..., 1 + i, :]) for i, block in enumerate(self.ahead)]
        return torch.stack([out[..., 0, :], *ahead], dim=-2)

    def mask_inputs(self, x_entry: torch.Tensor) -> torch.Tensor:
        """[..., 1, d] x's entry -> [..., k - 1, d]: each mask is x's entry plus its own vector, so
        a mask starts out guessing what x's entry guesses (as a Medusa head starts as the LM head)
        and learns how far ahead it stands."""
        return x_entry + self.masks.to(x_entry.dtype)

    @property
    def block(self) -> int:
        """Positions one forward fills: x's entry and the masks."""
        return 1 + len(self.masks)

    def entries(self, embeds: torch.Tensor, features: torch.Tensor) -> torch.Tensor:
        """[..., n, d]: the layer's inputs for context entries (t_{j+1}'s embedding, f_j fused)."""
        return self.fc(torch.cat([embeds, self.fused(features)], dim=-1))

    def run(
        self,
        h: torch.Tensor,  # [b, n, d] entries and masks
        positions: torch.Tensor,  # [b, n]
        mask: torch.Tensor,  # [b or 1, 1, n, past + n] additive
        cache: DynamicCache | None = None,
    ) -> torch.Tensor:
        """The layer over `h` with an explicit mask (and the cached entries before it)."""
        return self.layer(
            h,
            attention_mask=mask,
            position_ids=positions,
            **cache_arg(cache),
            use_cache=cache is not None,
            position_embeddings=self.rotary(h, position_ids=positions),
        )


def block_path(model_id: str) -> Path:
    return artifact_path(KIND, model_id)


def load_block(bundle: ModelBundle, path: Path | None = None) -> BlockHead:
    """The trained block head for `bundle`'s model (cached per process), in the drafting dtype,
    with `lm_head` = the target's LM head cut to its draft vocabulary."""
    return load_artifact(
        bundle,
        path or block_path(bundle.model_id),
        lambda state: BlockHead(
            bundle.model.config, state["vocab"], state.get("fuse", ()), 1 + len(state["masks"])
        ),
        "block drafter",
        f"python -m decoders.train block --model {bundle.model_id}",
        drafts=True,
    )


def block_mask(past: int, entries: int, masks: int, dtype: torch.dtype) -> torch.Tensor:
    """[1, 1, n, past + n], n = entries + masks: entry r sees the cache and the entries up to
    itself; every mask sees the cache, every entry and every mask (the block attends to itself)."""
    n = entries + masks
    allowed = torch.ones(n, past + n, dtype=torch.bool)
    allowed[:entries, past:] = torch.ones(entries, n, dtype=torch.bool).tril()
    out = torch.zeros(n, past + n, dtype=dtype).masked_fill(~allowed, torch.finfo(dtype).min)
    return out.view(1, 1, n, past + n)


@dataclass(frozen=True)
class Filled:
    """One forward's block: `logits[i]` scores the token i after x (full vocabulary, -inf outside
    the draft vocabulary), `event` the Forward that ran it."""

    logits: torch.Tensor  # [k, vocab]
    event: Forward


class BlockDrafter:
    """The block head's side of the decoding loop: handed the target's features of every input
    verification keeps (`observe`, prefill included, as an EAGLE head is), it fills a block after
    the last committed token in one forward (`fill`). Its cache holds one entry per committed
    token but the last; the masks' keys and values are dropped after each forward."""

    needs_features = True

    def __init__(self, target: ModelBundle, head: BlockHead) -> None:
        self.bundle, self.head = target, head
        self.feature_layers = head.fused_layers
        self.dtype = head.fc.weight.dtype
        self.embed = target.model.model.embed_tokens
        self.cache = DynamicCache()
        self.features = torch.empty(0, 0, device=target.device)
        self.filled = 0  # entries in the cache
        fused = ", ".join(map(str, self.feature_layers))
        self.label = f"block ({head.block} positions in 1 forward; the target's layers {fused} and its features)"

    @torch.inference_mode()
    def observe(self, features: torch.Tensor) -> None:
        """Append the target's states for the inputs it just kept (fused later, with the entry)."""
        self.features = features if not len(self.features) else torch.cat([self.features, features])

    @torch.inference_mode()
    def fill(self, context: Sequence[int], step: int) -> Filled:
        """Entries for the context not yet cached (t_{j+1} with f_j, up to x's), then the masks:
        one forward of the layer. Returns the block's k distributions."""
        start = time.perf_counter()
        n = len(context)
        assert len(self.features) == n - 1, "the target's features must cover context[:-1]"
        device = self.bundle.device
        ids = torch.as_tensor(list(context[self.filled + 1 :]), device=device).view(1, -1)
        feats = self.features[self.filled :].to(self.dtype).view(1, ids.shape[1], -1)
        entries = self.head.entries(self.embed(ids).to(self.dtype), feats)
        h = torch.cat([entries, self.head.mask_inputs(entries[:, -1:])], dim=1)
        past, new, k = self.filled, entries.shape[1], self.head.block
        positions = torch.arange(past, past + new + k - 1, device=device).view(1, -1)
        mask = block_mask(past, new, k - 1, self.dtype).to(device)
        out = self.head.run(h, positions, mask, self.cache)[0]
        crop_cache(self.cache, n - 1)  # the entries stay, the masks go
        self.filled = n - 1
        features = self.head.outputs(out[new - 1 :])
        logits = full_logits(self.bundle, self.head.vocab, self.head.lm_head(features))
        wall_ms = elapsed_ms(self.bundle, start)
        event = Forward(step, "draft", n_input_tokens=new + k - 1, layers=1, wall_ms=wall_ms)
        return Filled(logits, event)


class BlockTreeDrafter(Drafter):
    """The block head behind the drafter protocol, for the token tree (`draft=block`): the step's
    first forward (x) fills the whole block, and a deeper level's "forward" reads the block's
    next position without running anything (`reach` depths per step, one forward in all). So
    every node at depth d gets position d + 1's distribution, whichever token it holds: the
    positions guess from the context alone, and the tree's rule keeps the paths whose product of
    probabilities pays for their inputs."""

    needs_features = True

    def __init__(self, target: ModelBundle, head: BlockHead) -> None:
        self.block = BlockDrafter(target, head)
        super().__init__(target, DynamicCache(), None, self.block.label)
        self.feature_layers = self.block.feature_layers
        self.reach = head.block
        self.context: Sequence[int] = ()
        self.rows: torch.Tensor | None = None  # this step's block: [reach, vocab]

    def observe(self, features: torch.Tensor) -> None:
        self.block.observe(features)

    def begin(self, context: Sequence[int], step: int) -> list[ForwardResult]:
        self.context, self.prefix, self.rows = context, len(context) - 1, None
        return []  # the entries ride along with the block's forward

    def forward(
        self,
        tokens: Sequence[int],
        step: int,
        positions: Sequence[int] | None = None,
        mask: torch.Tensor | None = None,
        logits_to_keep: int = 0,
        parents: Sequence[int] | None = None,
    ) -> ForwardResult:
        if self.rows is None:  # x: the one forward of the step
            assert list(tokens) == [self.context[-1]], "the step's first input is x"
            filled = self.block.fill(self.context, step)
            self.rows = filled.logits
            return ForwardResult(filled.logits[:1], {}, filled.event)
        # A node at position p (x at prefix) is followed by block position p - prefix.
        assert positions is not None, "a block drafter reads a node's depth from its position"
        at = [p - self.prefix for p in positions]
        if max(at) >= self.reach:
            raise ValueError(f"depth {max(at)}: the block head fills {self.reach} positions")
        return ForwardResult(self.rows[at], {}, None)

    def end(self) -> None:
        self.rows = None
