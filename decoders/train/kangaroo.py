"""Train Kangaroo's adapters (`kangaroo`), one per exit layer ℓ, and choose ℓ.

    python -m decoders.train kangaroo --model embedded --exit-layers 2,3,4,5,6

Kangaroo (Liu et al. 2024): the adapter (one attention layer + two norms) reads the target's state
after its first ℓ layers and must make the target's LM head reproduce the target's final
distribution. Loss: the soft cross-entropy to that distribution (over the draft vocabulary). The
adapter starts from the target's own layer-ℓ attention and final norm.

The sweep trains every ℓ asked for, scores each on held-out documents (top-1 agreement per
source, and the tokens a draft would commit under the η stop rule, simulated on the held-out
text), then times the real `kangaroo` decoder on prompts that are not benchmark prompts and keeps
the ℓ with the best speedup over autoregressive: `assets/kangaroo/<model>.json` records it.
"""

from __future__ import annotations

import argparse
import json
import random
import time

import torch

from decoders.core.models import slug
from decoders.train.corpus import add_arguments as add_corpus_arguments
from decoders.train.loop import add_loop_arguments, fit_artifact
from decoders.train.states import Prepared, States, draft_vocabulary, prepare, windows
from decoders.trained.artifacts import ASSETS
from decoders.trained.kangaroo import KIND, KangarooAdapter, adapter_path

SEARCH_PROMPTS = ASSETS / "tuning_prompts.jsonl"  # tuning prompts, never benchmark prompts


def add_arguments(ap: argparse.ArgumentParser) -> None:
    add_corpus_arguments(ap)
    add_loop_arguments(ap, epochs=2, lr=1e-3, batch_size=8)
    g = ap.add_argument_group("kangaroo")
    g.add_argument("--exit-layers", default="2,3,4,5,6", help="ℓ values to train (the sweep)")
    g.add_argument("--vocab", type=int, default=8192, help="draft vocabulary size")
    g.add_argument("--window", type=int, default=256)
    g.add_argument("--eta", type=float, default=0.6, help="η for the simulated draft stop rule")
    g.add_argument("--gamma", type=int, default=6, help="γ for the simulated draft stop rule")
    g.add_argument(
        "--choose-prompts", type=int, default=4, help="search prompts timed per ℓ (0: skip)"
    )
    g.add_argument("--choose-tokens", type=int, default=96)


def run_adapter(adapter: KangarooAdapter, states: States, ell: int, spans):
    """Pad a batch of spans: the adapter's features and the target's final features."""
    width = max(b - a for a, b in spans)
    d = states.features.shape[1]
    hidden = torch.zeros(len(spans), width, d)
    final = torch.zeros(len(spans), width, d)
    valid = torch.zeros(len(spans), width, dtype=torch.bool)
    for r, (a, b) in enumerate(spans):
        hidden[r, : b - a] = states.layers[ell][a:b].float()
        final[r, : b - a] = states.features[a:b].float()
        valid[r, : b - a] = states.scored_at(a, b)
    dev = next(adapter.parameters()).device
    positions = torch.arange(width, device=dev).expand(len(spans), -1)
    return adapter(hidden.to(dev), positions), final.to(dev), valid.to(dev)


def losses(w: torch.Tensor, pred, final, valid) -> dict[str, torch.Tensor]:
    """Soft cross-entropy to the target's distribution over the draft vocabulary."""
    logits = pred[valid] @ w.T
    with torch.no_grad():
        target = torch.softmax(final[valid] @ w.T, -1)
    ce = -(target * torch.log_softmax(logits, -1)).sum(-1).mean()
    top1 = (logits.argmax(-1) == target.argmax(-1)).float().mean()
    return {"loss": ce, "top1": top1}


def simulate_drafts(
    right: list[bool], conf: list[float], eta: float, gamma: int
) -> tuple[int, int]:
    """From every position of one held-out document: (drafted, accepted) tokens summed, drafting
    under Kangaroo's rule (stop after the first token below η, or at γ) and accepting the prefix
    the target agrees with."""
    drafted = accepted = 0
    for i in range(len(right)):
        ok = True
        for j in range(i, min(i + gamma, len(right))):
            drafted += 1
            ok = ok and right[j]
            accepted += ok
            if conf[j] < eta or not ok:
                break
    return drafted, accepted


