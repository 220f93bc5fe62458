"""Mask tuning for SPACE (`space`), on a frozen base: the [MASK] embedding and the low-rank adapters
that act on mask rows only (decoders/trained/mask_model.py).

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

`--full` is the paper's variant (b): every weight of a copy of the model learns, with the mask
embedding and no LoRA, in one pass over real tokens and mask groups together. The real rows learn
the original model's distribution (self-distillation stands in for the paper's plain SFT half),
so the tuned model stays near the original but is no longer it: `space` on it is lossless
against the tuned model's own greedy output. It is saved to the model cache (weights, tokenizer,
space_mask.safetensors and its card), never to the repository; load it by its directory:

    python -m decoders.train space --model embedded --full --max-steps 150
    python -m decoders --model ~/.cache/decoding-lab/models/space-sft-smollm2-135m-instruct ...
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import random
from pathlib import Path

import torch
from torch import nn
from transformers import DynamicCache

from decoders.core.models import cache_dir, slug
from decoders.core.runtime import cache_arg
from decoders.train.corpus import add_arguments as add_corpus_arguments
from decoders.train.loop import add_loop_arguments, fit_artifact, run_fields
from decoders.train.states import Prepared, States, prepare, windows
from decoders.trained.mask_model import SFT_FILE, MaskAdapter, adapter_path, masked_forward


def add_arguments(ap: argparse.ArgumentParser) -> None:
    add_corpus_arguments(ap)
    add_loop_arguments(ap, epochs=1, lr=2e-3, batch_size=4)
    g = ap.add_argument_group("space")
    g.add_argument("--k", type=int, default=4, help="masks per group (guesses per step)")
    g.add_argument("--rank", type=int, default=16, help="LoRA rank")
    g.add_argument("--alpha", type=float, default=32.0, help="LoRA alpha (scale = alpha / rank)")
    g.add_argument("--groups", type=int, default=16, help="mask groups (cut points) per window")
    g.add_argument("--window", type=int, default=192, help="real tokens per window")
    g.add_argument(
        "--mask-decay",
        type=_unit_interval,
        default=1.0,
        help="mask j's loss weighs decay^j (1: every mask alike; < 1: the early guesses, which "
        "decide how many are accepted, count more)",
    )
    g.add_argument(
        "--mask-lr",
        type=float,
        default=1e-3,
        help="--full: the [MASK] embedding's peak learning rate (the model's is --lr)",
    )
    g.add_argument(
        "--full",
        action="store_true",
        help="the paper's SFT: fine-tune every weight (no LoRA: --rank and --alpha do not apply) and "
        "save the model with its mask to the model cache (--out: a directory); decoding is then "
        "lossless against that model",
    )


def _unit_interval(text: str) -> float:
    """--mask-decay: a weight ratio in [0, 1] (0: mask 1 alone; above 1 would favour late masks)."""
    value = float(text)
    if not 0.0 <= value <= 1.0:
        raise argparse.ArgumentTypeError(f"{text}: not in [0, 1]")
    return value


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


def draw_cuts(states: States, spans, groups: int, k: int, rng: random.Random):
    """The batch's ids [b, W] (right-padded) and `groups` random cut points s per span; for each
    mask row (group g, mask j) the window position whose feature it learns, s + 1 + j, and
    whether that position is inside the span."""
    width = max(b - a for a, b in spans)
    ids = torch.zeros(len(spans), width, dtype=torch.long)
    at = torch.zeros(len(spans), groups * k, dtype=torch.long)
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
    return ids, at, valid, cuts


def run_masks(bundle, adapter: MaskAdapter, states: States, spans, groups: int, rng: random.Random):
    """One batch: the real tokens through the frozen model into a cache, then `groups` mask groups
    per span against it. Returns the mask rows' logits [b, G·k, V], the base model's features at
    the positions they predict from [b, G·k, d] (over the window, the context the masks see), and
    which rows are real (inside their span)."""
    k = adapter.k
    dev = bundle.device
    ids, at, valid, cuts = draw_cuts(states, spans, groups, k, rng)
    width = ids.shape[1]
    positions, mask = group_layout(width, cuts, k, bundle.dtype)
    cache = DynamicCache(config=bundle.model.config)
    with torch.no_grad():
        real = bundle.model.model(input_ids=ids.to(dev), **cache_arg(cache), use_cache=True)
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


def losses(
    lm_head, logits, target_feats, valid, k: int, decay: float = 1.0
) -> dict[str, torch.Tensor]:
    """Soft cross-entropy against the base model's distribution, mask j's rows weighted decay^j
    (a weighted mean: decay 1 weighs every row alike); top-1 agreement per mask. A later guess
    counts only once every guess before it was accepted, so decay < 1 spends the adapter's
    capacity where acceptance is decided (Medusa weighs its heads the same way)."""
    with torch.no_grad():
        target = torch.softmax(lm_head(target_feats[valid]), -1)
    rows = logits[valid]
    which = (torch.arange(logits.shape[1], device=logits.device) % k)[None].expand_as(valid)[valid]
    weight = decay ** which.to(rows.dtype)
    ce = -(target * torch.log_softmax(rows, -1)).sum(-1)
    hit = (rows.argmax(-1) == target.argmax(-1)).float()
    out = {"loss": (weight * ce).sum() / weight.sum()}
    for j in range(k):
        out[f"top1_m{j + 1}"] = hit[which == j].mean() if (which == j).any() else hit.sum() * 0
    return out


def _data(prep: Prepared, args: argparse.Namespace):
    """Training windows (shuffled, in batches) and held-out windows per source."""
    states = prep.states
    spans = windows(states, prep.train_docs, args.window)
    random.Random(args.seed).shuffle(spans)
    batches = [spans[i : i + args.batch_size] for i in range(0, len(spans), args.batch_size)]
    held = {
        source: windows(states, [d for d in prep.held_docs if states.sources[d] == source], 256)
        for source in sorted(set(states.sources))
    }
    return spans, batches, held


def train(prep: Prepared, args: argparse.Namespace, argv: list[str]) -> dict:
    bundle, states = prep.bundle, prep.states
    bundle.model.requires_grad_(False)  # frozen base: gradients reach the adapter only
    torch.manual_seed(args.seed)
    adapter = MaskAdapter(bundle.model.config, args.k, args.rank, args.alpha).to(bundle.device)
    with torch.no_grad():  # start the mask at the mean embedding: a plausible input, not zeros
        adapter.mask.copy_(bundle.model.model.embed_tokens.weight.mean(0))
    spans, batches, held = _data(prep, args)
    draw = random.Random(args.seed + 1)

    def step_loss(batch):
        return losses(
            bundle.model.lm_head,
            *run_masks(bundle, adapter, states, batch, args.groups, draw),
            args.k,
            args.mask_decay,
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
            "mask_decay": args.mask_decay,
            "parameters": sum(p.numel() for p in adapter.parameters()),
            "held_out_top1": result["held_out"],
            "train_tokens": sum(b - a for a, b in spans),
        },
        desc="space",
    )
    return json.loads(out.with_suffix(".json").read_text())


def sft_dir(model_id: str) -> Path:
    """Where the full-SFT model goes by default: the model cache, never the repository."""
    return cache_dir() / "models" / f"space-sft-{slug(model_id)}"


class FullSFT(nn.Module):
    """The paper's mask tuning: a trainable copy of the whole model (unpacked: its weights change)
    and the [MASK] embedding (a rank-0 MaskAdapter: no LoRA, the model itself learns the masks)."""

    def __init__(self, bundle, k: int) -> None:
        super().__init__()
        model = type(bundle.model)(bundle.model.config)
        model.load_state_dict(bundle.model.state_dict())  # the plain weights, not the packed copies
        model.requires_grad_(True)
        self.model = model
        self.adapter = MaskAdapter(bundle.model.config, k, rank=0)
        self.bundle = dataclasses.replace(bundle, model=model, packed=False)


def run_full(sft: FullSFT, original, states: States, spans, groups: int, rng: random.Random):
    """One batch through the trainable model in one pass, real tokens and mask groups together
    (every weight learns, so the real rows need gradients too). Returns the logits of the real
    rows [b, W, V] and of the mask rows [b, G·k, V], the original model's features for each (from
    its own forward over the window: the context both models see), and which rows are inside
    their span."""
    k = sft.adapter.k
    dev = sft.bundle.device
    ids, at, mask_valid, cuts = draw_cuts(states, spans, groups, k, rng)
    b, width = ids.shape
    lengths = torch.tensor([e - a for a, e in spans])
    real_valid = torch.arange(width)[None] < lengths[:, None]
    with torch.no_grad():  # right padding: causal attention keeps it out of every real row
        real_target = original.model.model(input_ids=ids.to(dev)).last_hidden_state.float()
        mask_target = real_target.gather(
            1, at.to(dev)[..., None].expand(-1, -1, real_target.shape[-1])
        )
    dtype = sft.bundle.dtype
    positions, mask_rows = group_layout(width, cuts, k, dtype)
    n = groups * k
    causal = torch.ones(width, width, dtype=torch.bool).tril()
    real_rows = torch.cat([causal, torch.zeros(width, n, dtype=torch.bool)], dim=-1)
    real_rows = torch.zeros(real_rows.shape, dtype=dtype).masked_fill(
        ~real_rows, torch.finfo(dtype).min
    )
    attention = torch.cat([real_rows.expand(b, 1, -1, -1), mask_rows], dim=2)
    positions = torch.cat([torch.arange(width).expand(b, -1), positions], dim=1)
    tokens = torch.cat([ids, torch.zeros(b, n, dtype=torch.long)], dim=1)
    feats = masked_forward(
        sft.bundle, sft.adapter, None, tokens.to(dev), width, positions.to(dev), attention.to(dev)
    )
    logits = sft.model.lm_head(feats)
    return (
        logits[:, :width],
        real_target,
        real_valid.to(dev),
        logits[:, width:],
        mask_target,
        mask_valid.to(dev),
    )


def full_losses(
    lm_head, real_logits, real_target, real_valid, *mask_part, k: int, decay: float = 1.0
):
    """The masks' loss (as the frozen variant) plus the real rows' soft cross-entropy to the
    original model, which keeps the tuned model near it (the paper mixes in plain SFT data);
    `real_top1` = how often the tuned model's own next token is still the original's."""
    out = losses(lm_head, *mask_part, k, decay)
    with torch.no_grad():
        target = torch.softmax(lm_head(real_target[real_valid]), -1)
    rows = real_logits[real_valid]
    ce = -(target * torch.log_softmax(rows, -1)).sum(-1).mean()
    out["mask_loss"] = out["loss"]
    out["real_loss"] = ce
    out["loss"] = out["loss"] + ce
    out["real_top1"] = (rows.argmax(-1) == target.argmax(-1)).float().mean()
    return out


def train_full(prep: Prepared, args: argparse.Namespace, argv: list[str]) -> dict:
    """(b): the whole model and the mask learn; the result goes to a directory in the model cache
    (the weights, the tokenizer, the mask as space_mask.safetensors and its card)."""
    from decoders.train.loop import Loop
    from decoders.train.states import card
    from decoders.trained.artifacts import save_artifact

    bundle, states = prep.bundle, prep.states
    torch.manual_seed(args.seed)
    sft = FullSFT(bundle, args.k).to(bundle.device)
    with torch.no_grad():
        sft.adapter.mask.copy_(bundle.model.model.embed_tokens.weight.mean(0))
    spans, batches, held = _data(prep, args)
    draw = random.Random(args.seed + 1)
    head = bundle.model.lm_head  # the original head: the targets are the original model's

    def step_loss(batch):
        out = run_full(sft, bundle, states, batch, args.groups, draw)
        return full_losses(head, *out, k=args.k, decay=args.mask_decay)

    def evaluate() -> dict[str, float]:
        scores: dict[str, float] = {}
        fixed = random.Random(0)
        with torch.no_grad():
            for source, spans_ in held.items():
                agree, count = [0.0] * args.k, [0] * args.k
                real, real_n = 0.0, 0
                for i in range(0, len(spans_), 4):
                    out = run_full(sft, bundle, states, spans_[i : i + 4], args.groups, fixed)
                    q = full_losses(head, *out, k=args.k)
                    valid = out[5]
                    per = valid.view(valid.shape[0], -1, args.k).sum((0, 1))
                    for j in range(args.k):
                        agree[j] += float(q[f"top1_m{j + 1}"]) * int(per[j])
                        count[j] += int(per[j])
                    n = int(out[2].sum())
                    real += float(q["real_top1"]) * n
                    real_n += n
                for j in range(args.k):
                    scores[f"top1_{source}_m{j + 1}"] = round(agree[j] / max(count[j], 1), 4)
                scores[f"same_as_original_{source}"] = round(real / max(real_n, 1), 4)
        return scores

    out = Path(args.out) if args.out else sft_dir(bundle.model_id)

    def write(result: dict) -> None:
        out.mkdir(parents=True, exist_ok=True)
        sft.model.save_pretrained(out)
        bundle.tokenizer.save_pretrained(out)
        fields = {
            "variant": "full SFT (every weight, no LoRA)",
            "k": args.k,
            "groups_per_window": args.groups,
            "mask_decay": args.mask_decay,
            "parameters": sum(p.numel() for p in sft.parameters()),
            "held_out_top1": result["held_out"],
            "train_tokens": sum(b - a for a, b in spans),
            "mask_lr": args.mask_lr,
            **run_fields(args, prep, result),
        }
        save_artifact(sft.adapter, out / SFT_FILE, card(prep, "space-sft", argv, **fields))

    loop = Loop(
        epochs=args.epochs,
        lr=args.lr,
        warmup=args.warmup,
        max_steps=args.max_steps,
        minutes=args.minutes,
        checkpoint=out / "resume.ckpt",  # beside the model it resumes (--resume)
        resume=args.resume,
        seed=args.seed,
        desc="space --full",
        lr_for={"adapter.": args.mask_lr},  # the new [MASK] embedding moves faster than the model
    )
    result = loop.fit(sft, batches, step_loss, evaluate, on_epoch=write)
    write(result)
    (out / "resume.ckpt").unlink(missing_ok=True)  # the model and its optimiser: ~1.6 GB, done with
    return json.loads((out / SFT_FILE).with_suffix(".json").read_text())


def run(args: argparse.Namespace, argv: list[str]) -> dict:
    prep = prepare(args, probe=False)  # SPACE scores its masks on its own windows
    return train_full(prep, args, argv) if args.full else train(prep, args, argv)
