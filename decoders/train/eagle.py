"""Train the EAGLE draft head (`speculative:draft=eagle`, `token_tree:draft=eagle`).

    python -m decoders.train eagle --model embedded        # corpus + states + training

EAGLE-1 (Li et al. 2024): the head reads the target's final feature f_i with the embedding of the
next token t_{i+1} and predicts f_{i+1}. Loss: smooth-L1 on the predicted feature plus a weight ×
cross-entropy against the target's distribution (over the draft vocabulary), with noise on the
input features so the head tolerates its own imperfect features when it drafts several steps.
`--init` starts from a head's weights (its layer; the draft vocabulary is rebuilt from this corpus):
a file, or `git:REV:PATH` for a head as committed, so a warm start stays reproducible.
`--unroll K` trains the first K draft steps at once, each fed the head's own predicted features
(EAGLE-3's training-time test), so the second and third draft tokens are not guessed from features
the head never saw in training.

EAGLE-3 (Li et al. 2025) is this command with its three changes:

    python -m decoders.train eagle --fuse 2,15 --unroll 7 --step-decay 0.8 --reg-weight 0 \
        --cls-weight 1 --init assets/eagle/<model>.safetensors

`--fuse` reads the target's states after those layers beside its final features (fused by one
linear map, which a warm start from an EAGLE-1 head begins as the identity on the final features),
`--reg-weight 0` drops the feature loss (the head predicts tokens, and is fed its own hidden state
from the second step on), `--unroll 7 --step-decay 0.8` is the training-time test over 7 steps with
step i's loss weighted 0.8^i. `--topk K` adds HASS's distillation term (Zhang et al. 2024): the
token loss over the target's K likeliest tokens alone, beside the full one.

`--official` trains EAGLE-3's head in its authors' architecture instead (eagle.Eagle3Head: three
target layers fused, the embedding and hidden input normalised apart, its own norm and LM head),
with the same loop and losses; such a head can be written in the official layout, which
SafeAILab/EAGLE, SpecForge and vLLM read (`--export-official DIR`, or later
`python -m decoders.trained.published export`). Our own head (fc over [embedding ; feature], a
plain decoder layer) has no exact counterpart in that layout, so it is never exported.

    python -m decoders.train eagle --official --unroll 7 --step-decay 0.8 --reg-weight 0 \
        --cls-weight 1 --export-official out/eagle3-<model>
"""

from __future__ import annotations

import argparse
import random
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F
from transformers import DynamicCache

from decoders.train.corpus import add_arguments as add_corpus_arguments
from decoders.train.loop import Loop, add_loop_arguments, run_fields, warm_start
from decoders.train.states import (
    Prepared,
    States,
    answers_only,
    card,
    checkpoint_path,
    draft_vocabulary,
    prepare,
    windows,
)
from decoders.trained.artifacts import save_artifact
from decoders.trained.eagle import Eagle3Head, EagleHead, head_path, new_eagle3_head

FEATURE_NOISE = 0.2  # std of the Gaussian noise on input features, relative to their RMS
EVAL_DEPTH = 3  # held-out agreement is reported for the first three draft steps (or --unroll)


def add_arguments(ap: argparse.ArgumentParser) -> None:
    add_corpus_arguments(ap)
    add_loop_arguments(ap, epochs=4, lr=1e-3, batch_size=8)
    g = ap.add_argument_group("eagle")
    g.add_argument("--vocab", type=int, default=8192, help="draft vocabulary size")
    g.add_argument("--window", type=int, default=256, help="positions per training span")
    g.add_argument("--cls-weight", type=float, default=0.3, help="weight of the token loss")
    g.add_argument(
        "--unroll",
        type=int,
        default=3,
        help="draft depths trained at once, each fed the head's own features (1: teacher forcing)",
    )
    g.add_argument(
        "--fuse",
        type=lambda text: tuple(int(x) for x in text.split(",") if x.strip()),
        default=(),
        help="EAGLE-3: the target layers (states after ℓ layers) read beside its final features, "
        "e.g. 2,15 (default: none, EAGLE-1's input)",
    )
    g.add_argument(
        "--reg-weight",
        type=float,
        default=1.0,
        help="weight of the feature loss (EAGLE-3: 0, the head predicts tokens only)",
    )
    g.add_argument(
        "--step-decay",
        type=float,
        default=1.0,
        help="draft step i's loss weighted decay^i (EAGLE-3: 0.8; 1: every step alike)",
    )
    g.add_argument(
        "--topk",
        type=int,
        default=0,
        help="HASS: add the token loss over the target's K likeliest tokens alone (0: none)",
    )
    g.add_argument("--noise", type=float, default=FEATURE_NOISE, help="input feature noise")
    g.add_argument(
        "--official",
        action="store_true",
        help="EAGLE-3 in its authors' architecture (needs --reg-weight 0): the layers of --fuse, "
        "three of them (default 2, L // 2, L - 3)",
    )
    g.add_argument(
        "--export-official",
        type=Path,
        default=None,
        metavar="DIR",
        help="with --official: also write the head in the official layout (config.json, "
        "model.safetensors) to DIR",
    )
    g.add_argument(
        "--loss-on",
        choices=("all", "answers"),
        default="all",
        help="positions that train the head: all, or in chat and task documents only the "
        "answers (as the official EAGLE code trains; code documents keep every position)",
    )


