"""Mask tuning for SPACE (`space`), on a frozen base: the [MASK] embedding and the low-rank adapters
that act on mask rows only (decoders/mask_model.py).

    python -m decoders.train space --model embedded --k 4

Data, as the paper prepares it: cut a text at random points s; after the token at s come k masks,
and mask j (j = 0 .. k-1, at position s + 1 + j) learns the token at s + 2 + j, the one after the
position it sits at. Here the target is the base model's own distribution there (soft
cross-entropy, self-distillation), from the same forward over the window that fills the cache, so
the masks and their target see the same context.

Training layout: many cut points per window, each with its own group of k masks, each group
hidden from the others and seeing only the real tokens up to its s. The real tokens never change
(the base is frozen and the adapters skip them), so they run once without gradients into a KV
cache, and only the mask rows run with gradients, against that cache: one forward trains
`groups` × k positions at the cost of a short extension.
"""

from __future__ import annotations

import argparse
import json
import random

import torch
from transformers import DynamicCache

from ..mask_model import MaskAdapter, adapter_path, masked_forward
from .corpus import add_arguments as add_corpus_arguments
from .loop import add_loop_arguments, fit_artifact
from .states import Prepared, States, prepare, windows


def add_arguments(ap: argparse.ArgumentParser) -> None:
    add_corpus_arguments(ap)
    add_loop_arguments(ap, epochs=1, lr=2e-3, batch_size=4)
    g = ap.add_argument_group("space")
    g.add_argument("--k", type=int, default=4, help="masks per group (guesses per step)")
    g.add_argument("--rank", type=int, default=16, help="LoRA rank")
    g.add_argument("--alpha", type=float, default=32.0, help="LoRA alpha (scale = alpha / rank)")
    g.add_argument("--groups", type=int, default=16, help="mask groups (cut points) per window")
    g.add_argument("--window", type=int, default=192, help="real tokens per window")


def group_layout(
    width: int, cuts: list[list[int]], k: int, dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor]:
    """Positions [b, G·k] and the additive attention mask [b, 1, G·k, width + G·k] of the mask
    rows: group g's mask j sits at cuts[g] + 1 + j and sees the real tokens 0 .. cuts[g] and the
    masks of its own group up to itself (never another group)."""
    b, groups = len(cuts), len(cuts[0])
    n = groups * k
    s = torch.tensor(cuts)  # [b, G]
    j = torch.arange(k)
    positions = (s[:, :, None] + 1 + j).reshape(b, n)
    real = torch.arange(width)[None, None, None, :] <= s[:, :, None, None]  # [b, G, 1, W]
    real = real.expand(b, groups, k, width).reshape(b, n, width)
    own = torch.block_diag(*[torch.ones(k, k, dtype=torch.bool).tril()] * groups)
    sees = torch.cat([real, own.expand(b, n, n)], dim=-1)
    mask = torch.zeros(sees.shape, dtype=dtype).masked_fill(~sees, torch.finfo(dtype).min)
    return positions, mask[:, None]


def run_masks(bundle, adapter: MaskAdapter, states: States, spans, groups: int, rng: random.Random):
    """One batch: the real tokens through the frozen model into a cache, then `groups` mask groups
    per span against it. Returns the mask rows' logits [b, G·k, V], the base model's features at
    the positions they predict from [b, G·k, d] (over the window, the context the masks see), and
    which rows are real (inside their span)."""
    k = adapter.k
    width = max(b - a for a, b in spans)
    dev = bundle.device
    ids = torch.zeros(len(spans), width, dtype=torch.long)
    at = torch.zeros(len(spans), groups * k, dtype=torch.long)  # the feature each mask learns
    valid = torch.zeros(len(spans), groups * k, dtype=torch.bool)
    cuts: list[list[int]] = []
    for r, (a, b) in enumerate(spans):
        n = b - a
        ids[r, :n] = states.tokens[a:b]
        # s + k <= n - 1: the feature at s + 1 + j predicts the label of mask j (j < k).
        room = list(range(max(1, n - k)))
        chosen = sorted(rng.sample(room, min(groups, len(room))))
        chosen += [chosen[-1]] * (groups - len(chosen))  # short spans repeat their last cut
        cuts.append(chosen)
        for g, s in enumerate(chosen):
            for j in range(k):
                if s + 1 + j < n:
                    at[r, g * k + j] = s + 1 + j
                    valid[r, g * k + j] = True
    positions, mask = group_layout(width, cuts, k, bundle.dtype)
    cache = DynamicCache(config=bundle.model.config)
    with torch.no_grad():
        real = bundle.model.model(input_ids=ids.to(dev), past_key_values=cache, use_cache=True)
        target = real.last_hidden_state.float().gather(
            1, at.to(dev)[..., None].expand(-1, -1, real.last_hidden_state.shape[-1])
        )
    n = groups * k
    feats = masked_forward(
        bundle,
        adapter,
        cache,
        torch.zeros(len(spans), n, dtype=torch.long, device=dev),
        0,  # every row is a mask
        positions.to(dev),
        mask.to(dev),
    )
    return bundle.model.lm_head(feats), target, valid.to(dev)


