"""LayerSkip tuning (Elhoushi et al. 2024): the embedded model itself learns to be read early, and
ships as a low-rank delta that makes `SmolLM2-135M-Instruct-exit-tuned` (decoders/trained/exit_tuned.py).

    python -m decoders.train layerskip --model embedded --minutes 4 --device cuda

Each step, on windows of the self-generated corpus (decoders/train/corpus.py):
- layer dropout: token t skips layer l's residual update with probability
  p_l = p_max · (exp(l · ln 2 / (L − 1)) − 1) (0 at the first layer, p_max at the last), drawn per
  token: the layers above still read keys and values the skipping token wrote from its input,
  which is what an early exit's state propagation gives them;
- early-exit loss: the states after the exits of this step's rotation (every C-th layer, shifted
  by one each step: the rotational curriculum) and after the `--focus` layers (every step) go
  through the shared final norm and LM head; exit ℓ's loss weighs ℓ / L (deeper exits count
  more), and all exits together weigh `--e-scale` beside the last layer's;
- the targets are the original model's next-token distributions at each position (soft
  cross-entropy; LayerSkip takes the corpus's tokens): the last layer is pulled back to the
  original, which keeps the tuned model near it, and every exit learns what the original says.
Trainable: a LoRA update on every linear of every decoder layer and the layers' norms; the
embeddings, the final norm and the LM head (the exit head every layer shares) stay frozen.

The card states the tuned model's own quality against the original: perplexity of held-out text
under both, top-1 agreement of their next tokens, and greedy outputs on the tuning prompts
compared token by token (assets/tuning_prompts.jsonl; never benchmark prompts).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import random
from collections.abc import Callable
from functools import partial
from pathlib import Path

import torch
from torch import nn
from transformers.masking_utils import create_causal_mask

from decoders.core.models import ModelBundle
from decoders.core.runtime import cache_arg
from decoders.train.corpus import add_arguments as add_corpus_arguments
from decoders.train.loop import Loop, add_loop_arguments, init_weights, run_fields
from decoders.train.states import Prepared, States, card, checkpoint_path, draft_vocabulary, prepare
from decoders.trained import exit_tuned

Window = tuple[int, int]  # a span of positions in the states, [start, end)


def add_arguments(ap: argparse.ArgumentParser) -> None:
    add_corpus_arguments(ap)
    add_loop_arguments(ap, epochs=2, lr=1e-3, batch_size=4)
    g = ap.add_argument_group("layerskip")
    g.add_argument("--rank", type=int, default=16, help="LoRA rank of every linear's update")
    g.add_argument("--alpha", type=float, default=32.0, help="LoRA alpha (scale = alpha / rank)")
    g.add_argument("--p-max", type=float, default=0.1, help="layer dropout at the last layer")
    g.add_argument(
        "--e-scale", type=float, default=1.0, help="weight of all exit losses beside the last's"
    )
    g.add_argument(
        "--rotation",
        type=int,
        default=4,
        help="C: each step trains the exits at every C-th layer, shifted by one each step",
    )
    g.add_argument(
        "--focus",
        default="6,8,10",
        help="exits trained every step (the layers self-speculation drafts from)",
    )
    g.add_argument(
        "--window",
        type=int,
        default=512,
        help="positions per document (its opening; the targets need its whole context)",
    )
    g.add_argument("--vocab", type=int, default=8192, help="draft vocabulary size (layerskip)")
    g.add_argument(
        "--agreement-prompts",
        type=int,
        default=12,
        help="tuning prompts whose greedy outputs, original vs tuned, the card compares",
    )
    g.add_argument("--agreement-tokens", type=int, default=64)


def parse_focus(text: str, n_layers: int) -> tuple[int, ...]:
    try:
        layers = tuple(sorted({int(x) for x in text.split(",") if x.strip()}))
    except ValueError:
        raise SystemExit(f"--focus {text!r}: layer numbers, e.g. 6,8") from None
    if any(not 1 <= ell < n_layers for ell in layers):
        raise SystemExit(f"--focus {text!r}: exits must be in 1..{n_layers - 1}")
    return layers


class Tuning(nn.Module):
    """The trainable tensors of a private copy of the model (the Loop trains, checkpoints and
    resumes this module); the copy runs through `forward_states`."""

    def __init__(self, bundle: ModelBundle, rank: int, alpha: float) -> None:
        super().__init__()
        model = type(bundle.model)(bundle.model.config)
        model.load_state_dict(bundle.model.state_dict())  # plain weights, never the packed copies
        model.to(bundle.device)
        self.params = exit_tuned.attach(model, rank, alpha)
        self._model = [model]  # not a submodule: only the delta is this module's state
        self.rank, self.alpha = rank, alpha

    @property
    def model(self) -> nn.Module:
        return self._model[0]

    def warm_start(self, spec: str | None) -> None:
        """Start from a shipped delta (`--init`: a file or git:REV:PATH) of the same rank."""
        if not spec:
            return
        state = init_weights(spec)
        if int(state.get("rank", -1)) != self.rank or float(state["alpha"]) != self.alpha:
            raise SystemExit(
                f"--init {spec}: rank {int(state.get('rank', -1))}, alpha "
                f"{float(state.get('alpha', -1))}; this run's are {self.rank}, {self.alpha}"
            )
        with torch.no_grad():
            for key, p in self.params.items():
                name = key.replace("/", ".")
                if name not in state or state[name].shape != p.shape:
                    raise SystemExit(f"--init {spec}: no {name} of shape {tuple(p.shape)}")
                p.copy_(state[name].to(p.device, p.dtype))


def forward_states(
    model: nn.Module,
    ids: torch.Tensor,
    exits: set[int],
    drop: list[float] | None = None,
    generator: torch.Generator | None = None,
) -> tuple[torch.Tensor, dict[int, torch.Tensor]]:
    """The decoder over ids [b, W] (causal, right padding harmless), with per-token layer dropout
    at rates `drop` (None: none). Returns the final norm's output [b, W, d] and the raw states
    after each layer in `exits` (ℓ decoder layers run)."""
    inner = model.model
    h = inner.embed_tokens(ids)
    pos = torch.arange(ids.shape[1], device=ids.device).expand(ids.shape[0], -1)
    mask = create_causal_mask(
        config=model.config,
        inputs_embeds=h,
        attention_mask=None,
        **cache_arg(None),
        position_ids=pos,
    )
    rope = inner.rotary_emb(h, position_ids=pos)
    kept: dict[int, torch.Tensor] = {}
    for depth, layer in enumerate(inner.layers, start=1):
        out = layer(h, attention_mask=mask, position_ids=pos, position_embeddings=rope)
        p = drop[depth - 1] if drop else 0.0
        if p > 0:
            skip = torch.rand(ids.shape, device=ids.device, generator=generator) < p
            out = torch.where(skip[..., None], h, out)
        h = out
        if depth in exits:
            kept[depth] = h
    return inner.norm(h), kept


def opening_windows(states: States, docs, length: int) -> list[tuple[int, int]]:
    """Each document's first `length + 1` positions (the rest of a longer one is left out): the
    targets are the original's final features over the whole document, so the tuned model must
    see the same context at the same positions, from the document's start."""
    spans = []
    for doc in docs:
        a, e = states.span(doc)
        if e - a >= 2:
            spans.append((a, min(a + length + 1, e)))
    return spans