def train_one(prep: Prepared, args, ell: int, vocab: torch.Tensor, argv: list[str]) -> dict:
    bundle, states = prep.bundle, prep.states
    torch.manual_seed(args.seed)
    adapter = KangarooAdapter.from_target(bundle, ell, vocab)
    w = bundle.model.lm_head.weight[vocab.to(bundle.device)].detach()
    spans = windows(states, prep.train_docs, args.window)
    random.Random(args.seed).shuffle(spans)
    batches = [spans[i : i + args.batch_size] for i in range(0, len(spans), args.batch_size)]
    held = prep.held_out(10**9)  # whole documents

    def evaluate() -> dict[str, float]:
        scores: dict[str, float] = {}
        drafted = accepted = positions = 0
        for source, (scored_states, spans_) in held.items():
            agree = count = 0
            for span in spans_:
                pred, final, valid = run_adapter(adapter, scored_states, ell, [span])
                probs = torch.softmax(pred[valid] @ w.T, -1)
                conf, guess = probs.max(-1)
                right = guess == (final[valid] @ w.T).argmax(-1)
                agree += int(right.sum())
                count += len(right)
                if source == "probe":  # the simulated draft rule runs on the corpus's documents
                    continue
                d, a = simulate_drafts(right.tolist(), conf.tolist(), args.eta, args.gamma)
                drafted, accepted, positions = drafted + d, accepted + a, positions + len(right)
            scores[f"top1_{source}"] = round(agree / max(count, 1), 4)
        scores["drafted_per_step"] = round(drafted / max(positions, 1), 3)
        scores["accepted_per_step"] = round(accepted / max(positions, 1), 3)
        return scores

    out = (
        adapter_path(bundle.model_id, ell)
        if args.out is None
        else args.out.with_stem(f"{args.out.stem}-l{ell}")
    )

    result = fit_artifact(
        adapter,
        batches,
        lambda batch: losses(w, *run_adapter(adapter, states, ell, batch)),
        evaluate,
        args=args,
        prep=prep,
        name="kangaroo",
        argv=argv,
        out=out,
        fields=lambda result: {
            "exit_layer": ell,
            "vocab": len(vocab),
            "held_out": result["held_out"],
            "simulated_with": {"eta": args.eta, "gamma": args.gamma},
            "train_tokens": sum(b - a for a, b in spans),
        },
        desc=f"kangaroo ℓ={ell}",
    )
    return {"exit_layer": ell, **result["held_out"], "train_minutes": result["minutes"]}


def time_exit_layers(
    prep: Prepared, layers: list[int], n_prompts: int, tokens: int
) -> dict[int, float]:
    """Speedup of the real `kangaroo` decoder at each ℓ over autoregressive, on search prompts
    (interleaved, the same prompts for every ℓ)."""
    from decoders import generate

    rows = [json.loads(line) for line in SEARCH_PROMPTS.read_text().splitlines() if line.strip()]
    code = [r for r in rows if not r.get("chat")]
    chat = [r for r in rows if r.get("chat")]
    mixed = [r for pair in zip(code, chat, strict=False) for r in pair]  # code and chat alternate
    prompts = mixed[:n_prompts]
    runs = [("autoregressive", {})] + [("kangaroo", {"exit_layer": ell}) for ell in layers]
    seconds = {i: 0.0 for i in range(len(runs))}
    produced = {i: 0 for i in range(len(runs))}
    for prompt in prompts:
        for i, (method, params) in enumerate(runs):
            t = time.perf_counter()
            res = generate(
                prep.bundle,
                prompt["prompt"],
                method=method,
                max_new_tokens=tokens,
                chat=prompt.get("chat"),
                record=False,
                **params,
            )
            seconds[i] += time.perf_counter() - t
            produced[i] += len(res.token_ids)
    base = produced[0] / seconds[0]
    return {ell: round(produced[i + 1] / seconds[i + 1] / base, 3) for i, ell in enumerate(layers)}


def run(args: argparse.Namespace, argv: list[str]) -> dict:
    prep = prepare(args)
    layers = [int(x) for x in args.exit_layers.split(",") if x.strip()]
    bad = [
        ell
        for ell in layers
        if not 1 <= ell < prep.bundle.n_layers or ell not in prep.states.layers
    ]
    if bad:
        raise SystemExit(
            f"error: --exit-layers {bad}: each ℓ must be in 1..{min(6, prep.bundle.n_layers - 1)}"
        )
    vocab = draft_vocabulary(prep.bundle, prep.states, args.vocab)
    sweep = [train_one(prep, args, ell, vocab, argv) for ell in layers]
    summary = {
        "model": prep.bundle.model_id,
        "command": "python -m decoders.train " + " ".join(argv),
        "sweep": sweep,
    }
    if args.choose_prompts and args.out is None:
        speed = time_exit_layers(prep, layers, args.choose_prompts, args.choose_tokens)
        for row in sweep:
            row["speedup_on_search_prompts"] = speed[row["exit_layer"]]
        summary["chosen"] = max(layers, key=lambda ell: speed[ell])
        summary["chosen_by"] = (
            f"speedup over autoregressive on {args.choose_prompts} search prompts "
            f"(assets/tuning_prompts.jsonl, not benchmark prompts), {args.choose_tokens} new tokens"
        )
        path = ASSETS / KIND / f"{slug(prep.bundle.model_id)}.json"
        path.write_text(json.dumps(summary, indent=2) + "\n")
    return summary