def unroll_mask(width: int, depth: int, device) -> torch.Tensor:
    """The attention mask of a training-time test (EAGLE-3's, Li et al. 2025) over `depth` copies
    of a span laid end to end. Copy 1 holds the real entries e_j = (t_{j+1}, f_j); copy k holds
    entry j as the head would see it at its k-th draft step, fed the feature it predicted itself
    one step earlier. When drafting, that entry attends to the real entries before the draft
    began (i ≤ j - k + 1), to the predicted entries of this draft (copy m at j - (k - m)), and to
    itself: exactly what this mask allows, so one pass trains every draft depth at once."""
    j = torch.arange(width, device=device)
    q_depth = torch.arange(1, depth + 1, device=device).repeat_interleave(width)
    q_pos = j.repeat(depth)
    k_depth, k_pos = q_depth, q_pos
    real = (k_depth[None, :] == 1) & (k_pos[None, :] <= q_pos[:, None] - q_depth[:, None] + 1)
    drafted = (
        (k_depth[None, :] >= 2)
        & (k_depth[None, :] <= q_depth[:, None])
        & (k_pos[None, :] == q_pos[:, None] - (q_depth[:, None] - k_depth[None, :]))
    )
    allowed = real | drafted | torch.eye(depth * width, dtype=torch.bool, device=device)
    return allowed


def run_head(head: EagleHead, embed, states: States, spans, noise: float, depth: int = 1):
    """Pad a batch of spans and run the head `depth` draft steps deep (1: teacher-forced, the
    real feature at every position). Returns predicted features [b, depth, width, d], the
    target's next features [b, width, d] and the valid positions [b, depth, width]: the k-th
    step needs k - 1 earlier positions of the span to have drafted from.

    Step k's entries attend to the real entries and to the steps before theirs (`unroll_mask`):
    each step runs once, its keys and values kept in a cache the next step reads, so training
    7 steps costs 7 passes, not 28."""
    width = max(b - a for a, b in spans) - 1
    layers = [states.layers[ell] for ell in head.fused_layers] + [states.features]
    wide = sum(t.shape[1] for t in layers)
    d = states.features.shape[1]
    feats = torch.zeros(len(spans), width, wide)
    nexts = torch.zeros(len(spans), width, d)
    ids = torch.zeros(len(spans), width, dtype=torch.long)
    valid = torch.zeros(len(spans), width, dtype=torch.bool)
    for r, (a, b) in enumerate(spans):
        n = b - a - 1
        feats[r, :n] = torch.cat([t[a : b - 1] for t in layers], -1).float()
        nexts[r, :n] = states.features[a + 1 : b].float()
        ids[r, :n] = states.tokens[a + 1 : b]
        valid[r, :n] = states.scored_at(a + 1, b)  # entry j predicts the feature at j + 1
    dev = next(head.parameters()).device
    feats, nexts, ids, valid = feats.to(dev), nexts.to(dev), ids.to(dev), valid.to(dev)
    feats = head.fused(feats)
    if noise:
        feats = feats + torch.randn_like(feats) * noise * feats.detach().pow(2).mean().sqrt()
    with torch.no_grad():
        embeds = embed(ids)
    positions = torch.arange(width, device=dev).expand(len(spans), -1)
    # Padding sits after each span's real positions: no valid position ever attends to it.
    if depth == 1:
        preds = [head(embeds, feats, positions)]  # causal
    else:
        allowed = unroll_mask(width, depth, dev)
        mask = torch.zeros(allowed.shape, device=dev).masked_fill(~allowed, float("-inf"))
        cache = DynamicCache()
        preds = [head(embeds, feats, positions, mask[:width, :width].view(1, 1, width, -1), cache)]
        for k in range(2, depth + 1):
            # Step k's entry j reads what step k-1 predicted at j - 1 (the step before).
            fed = F.pad(preds[-1][:, :-1], (0, 0, 1, 0))
            rows = mask[(k - 1) * width : k * width, : k * width]
            preds.append(head(embeds, fed, positions, rows.view(1, 1, width, -1), cache))
    pred = torch.stack(preds, 1)
    steps = torch.arange(depth, device=dev).view(1, depth, 1)
    valid = valid[:, None, :] & (torch.arange(width, device=dev).view(1, 1, -1) >= steps)
    return pred, nexts, valid


