"""Train the early-exit adapters (`exits`) that `calm` and `hash_ee` exit through.

    python -m decoders.train exits --model embedded --layers 6,9,12,15,18,21,24,27 --rank 128

Self-distillation on the frozen target (CALM trains its model for early exit; here the base stays
frozen and only the exits learn): at each exit layer ℓ, a low-rank residual adapter in front of the
target's own final norm and LM head (draft-vocabulary rows) is trained with the soft cross-entropy
to the final layer's distribution; each exit's early-exit classifier learns, by binary
cross-entropy on the adapted features (detached: it must not bend the adapter), whether the
exit's top-1 is the final layer's. The target's greedy-prediction counts over the training
documents ship in the same file: HASH EE's token frequencies.

The card reports every exit's held-out top-1 agreement with the final layer, before training (the
untrained exit is the logit lens: the final norm and LM head on h_ℓ) and after, per corpus source,
how well the confidences are calibrated (the share of tokens above a threshold, and how many of
those the exit gets right), and CALM's oracle: the share of the layers a token would run if it
left at the first exit that agrees with the final layer (no confidence measure does better).

`--placeholder` writes untrained exits instead (the tiny-random test model has no corpus worth
training on; decoding that never exits does not depend on them).
"""

from __future__ import annotations

import argparse
import random

import torch
import torch.nn.functional as F

from decoders.train.corpus import add_arguments as add_corpus_arguments
from decoders.train.loop import add_loop_arguments, fit_artifact
from decoders.train.states import States, draft_vocabulary, prediction_counts, prepare, windows
from decoders.trained.artifacts import save_artifact
from decoders.trained.exits import ExitAdapters, adapters_path

CALIBRATION = (0.9, 0.99)  # thresholds the card reports coverage and precision at


def add_arguments(ap: argparse.ArgumentParser) -> None:
    add_corpus_arguments(ap)
    add_loop_arguments(ap, epochs=1, lr=2e-3, batch_size=8)
    g = ap.add_argument_group("exits")
    g.add_argument("--layers", default="", help="exit layers ℓ (default: every 3rd from L/5)")
    g.add_argument("--rank", type=int, default=128, help="rank of each exit's adapter")
    g.add_argument("--vocab", type=int, default=8192, help="draft vocabulary size")
    g.add_argument("--window", type=int, default=256)
    g.add_argument(
        "--placeholder", action="store_true", help="write untrained exits (test models only)"
    )