def losses(lm_head, logits, target_feats, valid, k: int) -> dict[str, torch.Tensor]:
    """Soft cross-entropy against the base model's distribution; top-1 agreement per mask."""
    with torch.no_grad():
        target = torch.softmax(lm_head(target_feats[valid]), -1)
    rows = logits[valid]
    ce = -(target * torch.log_softmax(rows, -1)).sum(-1).mean()
    hit = (rows.argmax(-1) == target.argmax(-1)).float()
    which = (torch.arange(logits.shape[1], device=logits.device) % k)[None].expand_as(valid)[valid]
    out = {"loss": ce}
    for j in range(k):
        out[f"top1_m{j + 1}"] = hit[which == j].mean() if (which == j).any() else hit.sum() * 0
    return out


def train(prep: Prepared, args: argparse.Namespace, argv: list[str]) -> dict:
    bundle, states = prep.bundle, prep.states
    bundle.model.requires_grad_(False)  # frozen base: gradients reach the adapter only
    torch.manual_seed(args.seed)
    adapter = MaskAdapter(bundle.model.config, args.k, args.rank, args.alpha).to(bundle.device)
    with torch.no_grad():  # start the mask at the mean embedding: a plausible input, not zeros
        adapter.mask.copy_(bundle.model.model.embed_tokens.weight.mean(0))
    spans = windows(states, prep.train_docs, args.window)
    random.Random(args.seed).shuffle(spans)
    batches = [spans[i : i + args.batch_size] for i in range(0, len(spans), args.batch_size)]
    held = {
        source: windows(states, [d for d in prep.held_docs if states.sources[d] == source], 256)
        for source in sorted(set(states.sources))
    }
    draw = random.Random(args.seed + 1)

    def step_loss(batch):
        return losses(
            bundle.model.lm_head,
            *run_masks(bundle, adapter, states, batch, args.groups, draw),
            args.k,
        )

    def evaluate() -> dict[str, float]:
        scores: dict[str, float] = {}
        fixed = random.Random(0)  # the same held-out cut points every epoch
        for source, spans_ in held.items():
            agree = [0.0] * args.k
            count = [0] * args.k
            for i in range(0, len(spans_), 8):
                logits, target, valid = run_masks(
                    bundle, adapter, states, spans_[i : i + 8], args.groups, fixed
                )
                out = losses(bundle.model.lm_head, logits, target, valid, args.k)
                per = valid.view(valid.shape[0], -1, args.k).sum((0, 1))
                for j in range(args.k):
                    agree[j] += float(out[f"top1_m{j + 1}"]) * int(per[j])
                    count[j] += int(per[j])
            for j in range(args.k):
                scores[f"top1_{source}_m{j + 1}"] = round(agree[j] / max(count[j], 1), 4)
        return scores

    out = args.out or adapter_path(bundle.model_id)

    fit_artifact(
        adapter,
        batches,
        step_loss,
        evaluate,
        args=args,
        prep=prep,
        name="space",
        argv=argv,
        out=out,
        fields=lambda result: {
            "k": args.k,
            "rank": args.rank,
            "alpha": args.alpha,
            "groups_per_window": args.groups,
            "parameters": sum(p.numel() for p in adapter.parameters()),
            "held_out_top1": result["held_out"],
            "train_tokens": sum(b - a for a, b in spans),
        },
        desc="space",
    )
    return json.loads(out.with_suffix(".json").read_text())


def run(args: argparse.Namespace, argv: list[str]) -> dict:
    return train(prepare(args), args, argv)
