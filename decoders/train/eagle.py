"""Train the EAGLE draft head (`speculative:draft=eagle`, `token_tree:draft=eagle`).

    python -m decoders.train eagle --model embedded        # corpus + states + training

EAGLE-1 (Li et al. 2024): the head reads the target's final feature f_i with the embedding of the
next token t_{i+1} and predicts f_{i+1}. Loss: smooth-L1 on the predicted feature plus a weight ×
cross-entropy against the target's distribution (over the draft vocabulary), with noise on the
input features so the head tolerates its own imperfect features when it drafts several steps.
`--init` starts from a shipped head (its layer; the draft vocabulary is rebuilt from this corpus).
"""

from __future__ import annotations

import argparse
import random
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors.torch import load_file

from ..artifacts import save_artifact
from ..eagle import EagleHead, head_path
from .corpus import add_arguments as add_corpus_arguments
from .loop import Loop, add_loop_arguments
from .states import Prepared, States, card, checkpoint_path, draft_vocabulary, prepare, windows

FEATURE_NOISE = 0.2  # std of the Gaussian noise on input features, relative to their RMS


def add_arguments(ap: argparse.ArgumentParser) -> None:
    add_corpus_arguments(ap)
    add_loop_arguments(ap, epochs=4, lr=1e-3, batch_size=8)
    g = ap.add_argument_group("eagle")
    g.add_argument("--vocab", type=int, default=8192, help="draft vocabulary size")
    g.add_argument("--window", type=int, default=256, help="positions per training span")
    g.add_argument("--cls-weight", type=float, default=0.3, help="weight of the token loss")
    g.add_argument("--init", type=Path, default=None, help="start from this head's weights")


def run_head(head: EagleHead, embed, states: States, spans, noise: float):
    """Pad a batch of spans; returns predicted features, the target's next features, valid mask."""
    width = max(b - a for a, b in spans) - 1
    d = states.features.shape[1]
    feats = torch.zeros(len(spans), width, d)
    nexts = torch.zeros(len(spans), width, d)
    ids = torch.zeros(len(spans), width, dtype=torch.long)
    valid = torch.zeros(len(spans), width, dtype=torch.bool)
    for r, (a, b) in enumerate(spans):
        n = b - a - 1
        feats[r, :n] = states.features[a : b - 1].float()
        nexts[r, :n] = states.features[a + 1 : b].float()
        ids[r, :n] = states.tokens[a + 1 : b]
        valid[r, :n] = True
    dev = next(head.parameters()).device
    feats, nexts, ids, valid = feats.to(dev), nexts.to(dev), ids.to(dev), valid.to(dev)
    if noise:
        feats = feats + torch.randn_like(feats) * noise * feats.pow(2).mean().sqrt()
    positions = torch.arange(width, device=dev).expand(len(spans), -1)
    with torch.no_grad():
        embeds = embed(ids)
    # Padding sits after each span's real positions: causal attention never shows it to them.
    return head(embeds, feats, positions), nexts, valid


def losses(w: torch.Tensor, pred, nexts, valid, cls_weight: float) -> dict[str, torch.Tensor]:
    """`w`: the target's LM head cut to the draft vocabulary."""
    pred, nexts = pred[valid], nexts[valid]
    reg = F.smooth_l1_loss(pred, nexts)
    with torch.no_grad():
        target = torch.softmax(nexts @ w.T, -1)
    logits = pred @ w.T
    cls = -(target * torch.log_softmax(logits, -1)).sum(-1).mean()
    top1 = (logits.argmax(-1) == target.argmax(-1)).float().mean()
    return {"loss": reg + cls_weight * cls, "reg": reg, "cls": cls, "top1": top1}


def fit_head(
    prep: Prepared,
    args: argparse.Namespace,
    checkpoint: Path | None = None,
    on_epoch: Callable[[EagleHead, dict], None] | None = None,
) -> tuple[EagleHead, dict]:
    """Fit a head on `prep`'s training documents (the Loop's result, plus `train_tokens`: the
    positions it learned from); `on_epoch(head, result)` after each epoch's held-out scores."""
    bundle, states = prep.bundle, prep.states
    torch.manual_seed(args.seed)
    vocab = draft_vocabulary(bundle, states, args.vocab)
    head = EagleHead(bundle.model.config, vocab).to(bundle.device)
    if args.init:
        weights = {k: v for k, v in load_file(str(args.init)).items() if k != "vocab"}
        head.load_state_dict(weights, strict=False)
    w = bundle.model.lm_head.weight[vocab.to(bundle.device)].detach()
    embed = bundle.model.model.embed_tokens
    rng = random.Random(args.seed)
    spans = windows(states, prep.train_docs, args.window)
    rng.shuffle(spans)
    batches = [spans[i : i + args.batch_size] for i in range(0, len(spans), args.batch_size)]
    held = {
        source: windows(states, [d for d in prep.held_docs if states.sources[d] == source], 10**9)
        for source in sorted(set(states.sources))
    }
    train_tokens = sum(b - a - 1 for a, b in spans)

    def step_loss(batch):
        return losses(w, *run_head(head, embed, states, batch, FEATURE_NOISE), args.cls_weight)

    def evaluate() -> dict[str, float]:
        scores: dict[str, float] = {}
        for source, spans_ in held.items():
            agree = count = 0
            for i in range(0, len(spans_), 8):
                pred, nexts, valid = run_head(head, embed, states, spans_[i : i + 8], 0.0)
                n = int(valid.sum())
                agree += float(losses(w, pred, nexts, valid, 0.0)["top1"]) * n
                count += n
            scores[f"top1_{source}"] = round(agree / max(count, 1), 4)
        return scores

    loop = Loop(
        epochs=args.epochs,
        lr=args.lr,
        warmup=args.warmup,
        max_steps=args.max_steps,
        checkpoint=checkpoint,
        resume=args.resume,
        seed=args.seed,
        desc="eagle",
    )

    def epoch_done(result: dict) -> None:
        if on_epoch:
            on_epoch(head, {**result, "train_tokens": train_tokens})

    result = loop.fit(head, batches, step_loss, evaluate, on_epoch=epoch_done)
    return head, {**result, "train_tokens": train_tokens}


def train(prep: Prepared, args: argparse.Namespace, out: Path, argv: list[str]) -> dict:
    def write(head: EagleHead, result: dict) -> None:
        fields = {
            "vocab": len(head.vocab),
            "held_out_top1": result["held_out"],
            "train_tokens": result["train_tokens"],
            "train_minutes": result["minutes"],
            "build_minutes": round(prep.seconds / 60, 1),
            "epochs": args.epochs,
            "steps": result["steps"],
            "lr": args.lr,
            "cls_weight": args.cls_weight,
            "init": str(args.init) if args.init else None,
        }
        save_artifact(head, out, card(prep, "eagle", argv, **fields))

    head, result = fit_head(prep, args, checkpoint_path(out), on_epoch=write)
    write(head, result)
    return card(prep, "eagle", argv, held_out_top1=result["held_out"])


def run(args: argparse.Namespace, argv: list[str]) -> dict:
    prep = prepare(args)
    out = args.out or head_path(prep.bundle.model_id)
    train(prep, args, out, argv)
    import json

    return json.loads(out.with_suffix(".json").read_text())