def default_layers(n_layers: int) -> list[int]:
    return list(range(max(1, n_layers // 5), n_layers, 3))


def parse_layers(text: str, n_layers: int) -> list[int]:
    layers = [int(x) for x in text.split(",") if x.strip()] if text else default_layers(n_layers)
    bad = [ell for ell in layers if not 1 <= ell < n_layers]
    if bad or not layers:
        raise SystemExit(f"error: --layers {bad or text!r}: each ℓ must be in 1..{n_layers - 1}")
    return sorted(set(layers))


def batch(states: States, layers: list[int], spans) -> tuple[list[torch.Tensor], torch.Tensor]:
    """The batch's states at each exit layer, [n, d] each, and the final features [n, d]."""
    index = torch.cat([torch.arange(a, b) for a, b in spans])
    return [states.layers[ell][index].float() for ell in layers], states.features[index].float()


def losses(exits: ExitAdapters, norm, w: torch.Tensor, hs, final) -> dict[str, torch.Tensor]:
    dev = w.device
    with torch.no_grad():
        target = torch.softmax(final.to(dev) @ w.T, -1)
        best = target.argmax(-1)
    total = ce_sum = torch.zeros((), device=dev)
    out: dict[str, torch.Tensor] = {}
    for i, h in enumerate(hs):
        feats = exits.features(i, h.to(dev), norm)
        logits = feats @ w.T
        ce = -(target * torch.log_softmax(logits, -1)).sum(-1).mean()
        right = (logits.argmax(-1) == best).float()
        bce = F.binary_cross_entropy_with_logits(exits.confidence_logit(i, feats.detach()), right)
        total = total + ce + bce
        ce_sum = ce_sum + ce.detach()
        out[f"top1_l{exits.exit_layers[i]}"] = right.mean()
    return {"loss": total / len(hs), "ce": ce_sum / len(hs), **out}


@torch.no_grad()
def evaluate(exits: ExitAdapters, norm, w, states: States, docs: list[int]) -> dict:
    """Held-out scores per exit: top-1 agreement with the final layer per source, and calibration
    (coverage and precision of softmax gap > λ and classifier > λ for λ in CALIBRATION)."""
    sources = sorted({states.sources[d] for d in docs})
    scores: dict = {}
    for i, ell in enumerate(exits.exit_layers):
        agree = {s: [0, 0] for s in sources}
        cal = {f"{kind}>{lam}": [0, 0] for kind in ("softmax", "classifier") for lam in CALIBRATION}
        for d in docs:
            a, b = states.span(d)
            h, final = states.layers[ell][a:b].float(), states.features[a:b].float()
            feats = exits.features(i, h.to(w.device), norm)
            probs = torch.softmax(feats @ w.T, -1)
            right = probs.argmax(-1) == (final.to(w.device) @ w.T).argmax(-1)
            agree[states.sources[d]][0] += int(right.sum())
            agree[states.sources[d]][1] += len(right)
            top2 = probs.topk(2, -1).values
            gap = top2[:, 0] - top2[:, 1]
            clf = torch.sigmoid(exits.confidence_logit(i, feats))
            for lam in CALIBRATION:
                for kind, c in (("softmax", gap), ("classifier", clf)):
                    sure = c > lam
                    cal[f"{kind}>{lam}"][0] += int(sure.sum())
                    cal[f"{kind}>{lam}"][1] += int((sure & right).sum())
        n = sum(v[1] for v in agree.values())
        scores[f"l{ell}"] = {
            "top1": round(sum(v[0] for v in agree.values()) / max(n, 1), 4),
            **{f"top1_{s}": round(v[0] / max(v[1], 1), 4) for s, v in agree.items()},
            **{
                k: {"coverage": round(v[0] / max(n, 1), 4), "precision": round(v[1] / v[0], 4)}
                for k, v in cal.items()
                if v[0]
            },
        }
    return scores


@torch.no_grad()
def oracle_depth(exits: ExitAdapters, norm, w, head, states: States, docs: list[int], n_layers):
    """CALM's oracle on held-out positions: each leaves at the first exit whose top-1 (over the
    draft vocabulary, rows `w`) is the final layer's (over the full LM head `head`), else runs all
    L layers. The fewest layers (share of the depth) any confidence measure could run on these
    exits at full agreement, teacher-forced, overall and per source."""
    depth: dict[str, list[float]] = {}
    for d in docs:
        a, b = states.span(d)
        final = (states.features[a:b].float().to(w.device) @ head.T).argmax(-1)  # token ids
        left = torch.full_like(final, n_layers)
        for i, ell in enumerate(exits.exit_layers):  # shallowest first
            h = states.layers[ell][a:b].float().to(w.device)
            top = exits.vocab.to(w.device)[(exits.features(i, h, norm) @ w.T).argmax(-1)]
            left = torch.where((left == n_layers) & (top == final), ell, left)
        depth.setdefault(states.sources[d], []).extend((left / n_layers).tolist())
    every = [x for v in depth.values() for x in v]
    return {
        "layers": round(sum(every) / max(len(every), 1), 4),
        **{f"layers_{s}": round(sum(v) / len(v), 4) for s, v in sorted(depth.items())},
    }


def run(args: argparse.Namespace, argv: list[str]) -> dict:
    if args.placeholder:
        return placeholder(args, argv)
    from decoders.core.models import load_model

    n_layers = load_model(args.model, device=args.device).n_layers
    layers = parse_layers(args.layers, n_layers)
    prep = prepare(args, tuple(layers), probe=False)  # exits are scored against the last layer
    bundle, states = prep.bundle, prep.states
    counts = prediction_counts(bundle, states)
    vocab = draft_vocabulary(bundle, states, args.vocab, counts)
    torch.manual_seed(args.seed)
    exits = ExitAdapters.fresh(bundle, layers, args.rank, vocab, counts)
    norm = bundle.model.model.norm
    w = bundle.model.lm_head.weight[vocab.to(bundle.device)].detach()
    spans = windows(states, prep.train_docs, args.window)
    random.Random(args.seed).shuffle(spans)
    batches = [spans[i : i + args.batch_size] for i in range(0, len(spans), args.batch_size)]
    before = evaluate(exits, norm, w, states, prep.held_docs)  # the logit lens

    def held_out() -> dict:
        return {
            "top1": {
                k: v["top1"] for k, v in evaluate(exits, norm, w, states, prep.held_docs).items()
            }
        }

    result = fit_artifact(
        exits,
        batches,
        lambda b: losses(exits, norm, w, *batch(states, layers, b)),
        held_out,
        args=args,
        prep=prep,
        name="exits",
        argv=argv,
        out=args.out or adapters_path(bundle.model_id),
        fields=lambda result: {
            "exit_layers": layers,
            "rank": args.rank,
            "vocab": len(vocab),
            "train_tokens": sum(b - a for a, b in spans),
            "held_out_before": before,
            "held_out": evaluate(exits, norm, w, states, prep.held_docs),
            "held_out_oracle": oracle_depth(
                exits, norm, w, bundle.model.lm_head.weight, states, prep.held_docs, n_layers
            ),
        },
        desc="exits",
    )
    return {"layers": layers, "minutes": result["minutes"], "held_out": result["held_out"]}


def placeholder(args: argparse.Namespace, argv: list[str]) -> dict:
    """Untrained exits for a test model: the logit lens plus a small random adapter (seeded),
    counts from a Zipf law over token ids (HASH EE needs some frequencies to hash)."""
    from decoders.core.models import load_model

    bundle = load_model(args.model, device="cpu", dtype="float32")
    layers = parse_layers(args.layers, bundle.n_layers)
    vocab_size = bundle.model.config.vocab_size
    counts = (1000.0 / torch.arange(1, vocab_size + 1)).floor().long()
    torch.manual_seed(args.seed)
    exits = ExitAdapters.fresh(bundle, layers, args.rank, torch.arange(vocab_size), counts)
    for up in exits.up:
        torch.nn.init.normal_(up.weight, std=0.02)
    card = {
        "model": bundle.model_id,
        "artifact": "exits",
        "command": "python -m decoders.train " + " ".join(argv),
        "exit_layers": layers,
        "rank": args.rank,
        "untrained": "placeholder exits for tests on the random tiny model: the logit lens plus a "
        "seeded random adapter, token counts from a Zipf law over token ids",
    }
    save_artifact(exits, args.out or adapters_path(bundle.model_id), card)
    return card