def make_batch(states: States, spans, device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """ids [b, W] (right-padded), the original's final features [b, W, d] and which positions
    predict a scored next token [b, W] (inside the span, not its last position)."""
    width = max(e - a for a, e in spans)
    d = states.features.shape[1]
    ids = torch.zeros(len(spans), width, dtype=torch.long)
    feats = torch.zeros(len(spans), width, d, dtype=states.features.dtype)
    valid = torch.zeros(len(spans), width, dtype=torch.bool)
    for r, (a, e) in enumerate(spans):
        n = e - a
        ids[r, :n] = states.tokens[a:e]
        feats[r, :n] = states.features[a:e]
        valid[r, : n - 1] = states.scored_at(a, e - 1)
    return ids.to(device), feats.to(device), valid.to(device)


def soft_ce(head, norm, h: torch.Tensor, teacher: torch.Tensor, normed: bool = False):
    """Soft cross-entropy of the exit read from states h [n, d] (through the shared final norm,
    unless `normed`, and LM head) against the teacher's probabilities [n, V]; and its top-1
    agreement with the teacher's argmax."""
    logits = head(h if normed else norm(h)).float()
    ce = -(teacher * torch.log_softmax(logits, -1)).sum(-1).mean()
    hit = (logits.argmax(-1) == teacher.argmax(-1)).float().mean()
    return ce, hit


def active_exits(step: int, n_layers: int, rotation: int, focus: tuple[int, ...]) -> set[int]:
    """This step's exits: every `rotation`-th layer, the phase moving by one each step, and the
    focus layers."""
    turn = {ell for ell in range(1, n_layers) if ell % rotation == step % rotation}
    return turn | set(focus)


def eval_layers(n_layers: int, focus: tuple[int, ...]) -> list[int]:
    return sorted({*focus, *range(3, n_layers, 3)} - {n_layers})


def train(prep: Prepared, args: argparse.Namespace, argv: list[str]) -> dict:
    """Tune a private copy of the model for early exits (the Loop, resumable), write the delta
    and its card after every epoch, then once more with the shipped delta's greedy agreement
    with the original; returns the card."""
    bundle, states = prep.bundle, prep.states
    focus = parse_focus(args.focus, bundle.n_layers)
    torch.manual_seed(args.seed)
    tuning = Tuning(bundle, args.rank, args.alpha)
    tuning.warm_start(args.init)
    drop = exit_tuned.dropout_rates(bundle.n_layers, args.p_max)
    vocab = draft_vocabulary(bundle, states, args.vocab)
    spans, batches, held = training_windows(prep, args)
    noise = torch.Generator(device=bundle.device).manual_seed(args.seed)
    step_loss = exit_losses(tuning.model, bundle, states, drop, noise, focus, args)
    evaluate = held_out_scores(tuning.model, bundle, held, eval_layers(bundle.n_layers, focus))
    out_path = Path(args.out) if args.out else exit_tuned.delta_path(bundle.model_id)
    tokens = sum(e - a for a, e in spans)
    write = partial(save_delta, out_path, tuning, vocab, focus, tokens, prep, args, argv)
    loop = Loop(
        epochs=args.epochs,
        lr=args.lr,
        warmup=args.warmup,
        max_steps=args.max_steps,
        minutes=args.minutes,
        checkpoint=checkpoint_path(out_path),
        resume=args.resume,
        seed=args.seed,
        desc="layerskip",
    )
    result = loop.fit(tuning, batches, step_loss, evaluate, on_epoch=write)
    write(result)  # the tensors, so that a cut-short run still ships something
    quality = greedy_agreement(
        bundle, out_path, args.agreement_prompts, args.agreement_tokens, result["held_out"]
    )
    write(result, quality)
    return json.loads(out_path.with_suffix(".json").read_text())


def training_windows(
    prep: Prepared, args: argparse.Namespace
) -> tuple[list[Window], list[list[Window]], dict[str, tuple[States, list[Window]]]]:
    """The training documents' opening windows (shuffled with the seed) and their batches; and
    the held-out windows per source, the probe's (the tuning prompts' answers) among them."""
    states = prep.states
    spans = opening_windows(states, prep.train_docs, args.window)
    random.Random(args.seed).shuffle(spans)
    batches = [spans[i : i + args.batch_size] for i in range(0, len(spans), args.batch_size)]
    held = {
        source: (states, [d for d in prep.held_docs if states.sources[d] == source])
        for source in sorted(set(states.sources))
    }
    if prep.probe is not None:  # the tuning prompts' answers: where the exits will be read
        held["probe"] = (prep.probe, list(range(len(prep.probe.starts))))
    held = {k: (st, opening_windows(st, docs, args.window)) for k, (st, docs) in held.items()}
    return spans, batches, held


def exit_losses(
    model: nn.Module,
    bundle: ModelBundle,
    states: States,
    drop: list[float],
    noise: torch.Generator,
    focus: tuple[int, ...],
    args: argparse.Namespace,
) -> Callable[[list[Window]], dict[str, torch.Tensor]]:
    """The Loop's loss on a batch, under layer dropout: the last layer's soft cross-entropy
    against the original, plus `--e-scale` times the exits' (this step's rotation and the focus
    layers; exit ℓ weighs ℓ / L); logged beside it, the focus exits' top-1 agreement."""
    n_layers, counter = bundle.n_layers, [0]
    head, norm = model.lm_head, model.model.norm

    def step_loss(batch: list[Window]) -> dict[str, torch.Tensor]:
        exits = active_exits(counter[0], n_layers, args.rotation, focus)
        counter[0] += 1
        ids, feats, valid = make_batch(states, batch, bundle.device)
        cuda = bundle.device.type == "cuda"
        with torch.autocast(bundle.device.type, dtype=torch.bfloat16, enabled=cuda):
            final, kept = forward_states(model, ids, exits, drop, noise)
            with torch.no_grad():
                teacher = torch.softmax(head(feats[valid].to(final.dtype)).float(), -1)
            out = {"final": soft_ce(head, norm, final[valid], teacher, normed=True)}
            for ell, h in kept.items():
                out[ell] = soft_ce(head, norm, h[valid], teacher)
        weights = {ell: ell / n_layers for ell in exits}
        exit_loss = sum(weights[ell] * out[ell][0] for ell in exits) / sum(weights.values())
        loss = out["final"][0] + args.e_scale * exit_loss
        logged = {"loss": loss, "final": out["final"][0], "exits": exit_loss}
        for ell in focus:
            logged[f"top1_l{ell}"] = out[ell][1]
        return logged

    return step_loss


def held_out_scores(
    model: nn.Module,
    bundle: ModelBundle,
    held: dict[str, tuple[States, list[Window]]],
    layers: list[int],
) -> Callable[[], dict[str, float]]:
    """The Loop's held-out evaluation: per source, the next token's NLL under the original and
    the tuned model, their top-1 agreement, and each of `layers`' exits' agreement with the
    tuned model's output; means over the scored positions."""

    def evaluate() -> dict[str, float]:
        scores: dict[str, float] = {}
        for source, (st, spans) in held.items():
            sums: dict[str, float] = {}
            count = 0
            for i in range(0, len(spans), 4):
                add, n = _batch_scores(model, bundle, st, spans[i : i + 4], layers)
                for k, v in add.items():
                    sums[k] = sums.get(k, 0.0) + v * n
                count += n
            for k, v in sums.items():
                scores[f"{source}_{k}"] = round(v / max(count, 1), 4)
        return scores

    return evaluate


def _batch_scores(
    model: nn.Module, bundle: ModelBundle, states: States, spans: list[Window], layers: list[int]
) -> tuple[dict[str, float], int]:
    """One held-out batch's means (see `held_out_scores`) and its count of scored positions."""
    head, norm = model.lm_head, model.model.norm
    ids, feats, valid = make_batch(states, spans, bundle.device)
    cuda = bundle.device.type == "cuda"
    with torch.autocast(bundle.device.type, dtype=torch.bfloat16, enabled=cuda):
        final, kept = forward_states(model, ids, set(layers))
        teacher = head(feats[valid].to(final.dtype)).float().log_softmax(-1)
        logits = head(final[valid]).float()
        tops = {ell: head(norm(h[valid])).argmax(-1) for ell, h in kept.items()}
    nxt = torch.roll(ids, -1, dims=1)[valid]
    final_top = logits.argmax(-1)
    add = {
        "nll_original": -teacher.gather(1, nxt[:, None]).mean().item(),
        "nll_tuned": nn.functional.cross_entropy(logits, nxt).item(),
        "same_as_original": (final_top == teacher.argmax(-1)).float().mean().item(),
    }
    for ell in layers:
        add[f"l{ell}_vs_tuned"] = (tops[ell] == final_top).float().mean().item()
    return add, int(valid.sum())


def save_delta(
    out_path: Path,
    tuning: Tuning,
    vocab: torch.Tensor,
    focus: tuple[int, ...],
    train_tokens: int,
    prep: Prepared,
    args: argparse.Namespace,
    argv: list[str],
    result: dict,
    quality: dict | None = None,
) -> None:
    """Write the delta as shipped (decoders/trained/exit_tuned.py) with its card: the tuning's
    settings, the Loop's `result` and, once measured, the greedy `quality`."""
    from decoders.trained.artifacts import save_artifact

    fields = {
        "tuned_model": prep.bundle.model_id + exit_tuned.TUNED_SUFFIX,
        "rank": args.rank,
        "alpha": args.alpha,
        "p_max": args.p_max,
        "e_scale": args.e_scale,
        "rotation": args.rotation,
        "focus": list(focus),
        "vocab": int(vocab.numel()),
        "parameters": sum(p.numel() for p in tuning.params.values()),
        "train_tokens": train_tokens,
        "held_out": result["held_out"],
        "history": result.get("history", []),
        **({"quality": quality} if quality else {}),
        **run_fields(args, prep, result),
    }
    shipped = exit_tuned.delta_state(tuning.params, args.rank, args.alpha, vocab)
    save_artifact(shipped, out_path, card(prep, "layerskip", argv, **fields))


def greedy_agreement(
    bundle: ModelBundle, delta: Path, prompts: int, tokens: int, held: dict
) -> dict:
    """The tuned model (the delta as shipped, float16 factors merged) against the original:
    greedy outputs on the first `prompts` tuning prompts, token by token (decoders/core/quality.py),
    and the held-out perplexities."""
    import math

    from safetensors.torch import load_file

    from decoders import generate
    from decoders.core.quality import compare
    from decoders.trained.artifacts import ASSETS

    tuned_model = type(bundle.model)(bundle.model.config)
    tuned_model.load_state_dict(bundle.model.state_dict())
    exit_tuned.apply_delta(tuned_model, load_file(str(delta)))
    tuned_model.to(bundle.device).eval().requires_grad_(False)
    tuned = dataclasses.replace(
        bundle, model=tuned_model, model_id=bundle.model_id + exit_tuned.TUNED_SUFFIX, packed=False
    )
    rows = [
        json.loads(line)
        for line in (ASSETS / "tuning_prompts.jsonl").read_text().splitlines()
        if line.strip()
    ][:prompts]
    agreements, identical, rouge = [], 0, []
    for row in rows:
        a = generate(
            bundle, row["prompt"], max_new_tokens=tokens, chat=row.get("chat"), record=False
        )
        b = generate(
            tuned, row["prompt"], max_new_tokens=tokens, chat=row.get("chat"), record=False
        )
        q = compare(a.token_ids, b.token_ids)
        agreements.append(q.agreement)
        rouge.append(q.rouge_l)
        identical += q.agreement == 1.0
    out = {
        "greedy_prompts": len(rows),
        "greedy_tokens": tokens,
        "greedy_identical": identical,
        "greedy_agreement": round(sum(agreements) / max(len(rows), 1), 4),
        "greedy_rouge_l": round(sum(rouge) / max(len(rows), 1), 4),
    }
    for source in ("chat", "code", "task", "probe"):
        if f"{source}_nll_original" in held:
            out[f"perplexity_{source}"] = {
                "original": round(math.exp(held[f"{source}_nll_original"]), 3),
                "tuned": round(math.exp(held[f"{source}_nll_tuned"]), 3),
            }
    return out


def run(args: argparse.Namespace, argv: list[str]) -> dict:
    if args.model.strip().lower().endswith(exit_tuned.TUNED_SUFFIX):
        raise SystemExit("--model: tune the base model (e.g. embedded), not a tuned one")
    prep = prepare(args, layers=())  # the original's final features: the targets
    return train(prep, args, argv)
