"""Train Medusa heads (`medusa`, `blockwise`).

    python -m decoders.train medusa --model embedded --heads 4

Medusa-1 (Cai et al. 2024): the target stays frozen; head k (k = 1..K) reads the final feature at
position t and learns the target's distribution for the token at t + k + 1 — the target's own
prediction at position t + k, over the draft vocabulary (self-distillation; on the corpus's greedy
answers it is the token the target wrote). The heads' losses are weighted λ_k = 0.8^k, as in the
paper, because far heads are less certain and matter less (a draft stops at the first miss).
"""

from __future__ import annotations

import argparse
import json
import random

import torch

from decoders.train.corpus import add_arguments as add_corpus_arguments
from decoders.train.loop import add_loop_arguments, fit_artifact
from decoders.train.states import Prepared, States, draft_vocabulary, prepare, windows
from decoders.trained.medusa_heads import MedusaHeads, heads_path

DECAY = 0.8  # λ_k = 0.8^k


def add_arguments(ap: argparse.ArgumentParser) -> None:
    add_corpus_arguments(ap)
    add_loop_arguments(ap, epochs=3, lr=1e-3, batch_size=8)
    g = ap.add_argument_group("medusa")
    g.add_argument("--heads", type=int, default=4, help="K: tokens guessed beyond the next one")
    g.add_argument("--depth", type=int, default=1, help="residual blocks per head")
    g.add_argument("--vocab", type=int, default=8192, help="draft vocabulary size")
    g.add_argument("--window", type=int, default=256)


def run_heads(heads: MedusaHeads, states: States, spans):
    """Pad a batch of spans: every head's features [b, n, K, d], the target's final features
    [b, n, d], and the valid mask."""
    width = max(b - a for a, b in spans)
    d = states.features.shape[1]
    final = torch.zeros(len(spans), width, d)
    valid = torch.zeros(len(spans), width, dtype=torch.bool)
    for r, (a, b) in enumerate(spans):
        final[r, : b - a] = states.features[a:b].float()
        valid[r, : b - a] = states.scored_at(a, b)
    dev = next(heads.parameters()).device
    final, valid = final.to(dev), valid.to(dev)
    return heads(final), final, valid


def losses(w: torch.Tensor, pred, final, valid, per_head: bool = False) -> dict[str, torch.Tensor]:
    """Head k at position t against the target's distribution at t + k (soft cross-entropy)."""
    out: dict[str, torch.Tensor] = {}
    total = 0.0
    for k in range(1, pred.shape[2] + 1):
        ok = valid[:, :-k] & valid[:, k:]
        if not ok.any():
            continue
        logits = pred[:, :-k, k - 1][ok] @ w.T
        with torch.no_grad():
            target = torch.softmax(final[:, k:][ok] @ w.T, -1)
        ce = -(target * torch.log_softmax(logits, -1)).sum(-1).mean()
        total = total + DECAY**k * ce
        if per_head or k == 1:
            out[f"top1_head{k}"] = (logits.argmax(-1) == target.argmax(-1)).float().mean()
            out[f"n_head{k}"] = torch.tensor(float(ok.sum()))
    out["loss"] = total  # type: ignore[assignment]
    return out


def train(prep: Prepared, args: argparse.Namespace, argv: list[str]) -> dict:
    bundle, states = prep.bundle, prep.states
    torch.manual_seed(args.seed)
    vocab = draft_vocabulary(bundle, states, args.vocab)
    heads = MedusaHeads(bundle.model.config, args.heads, vocab, args.depth).to(bundle.device)
    w = bundle.model.lm_head.weight[vocab.to(bundle.device)].detach()
    spans = windows(states, prep.train_docs, args.window)
    random.Random(args.seed).shuffle(spans)
    batches = [spans[i : i + args.batch_size] for i in range(0, len(spans), args.batch_size)]
    held = prep.held_out(10**9)

    def step_loss(batch):
        out = losses(w, *run_heads(heads, states, batch))
        return {k: v for k, v in out.items() if not k.startswith("n_")}

    def evaluate() -> dict[str, float]:
        scores: dict[str, float] = {}
        for source, (scored_states, spans_) in held.items():
            agree = [0.0] * args.heads
            count = [0.0] * args.heads
            for i in range(0, len(spans_), 8):
                batch = spans_[i : i + 8]
                out = losses(w, *run_heads(heads, scored_states, batch), per_head=True)
                for k in range(1, args.heads + 1):
                    if f"n_head{k}" in out:
                        n = float(out[f"n_head{k}"])
                        agree[k - 1] += float(out[f"top1_head{k}"]) * n
                        count[k - 1] += n
            for k in range(args.heads):
                scores[f"top1_{source}_head{k + 1}"] = round(agree[k] / max(count[k], 1), 4)
        return scores

    out = args.out or heads_path(bundle.model_id)

    fit_artifact(
        heads,
        batches,
        step_loss,
        evaluate,
        args=args,
        prep=prep,
        name="medusa",
        argv=argv,
        out=out,
        fields=lambda result: {
            "heads": args.heads,
            "depth": args.depth,
            "vocab": len(vocab),
            "held_out_top1": result["held_out"],
            "train_tokens": sum(b - a for a, b in spans),
        },
        desc="medusa",
    )
    return json.loads(out.with_suffix(".json").read_text())


def run(args: argparse.Namespace, argv: list[str]) -> dict:
    return train(prepare(args), args, argv)
