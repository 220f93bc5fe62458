"""Train the block drafter (`block_draft`, decoders/trained/block.py).

    python -m decoders.train block --model embedded --init assets/eagle/<model>.safetensors

A block objective, one step of masked-position prediction: in a span of the corpus every context
entry e_j = (t_{j+1}, the target's fused states at j) is fed as drafting feeds it, causally, and
learns the token the target predicts at j + 1 (the block's position 0: an EAGLE head's first
draft step); at `--anchors` positions c of the span the k - 1 masks are laid after entry c, at
positions c + 1 .., attending to the entries up to c and to each other, and mask i learns the
token the target predicts at c + 1 + i. One masked pass over [entries ; every anchor's masks]
trains every anchor at once (`block_mask`), exactly as the drafter attends when it drafts. The
labels are the target's own greedy choices (over the draft vocabulary, from its final features:
what greedy verification accepts), position i's loss weighted `--decay`^i (DFlash weighs the
early positions of a block up: a miss there cuts everything after it).

Every entry is built from the target's real features, at training and at drafting alike, so no
training-time unrolling is needed. `--init` starts from an EAGLE head (its fc and layer; the
fusion starts as the identity on the final features, the masks fresh) or a block head.
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

import torch
import torch.nn.functional as F

from decoders.train.corpus import add_arguments as add_corpus_arguments
from decoders.train.loop import add_loop_arguments, fit_artifact
from decoders.train.states import Prepared, States, draft_vocabulary, prepare, windows
from decoders.trained.block import BlockHead, block_path


def add_arguments(ap: argparse.ArgumentParser) -> None:
    add_corpus_arguments(ap)
    add_loop_arguments(ap, epochs=3, lr=5e-4, batch_size=8)
    g = ap.add_argument_group("block")
    g.add_argument("--vocab", type=int, default=8192, help="draft vocabulary size")
    g.add_argument("--window", type=int, default=256, help="positions per training span")
    g.add_argument("--block", type=int, default=8, help="positions one forward fills (x + masks)")
    g.add_argument(
        "--fuse",
        type=lambda text: tuple(int(x) for x in text.split(",") if x.strip()),
        default=(2, 15),
        help="the target layers (states after ℓ layers) read beside its final features: a low "
        "and a middle one",
    )
    g.add_argument("--anchors", type=int, default=32, help="blocks laid per span")
    g.add_argument("--decay", type=float, default=0.8, help="position i's loss weighted decay^i")
    g.add_argument(
        "--medusa",
        default=None,
        help="start mask i's residual block from Medusa head i's (a file, or git:REV:PATH; heads "
        "past the file's last take its last): head i reads the features where the target chose "
        "a token and guesses the token i after the next, as mask i does after x's entry",
    )


def anchor_mask(width: int, anchors: list[int], masks: int) -> torch.Tensor:
    """[N, N] bool, N = width + len(anchors) * masks: the entries causal; anchor c's masks see
    the entries up to c and each other (the drafter's `block_mask`, for every anchor at once)."""
    n = width + len(anchors) * masks
    allowed = torch.zeros(n, n, dtype=torch.bool)
    allowed[:width, :width] = torch.ones(width, width, dtype=torch.bool).tril()
    for m, c in enumerate(anchors):
        rows = slice(width + m * masks, width + (m + 1) * masks)
        allowed[rows, : c + 1] = True
        allowed[rows, rows] = True
    return allowed


def greedy_labels(w: torch.Tensor, states: States, chunk: int = 4096) -> torch.Tensor:
    """[N]: the target's greedy choice (as an index into the draft vocabulary `w`'s rows) after
    every position, from its final features."""
    out = torch.empty(len(states.features), dtype=torch.long)
    with torch.no_grad():
        for i in range(0, len(states.features), chunk):
            rows = states.features[i : i + chunk].to(w.device, w.dtype)
            out[i : i + chunk] = (rows @ w.T).argmax(-1).cpu()
    return out


def run_block(
    head: BlockHead,
    embed,
    states: States,
    labels: torch.Tensor,
    spans: list[tuple[int, int]],
    anchors: list[int],
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The masked pass over a batch of spans: returns the outputs [b, N, d], the labels [b, N]
    (-1: not scored) and each row's block position [N] (entries 0, mask i: i)."""
    k = head.block - 1
    width = max(b - a for a, b in spans) - 1
    anchors = [c for c in anchors if c < width]
    layers = [states.layers[ell] for ell in head.fused_layers] + [states.features]
    wide = sum(t.shape[1] for t in layers)
    dev = next(head.parameters()).device
    feats = torch.zeros(len(spans), width, wide)
    ids = torch.zeros(len(spans), width, dtype=torch.long)
    target = torch.full((len(spans), width + len(anchors) * k), -1, dtype=torch.long)
    for r, (a, b) in enumerate(spans):
        n = b - a - 1  # entries j = 0..n-1: token a+j+1, features a+j; label at a+j+1
        feats[r, :n] = torch.cat([t[a : b - 1] for t in layers], -1).float()
        ids[r, :n] = states.tokens[a + 1 : b]
        scored = states.scored_at(a + 1, b)
        lab = torch.where(scored, labels[a + 1 : b], torch.full_like(labels[a + 1 : b], -1))
        target[r, :n] = lab
        for m, c in enumerate(anchors):
            for i in range(1, k + 1):
                if c + i < n:
                    target[r, width + m * k + i - 1] = lab[c + i]
    feats, ids, target = feats.to(dev), ids.to(dev), target.to(dev)
    with torch.no_grad():
        embeds = embed(ids)
    entries = head.entries(embeds, feats)
    at = torch.tensor(anchors, device=dev)
    masks = head.mask_inputs(entries[:, at, None]).flatten(1, 2)  # anchor by anchor
    h = torch.cat([entries, masks], 1)
    offsets = torch.arange(1, k + 1).repeat(len(anchors))
    pos = torch.cat([torch.arange(width), torch.tensor(anchors).repeat_interleave(k) + offsets])
    allowed = anchor_mask(width, anchors, k).to(dev)
    mask = torch.zeros(allowed.shape, device=dev).masked_fill(~allowed, float("-inf"))
    out = head.run(h, pos.to(dev).expand(len(spans), -1), mask[None, None])
    if anchors:  # each anchor's block: x's entry and its masks, through the masks' own blocks
        rows = torch.cat([out[:, at, None], out[:, width:].unflatten(1, (len(anchors), k))], 2)
        out = torch.cat([out[:, :width], head.outputs(rows)[:, :, 1:].flatten(1, 2)], 1)
    position = torch.cat([torch.zeros(width, dtype=torch.long), offsets]).to(dev)
    return out, target, position


def block_losses(
    w: torch.Tensor,
    out: torch.Tensor,
    target: torch.Tensor,
    position: torch.Tensor,
    block: int,
    decay: float,
) -> dict[str, torch.Tensor]:
    """Cross-entropy to the target's greedy choices, block position i's rows weighted decay^i;
    `top1_p{i}`: the agreement at block position i."""
    valid = target >= 0
    logits = out[valid] @ w.T
    pos = position.expand_as(target)[valid]
    weight = decay ** pos.float()
    ce = F.cross_entropy(logits.float(), target[valid], reduction="none")
    result = {"loss": (ce * weight).sum() / weight.sum().clamp_min(1e-9)}
    hit = (logits.argmax(-1) == target[valid]).float()
    for i in range(block):
        at = pos == i
        result[f"top1_p{i}"] = hit[at].mean() if at.any() else ce.sum() * 0
    return result


def from_medusa(head: BlockHead, spec: str) -> None:
    """Mask i's residual block <- Medusa head i's first block (heads.{i}.0.linear)."""
    from decoders.train.loop import init_weights

    state = init_weights(spec)
    n = 1 + max(int(key.split(".")[1]) for key in state if key.startswith("heads."))
    with torch.no_grad():
        for i, block in enumerate(head.ahead):
            j = min(i, n - 1)
            block.linear.weight.copy_(state[f"heads.{j}.0.linear.weight"])
            block.linear.bias.copy_(state[f"heads.{j}.0.linear.bias"])


def fit(prep: Prepared, args: argparse.Namespace, out: Path, argv: list[str]) -> dict:
    bundle, states = prep.bundle, prep.states
    torch.manual_seed(args.seed)
    vocab = draft_vocabulary(bundle, states, args.vocab)
    head = BlockHead(bundle.model.config, vocab, args.fuse, args.block).to(bundle.device)
    if args.medusa:
        from_medusa(head, args.medusa)
    w = bundle.model.lm_head.weight[vocab.to(bundle.device)].detach()
    embed = bundle.model.model.embed_tokens
    labels = greedy_labels(w, states)
    probe_labels = greedy_labels(w, prep.probe) if prep.probe is not None else None
    rng = random.Random(args.seed)
    spans = windows(states, prep.train_docs, args.window)
    spans = [(a, b) for a, b in spans if states.scored_at(a + 1, b).any()]
    rng.shuffle(spans)
    batches = [spans[i : i + args.batch_size] for i in range(0, len(spans), args.batch_size)]
    train_tokens = sum(int(states.scored_at(a + 1, b).sum()) for a, b in spans)
    stride = max(1, args.window // args.anchors)

    def anchors_for(seed: int) -> list[int]:
        offset = random.Random(seed).randrange(stride)
        return list(range(offset, args.window, stride))[: args.anchors]

    step_no = [0]  # each step lays its blocks at another offset (seeded: a resumed run replays)

    def step_loss(batch):
        step_no[0] += 1
        out_, target, position = run_block(
            head, embed, states, labels, batch, anchors_for(args.seed * 100003 + step_no[0])
        )
        return block_losses(w, out_, target, position, head.block, args.decay)

    held = prep.held_out(args.window)

    def evaluate() -> dict[str, float]:
        scores: dict[str, float] = {}
        head.eval()
        with torch.no_grad():
            for source, (scored_states, spans_) in held.items():
                lab = probe_labels if source == "probe" else labels
                hits = torch.zeros(head.block)
                count = torch.zeros(head.block)
                runs, blocks = 0.0, 0
                for i in range(0, len(spans_), 8):
                    batch = spans_[i : i + 8]
                    anchors = list(range(0, args.window, stride))[: args.anchors]
                    out_, target, position = run_block(
                        head, embed, scored_states, lab, batch, anchors
                    )
                    valid = target >= 0
                    pred = torch.full_like(target, -2)
                    pred[valid] = (out_[valid] @ w.T).argmax(-1)
                    hit = pred == target
                    pos = position.expand_as(target)
                    for p_ in range(head.block):
                        sel = valid & (pos == p_)
                        hits[p_] += float(hit[sel].sum())
                        count[p_] += float(sel.sum())
                    # tokens per block: the entry at each anchor, then its masks, while all agree
                    width = out_.shape[1] - len(anchors) * (head.block - 1)
                    k = head.block - 1
                    for m, c in enumerate(anchors):
                        if c >= width:
                            continue
                        ok = valid[:, c] & valid[:, width + m * k : width + (m + 1) * k].all(-1)
                        chain = torch.cat(
                            [hit[:, c : c + 1], hit[:, width + m * k : width + (m + 1) * k]], 1
                        )
                        run = chain.long().cumprod(-1).sum(-1)
                        runs += float(run[ok].sum())
                        blocks += int(ok.sum())
                for p_ in range(head.block):
                    scores[f"top1_{source}_p{p_}"] = round(
                        float(hits[p_] / count[p_].clamp_min(1)), 4
                    )
                scores[f"accepted_{source}"] = round(runs / max(blocks, 1), 4)
        head.train()
        return scores

    def fields(result: dict) -> dict:
        return {
            "vocab": len(vocab),
            "block": head.block,
            "fuse": list(head.fused_layers),
            "anchors": args.anchors,
            "decay": args.decay,
            "medusa": args.medusa,
            "held_out": result["held_out"],
            "held_out_note": HELD_OUT_NOTE,
            "train_tokens": train_tokens,
        }

    return fit_artifact(
        head,
        batches,
        step_loss,
        evaluate,
        args=args,
        prep=prep,
        name="block",
        argv=argv,
        out=out,
        fields=fields,
        desc="block",
    )


HELD_OUT_NOTE = (
    "top1_<source>_p<i>: block position i's agreement with the target's greedy choice (p0: x's "
    "entry, an EAGLE head's first step; p1..: the masks, filled in the same forward); "
    "accepted_<source>: the mean run of agreements from position 0 over blocks laid every "
    "window/anchors positions (greedy tokens a chain of the whole block would keep per step, "
    "before the target's own); top1_probe*: on the target's greedy answers to the tuning prompts "
    "(outside the corpus), the answers' positions only"
)


def run(args: argparse.Namespace, argv: list[str]) -> dict:
    prep = prepare(args, layers=tuple(args.fuse))
    out = args.out or block_path(prep.bundle.model_id)
    fit(prep, args, out, argv)
    return json.loads(out.with_suffix(".json").read_text())