def losses(
    w: torch.Tensor,
    pred,
    nexts,
    valid,
    cls_weight: float,
    reg_weight: float = 1.0,
    step_decay: float = 1.0,
    topk: int = 0,
    scores: Callable[[torch.Tensor], torch.Tensor] | None = None,
) -> dict[str, torch.Tensor]:
    """`w`: the target's LM head cut to the draft vocabulary. Draft step k's positions weigh
    `step_decay`^k (1: every depth alike); `top1` is the first step's (teacher-forced)
    agreement, `top1_d{k}` the k-th step's. `topk` > 0 adds the token loss over the target's
    `topk` likeliest tokens alone (HASS). `scores`: the head's own logits of its outputs (an
    official-architecture head: its norm and LM head, columns in `w`'s order), else `@ w.T`."""
    depth = pred.shape[1]
    nexts = nexts[:, None].expand(-1, depth, -1, -1)
    which = torch.arange(depth, device=pred.device).view(1, -1, 1).expand_as(valid)[valid]
    weight = step_decay ** which.float()
    weight = weight / weight.sum().clamp_min(1e-9)
    reg = (F.smooth_l1_loss(pred[valid], nexts[valid], reduction="none").mean(-1) * weight).sum()
    with torch.no_grad():
        target = torch.softmax(nexts[valid] @ w.T, -1)
    logp = torch.log_softmax(scores(pred[valid]) if scores else pred[valid] @ w.T, -1)
    cls = (-(target * logp).sum(-1) * weight).sum()
    if topk:  # HASS: the target's K likeliest tokens once more, on their own
        cut = target.topk(min(topk, target.shape[-1]), -1)
        cls = cls + (-(cut.values * logp.gather(-1, cut.indices)).sum(-1) * weight).sum()
    hit = (logp.argmax(-1) == target.argmax(-1)).float()
    out = {"loss": reg_weight * reg + cls_weight * cls, "reg": reg, "cls": cls}
    for k in range(depth):
        at = which == k  # a depth with no valid position (a short batch) scores 0, not NaN
        out["top1" if k == 0 else f"top1_d{k + 1}"] = hit[at].mean() if at.any() else hit.sum() * 0
    return out


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
    official = getattr(args, "official", False)
    if official:
        if getattr(args, "reg_weight", 1.0):
            raise SystemExit("--official trains tokens only (EAGLE-3): add --reg-weight 0")
        head: EagleHead | Eagle3Head = new_eagle3_head(bundle, vocab, official_layers(bundle, args))
        vocab = head.token_ids  # in increasing order, as the official layout keeps it
    else:
        head = EagleHead(bundle.model.config, vocab, getattr(args, "fuse", ()))
    head = head.to(bundle.device)
    warm_start(head, args.init)
    w = bundle.model.lm_head.weight[vocab.to(bundle.device)].detach()
    head_scores = head.scores if official else None
    embed = bundle.model.model.embed_tokens
    rng = random.Random(args.seed)
    if getattr(args, "loss_on", "all") == "answers":
        states = answers_only(bundle, states)
    spans = windows(states, prep.train_docs, args.window)
    spans = [(a, b) for a, b in spans if states.scored_at(a + 1, b).any()]
    rng.shuffle(spans)
    batches = [spans[i : i + args.batch_size] for i in range(0, len(spans), args.batch_size)]
    held = prep.held_out(10**9)
    train_tokens = sum(int(states.scored_at(a + 1, b).sum()) for a, b in spans)

    unroll = getattr(args, "unroll", 1)
    eval_depth = max(EVAL_DEPTH, unroll)
    weights = {
        "reg_weight": getattr(args, "reg_weight", 1.0),
        "step_decay": getattr(args, "step_decay", 1.0),
        "topk": getattr(args, "topk", 0),
    }

    def step_loss(batch):
        out = run_head(head, embed, states, batch, getattr(args, "noise", FEATURE_NOISE), unroll)
        return losses(w, *out, args.cls_weight, **weights, scores=head_scores)

    def evaluate() -> dict[str, float]:
        scores: dict[str, float] = {}
        for source, (scored_states, spans_) in held.items():
            agree: dict[str, float] = {}
            count: dict[str, int] = {}
            for i in range(0, len(spans_), 8):
                pred, nexts, valid = run_head(
                    head, embed, scored_states, spans_[i : i + 8], 0.0, eval_depth
                )
                out = losses(w, pred, nexts, valid, 0.0, scores=head_scores)
                for k in range(eval_depth):
                    key = "top1" if k == 0 else f"top1_d{k + 1}"
                    n = int(valid[:, k].sum())
                    agree[key] = agree.get(key, 0.0) + float(out[key]) * n
                    count[key] = count.get(key, 0) + n
            for key in agree:
                name = key.replace("top1", f"top1_{source}", 1)
                scores[name] = round(agree[key] / max(count[key], 1), 4)
        return scores

    loop = Loop(
        epochs=args.epochs,
        lr=args.lr,
        warmup=args.warmup,
        max_steps=args.max_steps,
        minutes=args.minutes,
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


HELD_OUT_NOTE = (
    "top1_<source>: draft step 1, fed the target's own features (teacher-forced); "
    "top1_<source>_d2/_d3/...: draft steps 2, 3 and on, each fed the head's own predicted "
    "features (an EAGLE-3 head: its own hidden state) as when drafting (measured to depth 3, or "
    "to --unroll's depth when deeper); the held-out windows include the "
    "chat template's tokens, which are easy to predict; top1_probe*: on the target's greedy "
    "answers to the tuning prompts (outside the corpus), the answers' positions only"
)


def official_layers(bundle, args: argparse.Namespace) -> tuple[int, ...]:
    """`--official`'s layers: `--fuse` (three), else EAGLE-3's 2, L // 2, L - 3."""
    from decoders.core.errors import InvalidParameter
    from decoders.trained.published import default_layers

    fuse = tuple(getattr(args, "fuse", ()))
    if not fuse:
        try:
            return default_layers(bundle.n_layers, "--official")
        except InvalidParameter as exc:
            raise SystemExit(f"{exc}; here: --fuse with three layers") from None
    increasing = fuse == tuple(sorted(set(fuse)))
    if len(fuse) != 3 or not increasing or fuse[0] < 1 or fuse[-1] >= bundle.n_layers:
        raise SystemExit(
            f"--official --fuse {','.join(map(str, fuse))}: three increasing layers in "
            f"1..{bundle.n_layers - 1} (the official head fuses three)"
        )
    return fuse


def train(prep: Prepared, args: argparse.Namespace, out: Path, argv: list[str]) -> dict:
    def write(head: EagleHead, result: dict) -> None:
        fields = {
            "vocab": len(head.vocab),
            "held_out_top1": result["held_out"],
            "held_out_note": HELD_OUT_NOTE,
            "train_tokens": result["train_tokens"],
            "cls_weight": args.cls_weight,
            "loss_on": getattr(args, "loss_on", "all"),
            "fuse": list(head.fused_layers),
            "unroll": getattr(args, "unroll", 1),
            "reg_weight": getattr(args, "reg_weight", 1.0),
            "step_decay": getattr(args, "step_decay", 1.0),
            "topk": getattr(args, "topk", 0),
            "noise": getattr(args, "noise", FEATURE_NOISE),
            "architecture": "official eagle-3" if isinstance(head, Eagle3Head) else "ours",
            **run_fields(args, prep, result),
        }
        save_artifact(head, out, card(prep, "eagle", argv, **fields))

    export = getattr(args, "export_official", None)
    if export and not getattr(args, "official", False):
        raise SystemExit("--export-official: only a head trained with --official has that layout")
    head, result = fit_head(prep, args, checkpoint_path(out), on_epoch=write)
    write(head, result)
    if export:
        from decoders.trained.published import export_eagle3

        export_eagle3(head, prep.bundle, export)
    return card(prep, "eagle", argv, held_out_top1=result["held_out"])


def run(args: argparse.Namespace, argv: list[str]) -> dict:
    layers = tuple(args.fuse) or None
    if args.official:  # the layers must be known before the target's states are computed
        from decoders.core.models import load_model

        layers = official_layers(load_model(args.model, device=args.device, dtype="float32"), args)
    prep = prepare(args, layers=layers)
    out = args.out or head_path(prep.bundle.model_id)
    train(prep, args, out, argv)
    import json

    return json.loads(out.with_suffix(".json").read_text())
